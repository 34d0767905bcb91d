"""The typed runtime contract: what a stage gets from the plan is its frozen `StagePlan`, which round-trips
through plan.json, generation's launch plan says which node starts which server, and the client keeps open
what the estimate counted (attached URLs included)."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
from pathlib import Path
from typing import ClassVar

import pytest
from _plan_recipes import seeds_recipe
from test_run_fakes import REPO

from dflashx.backends import nodes as nodes_mod
from dflashx.backends import servers as servers_mod
from dflashx.backends.nodes import NODE_HOSTS_ENV, NODE_RANK_ENV, node_hosts, node_rank
from dflashx.backends.servers import ServerError
from dflashx.backends.sglang import SGLangBackend
from dflashx.plan.context import build_context
from dflashx.plan.launch import LaunchPlan, split_in_flight
from dflashx.plan.plan import Plan, make_plan
from dflashx.resolve import resolve
from dflashx.stages.base import StageContext
from dflashx.targets.registry import lookup

QWEN36 = lookup("Qwen/Qwen3.6-27B")
TWO_NODES = {"hardware__nodes": 2}  # h100_x8 twice: 16 one-GPU replicas behind the router, 8 per node


def launch_of(recipe) -> LaunchPlan:
    plan = make_plan(recipe)
    launch = next(s for s in plan.stages if s.name == "generate").launch
    assert launch is not None
    return launch


def backend(recipe, node: int, log_dir: Path | None = None) -> SGLangBackend:
    r = resolve(recipe, QWEN36)
    return SGLangBackend(r.stages.generate, r.target.chat_template, r.target.model, launch_of(recipe), log_dir,
                         node=node)


@pytest.mark.parametrize("recipe", [
    seeds_recipe("rtx_pro_6000_x4"), seeds_recipe("b200_nvl8"), seeds_recipe("h100_x8", **TWO_NODES),
    seeds_recipe("b200_nvl8", stages__generate__urls=["http://10.0.0.5:30000/v1", "http://10.0.0.6:30000"]),
    seeds_recipe("b200_nvl8", stages__generate__backend="transformers"), seeds_recipe("h200_x1"),
])
def test_every_stage_runtime_round_trips_through_plan_json(recipe):
    """A resumed run reads plan.json back into the very object the planner handed the stages."""
    plan = make_plan(recipe)
    saved = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    for stage in plan.stages:
        assert saved.stage(stage.name) == stage
    assert plan.stage("train").train_launch is not None and plan.stage("generate").launch is not None
    launch = next(s for s in plan.stages if s.name == "generate").launch
    with pytest.raises(dataclasses.FrozenInstanceError):
        launch.mode = "attach"  # type: ignore[misc]


def test_the_launch_plan_names_its_mode():
    assert launch_of(seeds_recipe("b200_nvl8")).mode == "spawn"
    local = launch_of(seeds_recipe("b200_nvl8", stages__generate__backend="transformers",
                                   stages__generate__batch_size=6, stages__generate__concurrency=9))
    assert local.mode == "in-process" and local.in_flight_per_replica == 6 and local.servers == ()
    attached = launch_of(seeds_recipe("b200_nvl8", stages__generate__urls=["http://10.0.0.5:30000/v1/"]))
    assert attached.mode == "attach" and attached.servers[0].url == "http://10.0.0.5:30000"
    assert attached.servers[0].command == () and attached.servers[0].node is None


@pytest.mark.parametrize("urls", [1, 2, 3, 8])
def test_attached_urls_keep_open_what_the_estimate_counts(urls):
    """Both sides of one number: the estimate's tokens/s counts dp replicas x the batch each; the attached
    URLs' in-flight counts add up to exactly that, and the client opens that many workers."""
    recipe = seeds_recipe("b200_nvl8", stages__generate__urls=[f"http://10.0.0.{i}:30000" for i in range(urls)])
    serving = build_context(resolve(recipe, QWEN36)).generation.serving
    launch = launch_of(recipe)
    assert launch.in_flight_per_replica == serving.batch > 0 and serving.dp == 8
    assert sum(s.in_flight for s in launch.servers) == serving.dp * serving.batch
    assert max(s.in_flight for s in launch.servers) - min(s.in_flight for s in launch.servers) <= 1
    assert backend(recipe, 0).workers == serving.dp * serving.batch


def test_concurrency_is_the_client_cap_on_both_sides():
    recipe = seeds_recipe("b200_nvl8", stages__generate__concurrency=8)
    serving = build_context(resolve(recipe, QWEN36)).generation.serving
    assert serving.batch == 8 and serving.binding == "client"
    assert launch_of(recipe).in_flight_per_replica == 8 and launch_of(recipe).servers[0].in_flight == 8 * 8


