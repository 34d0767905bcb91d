"""The eval stage with baselines and suites: the trained drafter exported by the export stage in
both layouts (z-lab / SGLang and speculators), each folder evaluated as a baseline beside the
trained drafter and the untrained one, on two suites (the held-out JSONL and a Parquet file read
through a template). Real files, real decoding on a tiny random Qwen3 target.

The trained drafter is set by hand (`helpers_dflash.repeating_drafter`): it drafts the token the
target repeats most, so its tau is well above the untrained drafter's and "a baseline equal to the
trained drafter has the trained drafter's tau" is not a comparison of ones."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers_dflash import load_target, repeating_drafter, tiny_target
from helpers_models import make_recipe, stage_context

from dflashx.data.chat_mask import render_prompt
from dflashx.dflash.acceptance import SUITE_PANEL, acceptance_figure
from dflashx.dflash.checkpoint import save_drafter
from dflashx.stages import eval as eval_stage
from dflashx.stages import export as export_stage
from dflashx.stages.eval_drafters import eval_drafters

HELDOUT = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"add {i} and {i + 3}"}]} for i in range(4)]
QUESTIONS = [f"sort {i} {i + 7} {i % 5}" for i in range(5)]
FIGURES = ("tau", "accepted_plus_one", "acceptance_by_position", "accept_length_histogram", "cycles", "prompts",
           "generated_tokens", "per_prompt_tau", "by_source", "by_context")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("baselines")
    target_dir = tiny_target(root / "target")
    model, tok = load_target(target_dir)
    chat = make_recipe().target.chat_template  # the prompts as the stage encodes them
    encoded = [tok(render_prompt(tok, p, chat), add_special_tokens=False)["input_ids"] for p in HELDOUT]
    outs = [model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
            for ids in encoded]
    token = collections.Counter(t for out in outs for t in out).most_common(1)[0][0]
    save_drafter(repeating_drafter(model, tok, token), root / "ckpt")
    (root / "heldout.jsonl").write_text("".join(json.dumps(p) + "\n" for p in HELDOUT))
    pq.write_table(pa.table({"question": QUESTIONS, "id": list(range(len(QUESTIONS)))}), root / "qa.parquet")
    # the export stage writes both layouts (fp32: the same weights as the checkpoint, bit for bit)
    recipe = make_recipe(target={"model": str(target_dir), "precision": "fp32"}, stages={"export": {"dtype": "fp32"}})
    ctx = stage_context("export", recipe, root / "export-run", inputs={"train.checkpoint": root / "ckpt"})
    result = export_stage.run(ctx)
    zlab, spec = (ctx.out_dir / result.artifacts[a].path for a in ("drafter", "drafter_vllm"))
    return root, target_dir, zlab, spec


def _ctx(root: Path, target: Path, run: Path, baselines: list, suites: list | None = None):
    suites = suites or ["heldout", {"name": "qa", "path": str(root / "qa.parquet"), "template": "Please {question}",
                                    "count": 3}]
    recipe = make_recipe(target={"model": str(target), "precision": "fp32"},
                         stages={"eval": {"num_prompts": 4, "max_new_tokens": 16, "suites": suites,
                                          "baselines": baselines}})
    run.mkdir(exist_ok=True)
    return stage_context("eval", recipe, run, inputs={"train.checkpoint": root / "ckpt",
                                                      "ingest.eval_prompts": root / "heldout.jsonl"})


def test_baselines_in_both_layouts_on_two_suites(setup, tmp_path):
    root, target, zlab, spec = setup
    ctx = _ctx(root, target, tmp_path / "run",
               ["untrained", {"name": "z-lab", "path": str(zlab)}, {"name": "vllm", "path": str(spec)}])
    result = eval_stage.run(ctx)
    report = ctx.out_dir / result.artifacts["report"].path
    data = json.loads((report / "eval.json").read_text())

    assert list(data["suites"]) == ["heldout", "qa"]
    assert data["drafters"]["z-lab"]["layout"] == "dflash" and data["drafters"]["vllm"]["layout"] == "speculators"
    assert [d["kind"] for d in data["drafters"].values()] == ["trained", "untrained", "baseline", "baseline"]
    info = data["suite_prompts"]
    assert info["heldout"]["prompt_ids"] == ["p0", "p1", "p2", "p3"]
    assert info["qa"]["prompt_ids"] == ["0", "1", "2"] and info["qa"]["prompt_sources"] == ["qa"] * 3
    for suite, drafters in data["suites"].items():
        assert list(drafters) == ["trained", "untrained", "z-lab", "vllm"]
        trained = drafters["trained"]
        assert trained["prompts"] == info[suite]["prompts"] and trained["cycles"] > 0
        for name in ("z-lab", "vllm"):  # the trained drafter's weights, read from either layout
            assert {k: drafters[name][k] for k in FIGURES} == {k: trained[k] for k in FIGURES}, (suite, name)
        # every drafter decodes to the target's greedy output
        assert info[suite]["greedy_agreement"] == 1.0
    # a test that could not tell the drafters apart would prove nothing: the trained one is accepted
    assert data["suites"]["heldout"]["trained"]["tau"] > data["suites"]["heldout"]["untrained"]["tau"]
    # the first suite's figures stay where they were before suites existed
    assert data["trained"] == data["suites"]["heldout"]["trained"] and data["prompts"] == 4
    assert data["untrained"] == data["suites"]["heldout"]["untrained"] and data["greedy_agreement"] == 1.0
    assert result.metrics["tau_by_suite"] == {s: {d: v["tau"] for d, v in ds.items()}
                                              for s, ds in data["suites"].items()}
    assert result.metrics["tau"] == data["trained"]["tau"]

    fig = acceptance_figure(data["suites"]["heldout"], data["suites"], "heldout")
    try:
        panel = next(ax for ax in fig.axes if ax.get_title() == SUITE_PANEL)
        assert len(panel.patches) == 4 * 2  # a bar per drafter per suite
        assert [t.get_text().split("\n")[0] for t in panel.get_xticklabels()] == ["heldout", "qa"]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def _broken(folder: Path, out: Path, edit) -> Path:
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_a_baseline_that_does_not_fit_the_target_stops_the_stage_naming_keys(setup, tmp_path):
    root, target, zlab, spec = setup

    def other_target(config):
        config["num_target_layers"] = 8
        config["dflash_config"]["target_layer_ids"] = [1, 6]

    def no_layout(config):
        config.pop("dflash_config")

    def dflash2(config):
        config["architectures"] = ["DFlash2DraftModel"]

    cases = [
        (_broken(zlab, tmp_path / "other", other_target), r"(?s)stages\.eval\.baselines\[b\].*num_target_layers"
                                                           r".*dflash_config\.target_layer_ids"),
        (_broken(spec, tmp_path / "spec-vocab", lambda c: c["transformer_layer_config"].update(vocab_size=99)),
         r"(?s)stages\.eval\.baselines\[b\].*transformer_layer_config\.vocab_size"),
        (_broken(zlab, tmp_path / "none", no_layout), r"neither a z-lab / SGLang DFlash config.*stages\.eval\.baselines"
                                                      r"\[b\]\.path"),
        # a DFlash2 drafter is decoded like ours, once its config holds DFlash2's keys (this one has none)
        (_broken(zlab, tmp_path / "two", dflash2),
         r"(?s)stages\.eval\.baselines\[b\].*dflash_config\.conv_kernel_size"),
        (tmp_path / "missing", r"stages\.eval\.baselines\[b\]\.path: .*neither a drafter folder nor a hub id"),
    ]
    for i, (folder, message) in enumerate(cases):
        ctx = _ctx(root, target, tmp_path / f"run{i}", [{"name": "b", "path": str(folder)}])
        with pytest.raises(ValueError, match=message):
            eval_drafters(ctx)  # checked from config.json and weight shapes, before any model is loaded


def test_a_hub_id_baseline_is_downloaded_then_read_like_a_folder(setup, tmp_path, monkeypatch):
    """The hub cannot be reached here: `snapshot_download` is replaced by a stand-in that answers
    with the exported folder and records what it was asked for."""
    import huggingface_hub

    root, target, zlab, _ = setup
    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, allow_patterns: asked.append((repo_id, allow_patterns)) or str(zlab))
    ctx = _ctx(root, target, tmp_path / "run", ["untrained", {"name": "z-lab", "path": "z-lab/tiny-DFlash"}])
    drafters = eval_drafters(ctx)
    assert [(d.name, d.kind, d.layout) for d in drafters] == [("trained", "trained", "dflash"),
                                                              ("untrained", "untrained", None),
                                                              ("z-lab", "baseline", "dflash")]
    assert asked == [("z-lab/tiny-DFlash", ["config.json", "*.safetensors"])]
    assert drafters[2].path == zlab and drafters[2].config == drafters[0].config
