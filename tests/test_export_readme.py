"""The export folder's README.md (`export.serve.readme`), rendered for a DFlash and a DFlash2 drafter that
`save_drafter` wrote for the tiny target (no training): its title, its folders, the engine releases (read
from `export.engines`), the vLLM commands (the V2 model runner for DFlash2; the CPU wheel's module form,
parsed by vLLM's own argument parser where vLLM is installed) and its Python snippet, run against the z-lab
reference (`dflash` 0.1.0, unpacked, never installed: `helpers_reference.zlab_reference`)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from importlib import metadata
from pathlib import Path

import pytest
import torch
from helpers_dflash import drafter_config, load_target, tiny_target
from helpers_dflash2 import random_drafter
from helpers_reference import zlab_reference

from dflashx.config.architectures import architecture
from dflashx.dflash.checkpoint import save_drafter, weight_shapes
from dflashx.dflash.model import DFlashDrafter
from dflashx.export import Serving, check_sglang, readme
from dflashx.export import engines, serve
from dflashx.export.serve import VLLM_MODULE, sglang_argv, vllm_argv, vllm_cpu_argv
from dflashx.targets.read_config import facts_from_config

SLIDING = {"num_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6}


@dataclasses.dataclass(frozen=True)
class Export:
    folder: Path
    config: dict
    serving: Serving
    text: str
    drafter: DFlashDrafter


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Export]:
    root = tmp_path_factory.mktemp("readme")
    target = tiny_target(root / "target")
    model, tok = load_target(target)
    facts = facts_from_config(json.loads((target / "config.json").read_text()))
    torch.manual_seed(1)
    drafters = {"dflash": DFlashDrafter(drafter_config(model, tok, **SLIDING)),
                "dflash2": random_drafter(model, tok, **SLIDING)}
    out = {}
    for kind, drafter in drafters.items():
        folder = save_drafter(drafter, root / kind / "drafter", dtype=torch.float32)  # as the stage saves it
        config = json.loads((folder / "config.json").read_text())
        assert check_sglang(config, facts, weight_shapes(folder)) == []  # a real export of each kind
        s = Serving.of(config, facts, str(target), str(folder), str(root / kind / "drafter-vllm"))
        out[kind] = Export(folder, config, s, readme(s, config, f"tiny-{kind}", "fp32"), drafter)
    return out


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)\n```", text, flags=re.S)


def argv(block: str) -> list[str]:
    return shlex.split(block.replace("\\\n", " "))


def test_the_title_and_description_name_the_architecture(exports):
    dflash, dflash2 = exports["dflash"].text, exports["dflash2"].text
    assert dflash.splitlines()[0] == "# tiny-dflash: DFlash drafter"
    assert dflash2.splitlines()[0] == "# tiny-dflash2: DFlash2 drafter"
    assert "DFlash2" not in dflash
    d = exports["dflash2"].config["dflash_config"]
    assert "convolution around each sublayer" in dflash2 and "candidate path selector" in dflash2
    assert f"| candidate selector | rank {d['selector_rank']}, top {d['selector_top_k']} |" in dflash2
    assert f"| convolution | {d['conv_kernel_size']} taps, groups of {d['conv_group_size']} channels |" in dflash2


def test_dflash2_writes_one_folder_and_says_so(exports):
    dflash, dflash2 = exports["dflash"], exports["dflash2"]
    assert "Two folders, one set of weights" in dflash.text and dflash.serving.vllm_dir in dflash.text
    assert "Two folders" not in dflash2.text and "One folder" in dflash2.text
    assert dflash2.serving.vllm_dir not in dflash2.text  # nothing points at a folder the export does not write
    assert "not in\nthis folder." in dflash2.text and "not in\nthese folders." in dflash.text


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_the_python_snippet_loads_the_export_into_the_zlab_class_it_names(exports, kind):
    ref = zlab_reference("dflash.model")  # leaves dflash.model importable, as `pip install dflash` would
    export = exports[kind]
    (snippet,) = blocks(export.text, "python")
    assert snippet.startswith("from dflash.model import ") and str(export.folder) in snippet
    scope: dict = {}
    exec(snippet, scope)  # the README's own lines
    draft = scope["draft"]
    assert type(draft) is getattr(ref, architecture(kind).hf_name)  # the z-lab class: the config.json name
    theirs, ours = draft.state_dict(), export.drafter.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in ours)
    if kind == "dflash2":
        assert draft.candidate_selector.top_k == export.config["dflash_config"]["selector_top_k"]


def test_the_vllm_commands_for_the_gpu_and_the_cpu_builds(exports):
    dflash = exports["dflash"]
    gpu, cpu = blocks(dflash.text, "bash")[1:]
    assert argv(gpu) == vllm_argv(dflash.serving) and argv(gpu)[:2] == ["vllm", "serve"]
    assert argv(cpu) == vllm_cpu_argv(dflash.serving) == [*VLLM_MODULE, "--model", dflash.serving.target,
                                                          *vllm_argv(dflash.serving)[3:]]
    assert "PackageNotFoundError: vllm" in dflash.text
    assert "mixes sliding and full layers only on its V2 model runner" in dflash.text  # SLIDING mixes them

    dflash2 = exports["dflash2"]
    sglang, gpu2 = blocks(dflash2.text, "bash")  # no CPU command: the CPU build cannot serve DFlash2
    assert argv(sglang) == sglang_argv(dflash2.serving)
    assert argv(gpu2) == ["VLLM_USE_V2_MODEL_RUNNER=1", *vllm_argv(dflash2.serving)]
    spec = json.loads(vllm_argv(dflash2.serving)[vllm_argv(dflash2.serving).index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": str(dflash2.folder), "num_speculative_tokens": 3}
    assert "Model Runner V1 does not support: DFlash candidate-head drafts" in dflash2.text
    assert "cannot serve this drafter" in dflash2.text and VLLM_MODULE[2] not in dflash2.text
    minimum = engines.support("vllm", "dflash2").minimum
    assert f"vLLM {minimum} or later, on its V2 model runner" in dflash2.text


def test_the_cpu_command_parses_with_vllms_own_parser(exports):
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    s = exports["dflash"].serving
    args = cli_args.make_arg_parser(FlexibleArgumentParser()).parse_args(vllm_cpu_argv(s)[len(VLLM_MODULE):])
    assert args.model == s.target
    assert args.speculative_config == {"method": "dflash", "model": s.vllm_dir, "num_speculative_tokens": 3}


def test_the_engine_versions_come_from_the_one_table(exports, monkeypatch):
    dflash2 = exports["dflash2"]
    for row in serve.engine_rows("dflash2"):
        assert f"| {row.name} | {row.minimum} ({row.source}) | {row.name} {row.checked} |" in dflash2.text
    moved = tuple(dataclasses.replace(e, minimum="9.9.9") if e.architecture == "dflash2" else e
                  for e in engines.ENGINES)
    monkeypatch.setattr(serve, "ENGINES", moved)
    text = readme(dflash2.serving, dflash2.config, "x", "fp32")
    assert "| SGLang | 9.9.9 (" in text and "| vLLM | 9.9.9 (" in text and "vLLM 9.9.9 or later" in text
    dflash = exports["dflash"].text  # DFlash: no minimum established, the source says why
    assert all(f"| {e.name} | {e.source} |" in dflash for e in serve.engine_rows("dflash"))


def test_release_comparison_and_the_vllm_read_here():
    assert engines.at_least("0.32.0", "0.28.0") and not engines.at_least("0.27.1", "0.28.0")
    assert engines.at_least("0.5.23.post1", "0.5.19") and not engines.at_least("0.5.18", "0.5.19")
    assert engines.at_least("0.28.0rc1", "0.28.0") and engines.at_least("0.28", "0.28.0")
    assert not engines.at_least("0.5.9", "0.5.19")  # numbers, not strings
    with pytest.raises(ValueError, match="not a release number"):
        engines.at_least("main", "0.28.0")
    try:
        installed = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        pytest.skip("vLLM's CPU build is not installed: the table's `checked` release is not here to compare")
    row = engines.support("vllm", "dflash2")
    assert installed == row.checked and engines.at_least(installed, row.minimum or "")


def test_docs_engine_table_is_the_code_table():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text()
    section = docs[docs.index("## Engine versions"):]
    rows = [line for line in section.split("\n\n")[2].splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(engines.ENGINES)
    for e in engines.ENGINES:
        assert f"| {e.name} | {e.architecture} | {e.minimum or 'not established'} | {e.checked} |" in section