def test_split_in_flight_adds_up():
    assert split_in_flight(10, 3) == (4, 3, 3) and split_in_flight(2, 3) == (1, 1, 0) and split_in_flight(5, 0) == ()


class FakePopen:
    """Stands in for `subprocess.Popen`: SGLang servers on GPUs cannot start here (no GPU, no sglang).
    Records each launch; `poll` reports an exit after `polls_left` calls (None: runs forever)."""

    launched: ClassVar[list[tuple[list[str], str]]] = []

    def __init__(self, argv, env, polls_left: int | None = None, **_kw):
        FakePopen.launched.append((list(argv), env.get("CUDA_VISIBLE_DEVICES", "")))
        self.pid, self.returncode, self.polls_left = None, None, polls_left

    def poll(self):
        if self.polls_left is not None:
            self.polls_left -= 1
            if self.polls_left <= 0:
                self.returncode = 0
        return self.returncode

    def wait(self, timeout=None):
        return 0


@pytest.fixture
def fake_node(monkeypatch):
    """Mocked process start, stop and health wait (the servers would run on GPUs of two rented nodes)."""
    FakePopen.launched = []
    waited: list[list[str]] = []
    monkeypatch.setattr(servers_mod.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(servers_mod, "_signal_group", lambda proc, sig: None)  # no process group to signal
    monkeypatch.setattr(servers_mod, "wait_healthy", lambda urls, *a, **k: waited.append(list(urls)))
    return waited


def test_two_nodes_node_0_starts_only_its_servers_and_waits_for_node_1_at_its_address(fake_node, monkeypatch,
                                                                                       tmp_path):
    monkeypatch.setenv(NODE_HOSTS_ENV, "10.1.0.1,10.1.0.2")
    recipe = seeds_recipe("h100_x8", **TWO_NODES)
    launch = launch_of(recipe)
    assert launch.nodes == (0, 1) and len(launch.on_node(0)) == len(launch.on_node(1)) == 8
    with backend(recipe, node=0, log_dir=tmp_path) as b:
        assert b.drives
    ports = [str(s.port) for s in launch.on_node(0)]
    assert [argv[argv.index("--port") + 1] for argv, _ in FakePopen.launched] == ports  # node 0's only
    assert [gpus for _, gpus in FakePopen.launched] == [str(g) for g in range(8)]
    (urls,) = fake_node
    assert urls[:8] == [f"http://127.0.0.1:{p}" for p in ports]
    assert urls[8:] == [f"http://10.1.0.2:{s.port}" for s in launch.on_node(1)]  # node 1, at its address
    assert b.workers == 16 * launch.in_flight_per_replica


def test_node_1_starts_only_its_servers_and_serves(fake_node, monkeypatch, tmp_path):
    recipe = seeds_recipe("h100_x8", **TWO_NODES)
    launch = launch_of(recipe)
    b = backend(recipe, node=1, log_dir=tmp_path)
    b.pool.poll_s = 0.01
    monkeypatch.setattr(servers_mod.subprocess, "Popen", lambda argv, env, **kw: FakePopen(argv, env, polls_left=2))
    with b:
        assert not b.drives
        stopped = b.serve()
    assert [argv[argv.index("--port") + 1] for argv, _ in FakePopen.launched] == \
        [str(s.port) for s in launch.on_node(1)]
    assert all(argv[argv.index("--host") + 1] == "0.0.0.0" for argv, _ in FakePopen.launched)
    assert fake_node == [[s.url for s in launch.on_node(1)]] and "exited with code 0" in stopped
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"server-{s.port}.log" for s in launch.on_node(1))


def test_an_unknown_node_address_is_a_clear_error(fake_node, monkeypatch):
    def no_dns(host, *a, **k):  # no name service here: `node-1` resolves nowhere
        raise socket.gaierror(f"unknown host {host}")

    monkeypatch.delenv(NODE_HOSTS_ENV, raising=False)
    monkeypatch.setattr(nodes_mod.socket, "getaddrinfo", no_dns)
    with pytest.raises(ServerError, match=r"node 1's server http://node-1:\d+ has no address.*DFLASHX_NODE_HOSTS"):
        backend(seeds_recipe("h100_x8", **TWO_NODES), node=0)
    with pytest.raises(ServerError, match=r"this is node 2.*nodes 0, 1.*--node-rank"):
        backend(seeds_recipe("h100_x8", **TWO_NODES), node=2)
    assert FakePopen.launched == [] and fake_node == []


