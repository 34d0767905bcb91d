"""`hardware: local` (issue 38): this machine's profile, detected (`dflashx.run.local_hardware`).

The only mocks are what this CPU machine cannot run: `nvidia-smi` is a fake program on PATH that prints
what nvidia-smi prints on such a node (its `--query-gpu` CSV and its `topo -m` matrix, recorded in
`SMI_*` below), and torch's CUDA answers (`torch.cuda.*`) where a test needs a GPU torch sees. Everything
else runs for real: the subprocess, the parsing, the GPU table, the loader, the planner, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dflashx.cli.main import app
from dflashx.config.errors import RecipeError
from dflashx.config.gpus import GPUS, gpu_model, match_gpu
from dflashx.config.load import BUILTIN_PROFILES, load_profile, load_recipe
from dflashx.plan.context import Totals
from dflashx.plan.plan import make_plan
from dflashx.run import checks_node
from dflashx.run.local_hardware import local_profile

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny.yaml"

FAKE_SMI = """#!{python}
import json, os, sys
answers = json.load(open(os.environ["FAKE_SMI_ANSWERS"]))
with open(os.environ["FAKE_SMI_ANSWERS"] + ".calls", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
for prefix, out in answers.items():
    if " ".join(sys.argv[1:]).startswith(prefix):
        sys.stdout.write(out)
        sys.exit(0)
sys.stderr.write("No devices were found\\n")
sys.exit(6)
"""


def _query(*gpus: tuple[str, int], gen: int = 5, width: int = 16) -> str:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.total,pcie.link.gen.max,pcie.link.width.max
    --format=csv,noheader,nounits` as nvidia-smi prints it."""
    return "".join(f"{i}, GPU-{i:08x}-1111-2222-3333-444455556666, {name}, {mib}, {gen}, {width}\n"
                   for i, (name, mib) in enumerate(gpus))


def _topo(n: int, link: str) -> str:
    """`nvidia-smi topo -m` for `n` GPUs joined by `link` (`NV18`: an HGX board; `SYS`: PCIe across sockets)."""
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    rows = "".join(f"GPU{i}\t" + "\t".join(" X " if i == j else link for j in range(n))
                   + f"\tSYS\t0-55,112-167\t{i // 4}\t\tN/A\n" for i in range(n))
    legend = "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n" \
             "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    return head + rows + "NIC0\t" + "\t".join("SYS" for _ in range(n)) + "\t X \n" + legend


H100 = ("NVIDIA H100 80GB HBM3", 81559)
SMI_8_H100 = {"--query-gpu": _query(*[H100] * 8), "topo -m": _topo(8, "NV18")}
SMI_4_RTX = {"--query-gpu": _query(*[("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)] * 4),
             "topo -m": _topo(4, "SYS")}
SMI_1_H200 = {"--query-gpu": _query(("NVIDIA H200", 143771))}
SMI_1_4090 = {"--query-gpu": _query(("NVIDIA GeForce RTX 4090", 24564), gen=4)}


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """Put a fake `nvidia-smi` (alone) on PATH answering `answers`; returns the calls it received."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(FAKE_SMI.format(python=sys.executable))
    exe.chmod(0o755)
    answers = tmp_path / "answers.json"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_SMI_ANSWERS", str(answers))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(table: dict[str, str]) -> Path:
        answers.write_text(json.dumps(table))
        return Path(str(answers) + ".calls")

    return install


def _torch_sees(monkeypatch, *gpus: tuple[str, int]) -> None:
    """torch's CUDA answers of a node with these GPUs (name, bytes): this machine has none."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(gpus))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=gpus[i][0], total_memory=gpus[i][1]))


def test_the_gpu_table_knows_the_drivers_names():
    named = {"NVIDIA H100 80GB HBM3": "H100", "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": "H100 NVL",
             "NVIDIA H200": "H200", "NVIDIA H200 NVL": "H200 NVL", "NVIDIA B200": "B200",
             "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTX PRO 6000 Blackwell",
             "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "RTX PRO 6000 Blackwell",
             "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB", "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB",
             "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB", "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB",
             "NVIDIA L40S": "L40S"}
    for detected, name in named.items():
        model = match_gpu(detected)
        assert model is not None and model.name == name, detected
    for other in ("NVIDIA GB200", "NVIDIA GH200 480GB", "NVIDIA L40", "NVIDIA GeForce RTX 4090",
                  "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "AMD Instinct MI300X"):
        assert match_gpu(other) is None, other
    assert all(match_gpu(f"NVIDIA {g.name}") is g for g in GPUS if "A100" not in g.name)  # its own name too


def test_the_builtin_profiles_read_their_gpus_figures_from_the_table():
    """One source of truth: a built-in profile names its GPU; the figures are the table's, and NVLink's too."""
    for path in BUILTIN_PROFILES.glob("*.yaml"):
        raw = yaml.safe_load(path.read_text())
        profile = load_profile(path.stem)
        if profile.gpu is None:
            continue
        assert set(raw["gpu"]) == {"name"}, path.name
        model = gpu_model(profile.gpu.name)
        assert model is not None, path.name
        assert (profile.gpu.memory_gb, profile.gpu.bandwidth_tbs, profile.gpu.bf16_tflops, profile.gpu.fp8_tflops) \
            == (model.memory_gb, model.bandwidth_tbs, model.bf16_tflops, model.fp8_tflops), path.name
        if profile.interconnect.startswith("NVLink"):
            assert "interconnect_gbs" not in raw and profile.interconnect_gbs == model.nvlink_gbs, path.name
    assert load_profile("h100_x8").interconnect_gbs == 450 and load_profile("rtx_pro_6000_x4").interconnect_gbs == 63


def test_eight_h100s_on_nvlink_are_the_h100_x8_profile(smi):
    calls = smi(SMI_8_H100)
    local, written = local_profile(), load_profile("h100_x8")
    assert local.name == "local" and local.gpus_per_node == 8 and local.nodes == 1
    assert local.gpu == written.gpu  # H100, 85.5 GB (81,559 MiB), 3.35 TB/s, 989 / 1979 TFLOP/s
    assert local.interconnect.startswith("NVLink") and local.interconnect_gbs == written.interconnect_gbs == 450
    assert local.unknown == [] and local.usd_per_gpu_hour == 0 and local.host_memory_gb
    assert calls.read_text().splitlines()[0].startswith("--query-gpu=index,uuid,name,memory.total")
    assert "topo -m" in calls.read_text()


def test_four_pcie_cards_read_their_link(smi):
    smi(SMI_4_RTX)
    local = local_profile()
    assert local.gpu == load_profile("rtx_pro_6000_x4").gpu and local.gpus_per_node == 4
    assert local.interconnect.startswith("PCIe Gen5 x16") and local.interconnect_gbs == 63.0


def test_one_gpu_has_no_interconnect_and_asks_no_topology(smi):
    calls = smi(SMI_1_H200)
    local = local_profile()
    assert local.gpu == load_profile("h200_x1").gpu and local.gpus_per_node == 1
    assert local.interconnect_gbs is None and local.unknown == []
    assert "topo" not in calls.read_text()


def test_cuda_visible_devices_selects_the_gpus(smi, monkeypatch):
    smi(SMI_8_H100 | {"topo -m": _topo(8, "NV18").replace("GPU5\tNV18", "GPU5\tSYS")})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,6")
    assert local_profile().gpus_per_node == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000003,GPU-00000007,9,1")  # CUDA stops at index 9
    assert local_profile().gpus_per_node == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,5")  # GPU0 - GPU5: no NVLink on this (made-up) board
    assert local_profile().interconnect.startswith("PCIe")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_profile().gpu is None


def test_an_unknown_gpu_says_what_it_changes_and_takes_the_figures_given(smi):
    smi(SMI_1_4090)
    local = local_profile()
    assert local.gpu is not None and local.gpu.name == "NVIDIA GeForce RTX 4090" and local.gpu.memory_gb == 25.8
    assert local.gpu.bf16_tflops is local.gpu.bandwidth_tbs is local.gpu.fp8_tflops is None
    assert local.unknown == ["gpu.bandwidth_tbs", "gpu.bf16_tflops", "gpu.fp8_tflops"]
    plan = make_plan(load_recipe(TINY, ["hardware=local", "target.precision=bf16"], local=local_profile).recipe)
    found = {f.key: f for f in plan.warnings if f.code in ("unknown_hardware", "local_no_price")}
    assert set(found) == {"hardware.gpu.bf16_tflops", "hardware.gpu.bandwidth_tbs", "hardware.gpu.fp8_tflops",
                          "hardware.usd_per_gpu_hour"}
    compute = found["hardware.gpu.bf16_tflops"]
    assert "'NVIDIA GeForce RTX 4090'" in compute.message and "cannot price" in compute.message
    assert "312 TFLOP/s" in compute.message and "hardware.gpu.bf16_tflops=" in compute.fix
    assert "docs/hardware.md" in compute.fix
    assert plan.resolved is not None and plan.resolved.stages.train.peak_flops == 312e12  # the stand-in, said
    given = ["hardware=local", "hardware.gpu.bf16_tflops=165.2", "hardware.gpu.bandwidth_tbs=1.008",
             "hardware.usd_per_gpu_hour=0.4"]
    recipe = load_recipe(TINY, given, local=local_profile).recipe
    assert recipe.hardware.unknown == ["gpu.fp8_tflops"] and recipe.hardware.peak_flops == 165.2e12
    codes = {f.key for f in make_plan(recipe).warnings if f.code in ("unknown_hardware", "local_no_price")}
    assert codes == {"hardware.gpu.fp8_tflops"}
    fp8 = make_plan(load_recipe(TINY, [*given, "drafter.precision=fp8"], local=local_profile).recipe).errors
    assert any(f.code == "fp8_unsupported" and "FP8 support is unknown" in f.message for f in fp8)


def test_no_gpu_is_the_cpu_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: torch tells
    _torch_sees(monkeypatch)
    local, cpu = local_profile(), load_profile("cpu")
    assert local.gpu is None and local.name == "local"
    assert (local.cpu_tflops, local.cpu_bandwidth_tbs, local.gpus_per_node) == \
        (cpu.cpu_tflops, cpu.cpu_bandwidth_tbs, 0)
    assert f"{os.cpu_count()} CPU cores" in local.description


def test_without_nvidia_smi_torch_reads_the_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    _torch_sees(monkeypatch, ("NVIDIA H100 80GB HBM3", 81_089 * 2**20))  # torch's figure on an H100
    local = local_profile()
    assert local.gpu is not None and local.gpu.name == "H100" and local.gpu.memory_gb == 85.0
    assert local.gpu.bf16_tflops == 989 and "(torch)" in local.description


def test_preflight_agrees_with_the_detected_profile(smi, monkeypatch):
    smi(SMI_1_H200)
    _torch_sees(monkeypatch, ("NVIDIA H200", 143_155 * 2**20))  # what torch reports on the same H200
    plan = Totals(peak_gpu_memory_bytes=40e9)
    assert checks_node.check_gpus(local_profile(), plan).status == "ok"
    smi(SMI_1_4090)
    _torch_sees(monkeypatch, ("NVIDIA GeForce RTX 4090", 24_080 * 2**20))
    assert checks_node.check_gpus(local_profile(), plan).status == "ok"
    _torch_sees(monkeypatch, *[("NVIDIA H100 PCIe", 81_089 * 2**20)] * 8)  # not the SXM part the profile names
    other = checks_node.check_gpus(load_profile("h100_x8"), plan)
    assert other.status == "warn" and "another GPU model" in other.message and "hardware=local" in other.fix


def test_local_needs_a_detection_from_its_caller():
    with pytest.raises(RecipeError) as caught:
        load_recipe(TINY, ["hardware=local"])
    problem = caught.value.problems[0]
    assert problem.key == "hardware" and "local=dflashx.run.local_hardware.local_profile" in problem.fix


def test_profiles_show_local_prints_what_is_unknown(smi, monkeypatch):
    smi(SMI_1_4090)
    result = CliRunner().invoke(app, ["profiles", "--show", "local"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in result.stdout.splitlines()
             if line.count("│") == 3}
    assert lines["gpu.name"] == "NVIDIA GeForce RTX 4090" and lines["gpu.memory_gb"] == "25.8"
    assert lines["gpu.bf16_tflops"] == lines["gpu.bandwidth_tbs"] == lines["gpu.fp8_tflops"] == "unknown"
    assert lines["unknown"] == "gpu.bandwidth_tbs, gpu.bf16_tflops, gpu.fp8_tflops"
    shown = CliRunner().invoke(app, ["profiles", "--show", "h200_x1"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0 and "h200_x1.yaml" in shown.stdout and "989" in shown.stdout


def test_planning_another_profile_detects_nothing(smi):
    """`dflashx plan` of another profile, as a user runs it, never starts nvidia-smi nor imports the detection
    or torch; the same command with `hardware=local` does start it (the spy works)."""
    calls = smi(SMI_1_H200)
    code = ("import runpy, sys\n"
            "sys.argv = ['dflashx', 'plan', sys.argv[1], *sys.argv[2:], '--dry-run']\n"
            "try:\n"
            "    runpy.run_module('dflashx.cli.main', run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('LOADED', [m for m in ('torch', 'dflashx.run.local_hardware') if m in sys.modules])\n")
    env = os.environ | {"PYTHONPATH": str(REPO)}
    seeds = subprocess.run([sys.executable, "-c", code, "recipes/qwen36_27b.yaml"], cwd=REPO, env=env,
                           capture_output=True, text=True, check=False)
    assert "LOADED []" in seeds.stdout, seeds.stdout[-2000:] + seeds.stderr[-2000:]
    assert not calls.exists()
    local = subprocess.run([sys.executable, "-c", code, "recipes/tiny.yaml", "hardware=local"], cwd=REPO, env=env,
                           capture_output=True, text=True, check=False)
    assert "'dflashx.run.local_hardware'" in local.stdout and "'torch'" not in local.stdout, local.stdout[-2000:]
    assert calls.read_text().startswith("--query-gpu=")
