"""`dflashx plan`: JSON contract, exit codes, human view, --explain, local targets, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _plan_recipes import REPO
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.plan.explain import human_seconds

SEEDS = str(REPO / "recipes" / "qwen36_27b.yaml")
TINY = str(REPO / "recipes" / "tiny.yaml")
runner = CliRunner()


def plan(*args: str):
    return runner.invoke(app, ["plan", *args])


def test_json_is_one_object_with_the_documented_keys():
    result = plan(SEEDS, "hardware=b200_nvl8", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # the whole output is exactly one JSON object
    assert list(data) == ["errors", "warnings", "stages", "totals", "ranges", "calibration", "resolved", "deploy"]
    assert [r["concurrency"] for r in data["deploy"]["rows"]] == [1, 8, 32, 128]
    assert [s["name"] for s in data["stages"]] == ["ingest", "generate", "qc", "tokenize", "train", "eval",
                                                    "export", "backup"]
    for s in data["stages"]:
        assert set(s["estimates"]) == {"seconds", "gpu_hours", "usd", "storage_bytes", "peak_gpu_memory_bytes"}
    assert data["resolved"]["hardware"]["name"] == "b200_nvl8"


def test_plan_errors_exit_1_and_findings_carry_fixes():
    # offline hidden states (~87 TiB) break the 20 TB storage budget; 24 days break a 20-day budget
    result = plan(SEEDS, "train.mode=offline", "budget.max_days=20", "--json")
    assert result.exit_code == 1
    errors = json.loads(result.stdout)["errors"]
    assert {"offline_over_budget", "budget_days"} <= {e["code"] for e in errors}
    assert all(set(e) == {"code", "key", "message", "fix", "severity"} for e in errors)


def test_unreadable_recipe_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntraget: {model: Qwen/Qwen3-8B}\n")
    result = plan(str(bad), "--json")
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_seeds_recipe_plans_clean_on_its_node():
    result = plan(SEEDS, "--dry-run")
    assert result.exit_code == 0, result.output  # 34 days fit the recipe's 40-day budget
    assert "0 error(s)" in result.output


def test_human_view_shows_stages_totals_commands_and_fixes():
    result = plan(SEEDS, "budget.max_days=20", "--dry-run")
    assert result.exit_code == 1  # about 31 days > a 20-day budget on the seeds' node
    out = result.output
    data = json.loads(plan(SEEDS, "budget.max_days=30", "--json").stdout)
    generate = human_seconds(next(s for s in data["stages"] if s["name"] == "generate")["estimates"]["seconds"])
    for text in ("generate", "train", "total", "sglang.launch_server", "deepspeed --num_gpus 4", "fix:",
                 "[budget_days]", generate):
        assert text in out, text


def test_explain_shows_formulas_and_inputs():
    human = plan(SEEDS, "hardware=b200_nvl8", "--explain")
    assert "how each number is estimated" in human.output and "generate.step_seconds" in human.output
    data = json.loads(plan(SEEDS, "hardware=b200_nvl8", "--explain", "--json").stdout)
    keys = {t["key"] for t in data["explain"]}
    assert {"tokens.output", "generate.seconds", "train.seconds", "storage.offline_hidden_states",
            "train.peak_memory"} <= keys
    assert all(t["formula"] for t in data["explain"])


def test_local_target_config_json_is_read(tmp_path):
    target = tmp_path / "my-target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "num_hidden_layers": 10, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 2048, "max_position_embeddings": 4096,
    }))
    result = plan(TINY, f"target.model={target}", "drafter.mask_token_id=7", "--json")
    assert result.exit_code == 0, result.output
    resolved = json.loads(result.stdout)["resolved"]
    assert resolved["target"]["facts"]["num_layers"] == 10
    assert resolved["drafter"]["target_layer_ids"] == [1, 7]


def test_broken_local_config_exits_2(tmp_path):
    target = tmp_path / "broken"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert plan(TINY, f"target.model={target}", "--json").exit_code == 2


def test_plan_command_imports_no_torch():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from dflashx.cli.main import app\n"
        f"r = CliRunner().invoke(app, ['plan', {SEEDS!r}, '--explain'])\n"
        "assert r.exit_code in (0, 1), r.output\n"
        "heavy = [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# what `dflashx plan --dry-run` must not import: the ML stack, the clients of other commands and rich
# (the plan view is drawn without it)
DRY_RUN_NEVER = ("torch", "transformers", "datasets", "deepspeed", "accelerate", "safetensors", "tokenizers",
                 "huggingface_hub", "numpy", "pandas", "sglang", "boto3", "botocore", "wandb", "matplotlib", "rich")


def test_dry_run_plan_imports_nothing_heavy():
    """The console command as a user runs it (argv, not CliRunner: `cli.main` registers the named
    sub-command only): whatever it imports beyond the interpreter's start-up holds none of these; and
    it starts without the cyclic GC and pydantic's plugin discovery (`dflashx.cli.main.PURE_COMMANDS`), and
    starts no other program (which would inherit PYDANTIC_DISABLE_PLUGINS): every way Python starts one
    records its call."""
    code = (
        "import gc, os, runpy, subprocess, sys\n"
        "started = []\n"
        "def spy(name, call):\n"
        "    return lambda *a, **k: (started.append(name), call(*a, **k))[1]\n"
        "subprocess.Popen.__init__ = spy('Popen', subprocess.Popen.__init__)\n"
        "for name in ('system', 'fork', 'execv', 'execve', 'execvp', 'execvpe', 'posix_spawn', 'posix_spawnp'):\n"
        "    setattr(os, name, spy(name, getattr(os, name)))\n"
        "before = set(sys.modules)\n"
        f"sys.argv = ['dflashx', 'plan', {TINY!r}, '--dry-run']\n"
        "try:\n"
        "    runpy.run_module('dflashx.cli.main', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, 1, None), exc.code\n"
        f"loaded = [m for m in {DRY_RUN_NEVER!r} if m in sys.modules and m not in before]\n"
        "plugins, collecting = os.environ.get('PYDANTIC_DISABLE_PLUGINS'), gc.isenabled()\n"
        "sys.stderr.write(repr((loaded, plugins, collecting, started)))\n"
        "raise SystemExit(1 if loaded or plugins != '__all__' or collecting or started else 0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