def test_the_node_rank_comes_from_the_environment():
    assert node_rank({}) == 0 and node_rank({NODE_RANK_ENV: "1"}) == 1
    with pytest.raises(ValueError, match=r"DFLASHX_NODE_RANK='one'.*--node-rank"):
        node_rank({NODE_RANK_ENV: "one"})


PLAN_KEYS = "errors|warnings|stages|totals|ranges|calibration|resolved|deploy|estimates|servers|launch|explain|" \
            "deepspeed_config"
PLAN_DICT_READ = re.compile(r"ctx\.plan\b|\bplan\[|\bplan\.get\(|from_plan\b|\"servers\"|\"estimates\"|"
                            rf"\[[\"'](?:{PLAN_KEYS})[\"']\]|\.get\([\"'](?:{PLAN_KEYS})[\"']")


def test_no_reader_outside_the_planner_reads_a_plan_dict():
    """The run, its stages and backends, the reports and the CLI read the typed `Plan` only: `StageContext` has
    no `plan`, and no module of theirs indexes a plan (`ctx.plan`, `plan[...]`, `plan.get(...)`, `from_plan`, a
    plan.json key such as `["totals"]` or `.get("stages")`); plan.json is read by `dflashx.run.rundir.load_plan`
    alone."""
    assert "plan" not in {f.name for f in dataclasses.fields(StageContext)}
    offenders = [f"{path.relative_to(REPO)}:{n}" for folder in ("run", "report", "cli", "stages", "backends")
                 for path in sorted((REPO / "dflashx" / folder).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if PLAN_DICT_READ.search(line)]
    assert offenders == []
    assert PLAN_DICT_READ.search('t = plan["totals"]') and PLAN_DICT_READ.search('p.get("stages", [])')


def test_the_generate_stage_on_node_1_serves_and_writes_nothing(fake_node, monkeypatch, tmp_path):
    """`dflashx run --node-rank 1` on a 2-node profile: the stage starts node 1's servers, keeps them up
    until one stops, then fails saying node 0 writes the completions; no completion folder on node 1."""
    from helpers_models import stage_context

    from dflashx.stages.base import StageFailed
    from dflashx.stages.generate import run

    monkeypatch.setenv(NODE_RANK_ENV, "1")
    monkeypatch.setattr(servers_mod.subprocess, "Popen", lambda argv, env, **kw: FakePopen(argv, env, polls_left=1))
    (tmp_path / "prompts").mkdir()
    ctx = stage_context("generate", seeds_recipe("h100_x8", **TWO_NODES), tmp_path / "run",
                        {"ingest.prompts": tmp_path / "prompts"})
    with pytest.raises(StageFailed, match=r"only serves generation for node 0.*exited with code 0"):
        run(ctx)
    assert len(FakePopen.launched) == 8 and not (ctx.out_dir / "completions").exists()


def test_the_node_environment_is_read_at_call_time_after_os_environ_is_rebound(monkeypatch):
    """`datasets`' multi-process map assigns a copy to `os.environ` (arrow_dataset.py); the node rank and
    hosts set after that (as `dflashx run --node-rank` does) must still be seen."""
    import os

    monkeypatch.setattr(os, "environ", os.environ.copy())
    os.environ[NODE_RANK_ENV] = "1"
    os.environ[NODE_HOSTS_ENV] = "10.1.0.1, 10.1.0.2"
    assert node_rank() == 1 and node_hosts() == {0: "10.1.0.1", 1: "10.1.0.2"}


def test_dflashx_run_node_rank_sets_the_environment_the_launcher_reads(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from dflashx.cli.main import app

    monkeypatch.setenv(NODE_RANK_ENV, "0")  # restored after the test: the option writes os.environ
    result = CliRunner().invoke(app, ["run", str(tmp_path / "missing.yaml"), "--node-rank", "1"])
    assert result.exit_code == 2  # the recipe cannot be read: nothing ran
    assert node_rank() == 1
    assert CliRunner().invoke(app, ["run", "x.yaml", "--node-rank", "-1"]).exit_code == 2


def test_a_plan_json_written_before_launch_meant_one_thing_still_reads():
    """Issue 39: the serving mode `launch` is `spawn` and the train argv `launch_argv`; a saved plan.json that
    says `launch` for them reads back as the same plan."""
    plan = make_plan(seeds_recipe("b200_nvl8"))
    old = plan.to_json()
    generate = next(s for s in old["stages"] if s["name"] == "generate")
    generate["mode"] = "launch"
    old["resolved"]["stages"]["generate"]["serving"]["mode"] = "launch"
    old["resolved"]["stages"]["train"]["launch"] = old["resolved"]["stages"]["train"].pop("launch_argv")
    assert Plan.from_json(old) == plan and Plan.from_json(old).stage("generate").launch.mode == "spawn"
