"""Recipe composition: extends chains, hardware profiles, overrides, interpolation, paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashx.config.load import (
    LoadedRecipe,
    available_profiles,
    load_profile,
    load_recipe,
    parse_overrides,
    profile_dirs,
)
from dflashx.config.schema import Recipe

REPO = Path(__file__).resolve().parents[1]

GPU_PROFILE = """\
name: gpu4
gpu: {name: TestGPU, memory_gb: 80, bandwidth_tbs: 2.0, bf16_tflops: 400, fp8_tflops: 800}
gpus_per_node: 4
usd_per_gpu_hour: 2.5
interconnect_gbs: 63
"""
CPU_PROFILE = "name: cpu\ngpu: null\ngpus_per_node: 0\ncpu_tflops: 0.1\n"
MINIMAL = """\
name: {name}
dataset:
  sources:
    - {{name: local, path: prompts.jsonl}}
target: {{model: builtin:tiny-qwen3}}
hardware: gpu4
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary project: profiles in DFLASHX_PROFILES_DIR, the working directory elsewhere."""
    profiles = tmp_path / "profiles"
    write(profiles / "gpu4.yaml", GPU_PROFILE)
    write(profiles / "cpu.yaml", CPU_PROFILE)
    monkeypatch.setenv("DFLASHX_PROFILES_DIR", str(profiles))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


def test_minimal_recipe_loads_with_profile_by_name(work: Path) -> None:
    loaded = load_recipe(write(work / "r.yaml", MINIMAL.format(name="r")))
    assert isinstance(loaded, LoadedRecipe)
    assert loaded.recipe.hardware.name == "gpu4"
    assert loaded.recipe.hardware.num_gpus == 4
    assert loaded.recipe.hardware.gpu.fp8_tflops == 800
    assert loaded.path == work / "r.yaml"
    assert loaded.files == (work / "r.yaml", work / "profiles" / "gpu4.yaml")
    assert Recipe.model_validate(loaded.data) == loaded.recipe  # data is what was validated
    assert "extends" not in loaded.data


def test_extends_chain_child_wins_and_lists_replace(work: Path) -> None:
    write(work / "a.yaml", MINIMAL.format(name="a") + "stages:\n  train: {lr: 1.0e-3, epochs: 2}\n"
          "drafter: {target_layer_ids: [1, 2, 3]}\n")
    write(work / "sub" / "b.yaml", "extends: ../a.yaml\nstages:\n  train: {lr: 2.0e-3}\n"
          "  generate: {max_tokens: 100}\n")
    c = write(work / "sub" / "c.yaml", "extends: b.yaml\nname: c\ndrafter: {target_layer_ids: [7]}\n")
    r = load_recipe(c).recipe
    assert r.name == "c"
    assert r.stages.train.lr == 2e-3  # b over a
    assert r.stages.train.epochs == 2  # from a, merged key by key
    assert r.stages.generate.max_tokens == 100
    assert r.drafter.target_layer_ids == [7]  # lists replace, never concatenate
    assert load_recipe(c).files[:3] == (work / "a.yaml", work / "sub" / "b.yaml", c)


def test_inline_hardware_mapping(work: Path) -> None:
    text = MINIMAL.format(name="inline").replace(
        "hardware: gpu4", "hardware:\n  name: mine\n  gpus_per_node: 2\n  gpu: {name: X, memory_gb: 24, "
        "bandwidth_tbs: 1, bf16_tflops: 100}\n")
    hw = load_recipe(write(work / "r.yaml", text)).recipe.hardware
    assert (hw.name, hw.num_gpus, hw.gpu.memory_gb) == ("mine", 2, 24)


def test_hardware_override_and_dotted_profile_overrides(work: Path) -> None:
    recipe = write(work / "r.yaml", MINIMAL.format(name="r"))
    hw = load_recipe(recipe, ["hardware.gpus_per_node=8", "hardware.interconnect_gbs=450"]).recipe.hardware
    assert (hw.name, hw.gpus_per_node, hw.interconnect_gbs, hw.usd_per_gpu_hour) == ("gpu4", 8, 450, 2.5)
    hw = load_recipe(recipe, ["hardware=cpu"]).recipe.hardware
    assert hw.name == "cpu" and hw.gpu is None
    # the name is switched first, then dotted overrides apply to the new profile
    hw = load_recipe(recipe, ["hardware.nodes=3", "hardware=cpu"]).recipe.hardware
    assert (hw.name, hw.nodes) == ("cpu", 3)


def test_calibration_file_merges_into_calibrated(work: Path) -> None:
    write(work / "profiles" / "gpu4.calibration.yaml", "calibrated: {generate_efficiency: 0.42}\n")
    loaded = load_recipe(write(work / "r.yaml", MINIMAL.format(name="r")))
    assert loaded.recipe.hardware.calibrated == {"generate_efficiency": 0.42}
    assert loaded.recipe.hardware.gpus_per_node == 4  # the rest of the profile is untouched
    assert load_profile("gpu4").calibrated == {"generate_efficiency": 0.42}


def test_profile_search_order(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = work / "project"
    recipe = write(project / "recipes" / "r.yaml", MINIMAL.format(name="r"))
    pricier = GPU_PROFILE.replace("usd_per_gpu_hour: 2.5", "usd_per_gpu_hour: 9")
    write(project / "hardware_profiles" / "gpu4.yaml", pricier)
    assert load_recipe(recipe).recipe.hardware.usd_per_gpu_hour == 2.5  # $DFLASHX_PROFILES_DIR first
    monkeypatch.delenv("DFLASHX_PROFILES_DIR")
    assert load_recipe(recipe).recipe.hardware.usd_per_gpu_hour == 9  # then the recipe's ../hardware_profiles
    dirs = profile_dirs(recipe.parent)
    assert dirs[0] == project / "hardware_profiles"
    assert dirs[1] == Path.cwd() / "hardware_profiles"
    assert dirs[-1] == REPO / "dflashx" / "hardware_profiles"  # the built-in profiles, last
    assert available_profiles(recipe.parent)["gpu4"] == project / "hardware_profiles" / "gpu4.yaml"


def test_overrides_full_and_short_forms(work: Path) -> None:
    recipe = write(work / "r.yaml", MINIMAL.format(name="r"))
    r = load_recipe(recipe, [
        "train.lr=1e-4", "stages.train.epochs=2.5", "generate.max_tokens=77", "qc.enabled=false",
        "drafter.target_layer_ids=[0, 3]", "dataset.sources.0.cap=10", "target.chat_template.enable_thinking=false",
        "tracking.entity=null",
    ]).recipe
    assert r.stages.train.lr == pytest.approx(1e-4)
    assert r.stages.train.epochs == 2.5
    assert r.stages.generate.max_tokens == 77
    assert r.stages.qc.enabled is False
    assert r.drafter.target_layer_ids == [0, 3]
    assert r.dataset.sources[0].cap == 10
    assert r.target.chat_template.enable_thinking is False
    assert r.tracking.entity is None


def test_parse_overrides_expands_stage_names_only() -> None:
    parsed, problems = parse_overrides(["train.lr=1", "target.model=x", "eval.num_prompts=3", "broken"])
    assert [o.key for o in parsed] == ["stages.train.lr", "target.model", "stages.eval.num_prompts"]
    assert len(problems) == 1 and "KEY=VALUE" in problems[0].message


def test_interpolation_between_keys_and_from_env(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = MINIMAL.format(name="r") + (
        "description: drafter for ${target.model}\n"
        "tracking:\n  project: ${name}-${oc.env:DFLASHX_TEST_SUFFIX,default}\n"
        "  entity: ${oc.env:DFLASHX_TEST_ENTITY}\n"
        "stages: {generate: {concurrency: '${hardware.gpus_per_node}'}}\n"  # the profile is merged before resolution
    )
    recipe = write(work / "r.yaml", text)
    monkeypatch.setenv("DFLASHX_TEST_ENTITY", "team")
    monkeypatch.delenv("DFLASHX_TEST_SUFFIX", raising=False)
    r = load_recipe(recipe).recipe
    assert r.description == "drafter for builtin:tiny-qwen3"
    assert (r.tracking.project, r.tracking.entity) == ("r-default", "team")
    assert r.stages.generate.concurrency == 4
    monkeypatch.setenv("DFLASHX_TEST_SUFFIX", "x1")
    assert load_recipe(recipe).recipe.tracking.project == "r-x1"
    # interpolation sees overrides: they are applied before resolution
    assert load_recipe(recipe, ["name=other"]).recipe.tracking.project == "other-x1"


def test_relative_paths_resolve_against_the_writing_file(work: Path) -> None:
    (work / "models" / "local-target").mkdir(parents=True)
    write(work / "base" / "base.yaml", MINIMAL.format(name="base") + "drafter: {init_from: ckpt/step-100}\n")
    text = (
        "extends: ../base/base.yaml\n"
        "target: {model: ../models/local-target, tokenizer: Qwen/Qwen3-8B}\n"
        "stages:\n  eval: {prompts: held_out.jsonl}\n"
        "storage: {root: runs}\n"
    )
    loaded = load_recipe(write(work / "recipes" / "child.yaml", text))
    r = loaded.recipe
    assert r.dataset.sources[0].path == str(work / "base" / "prompts.jsonl")  # written by the base
    assert r.drafter.init_from == str(work / "base" / "ckpt" / "step-100")
    assert r.stages.eval.prompts == str(work / "recipes" / "held_out.jsonl")
    assert r.target.model == str(work / "models" / "local-target")
    assert r.target.tokenizer == "Qwen/Qwen3-8B"  # a hub id stays as it is
    assert r.storage.root == str(Path.cwd() / "runs")  # the working directory, not the recipe's
    assert loaded.data["storage"]["root"] == r.storage.root


def test_builtin_hub_ids_and_override_paths(work: Path) -> None:
    recipe = write(work / "r.yaml", MINIMAL.format(name="r"))
    r = load_recipe(recipe, ["target.model=Qwen/Qwen3.6-27B", "drafter.init_from=prev/ckpt",
                             "dataset.sources.0.path=builtin:tiny-prompts"]).recipe
    assert r.target.model == "Qwen/Qwen3.6-27B"
    assert r.drafter.init_from == str(Path.cwd() / "prev" / "ckpt")  # overrides: the working directory
    assert r.dataset.sources[0].path == "builtin:tiny-prompts"


def test_absolute_and_home_paths(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(work / "home"))
    recipe = write(work / "r.yaml", MINIMAL.format(name="r") + "drafter: {init_from: ~/ckpt}\n"
                   "stages: {eval: {prompts: /data/eval.jsonl}}\n")
    r = load_recipe(recipe).recipe
    assert r.drafter.init_from == str(work / "home" / "ckpt")
    assert r.stages.eval.prompts == "/data/eval.jsonl"


@pytest.mark.parametrize("name", ["tiny", "qwen36_27b"])
def test_repository_recipes_load(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DFLASHX_PROFILES_DIR", raising=False)
    monkeypatch.delenv("DFLASHX_S3_ENDPOINT", raising=False)
    loaded = load_recipe(REPO / "recipes" / f"{name}.yaml")
    assert loaded.files[-1].parent == REPO / "dflashx" / "hardware_profiles"
    assert loaded.recipe.hardware.name == loaded.data["hardware"]["name"]
    if name == "qwen36_27b":
        r = loaded.recipe
        assert r.hardware.name == "rtx_pro_6000_x4" and r.hardware.num_gpus == 4
        assert r.target.chat_template.enable_thinking is True
        assert r.storage.s3.endpoint_url == "https://s3.us-east-1.amazonaws.com"
        assert r.budget.max_storage_bytes == 20 * 10**12


@pytest.mark.parametrize("profile", ["rtx_pro_6000_x4", "b200_nvl8", "h200_x1", "h200_x8", "h100_x8", "cpu"])
def test_repository_profiles_swap_in(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DFLASHX_PROFILES_DIR", raising=False)
    r = load_recipe(REPO / "recipes" / "qwen36_27b.yaml", [f"hardware={profile}"]).recipe
    assert r.hardware.name == profile
    assert load_profile(profile) == r.hardware



def test_a_profile_without_gpu_states_its_cpu_peak():
    """cpu_tflops has no default of its own (the cpu profile's 0.1 is data): a GPU-less profile must give it."""
    from pydantic import ValidationError

    from dflashx.config.schema import HardwareProfile

    with pytest.raises(ValidationError, match="needs cpu_tflops"):
        HardwareProfile(name="bare", gpu=None)
    assert HardwareProfile(name="cpu", gpu=None, cpu_tflops=0.1).peak_flops == 0.1e12
