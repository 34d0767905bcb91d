"""`dflashx run recipes/tiny.yaml drafter.architecture=dflash2` end to end (ingest to export, real
stages through the CLI), then its exported drafter against the z-lab reference (`dflash` 0.1.0,
imported from the unpacked wheel as in test_tau_reference.py, its CUDA clock replaced):

- the export loads into `DFlash2DraftModel` with no missing, unexpected or mismatched key;
- the reference's `dflash_generate` with it reproduces the target's greedy output;
- dflashx's own τ on the same held-out prompts equals the reference's within 0.01;
- at the recipe's serving settings (deploy: temperature 0.6, top_p 0.95, top_k 20) dflashx's τ and the
  reference's `dflash_generate(..., temperature=0.6, ...)` on the same prompts, 5 seeds each, have means
  within two standard errors of their difference and each seed decodes the reference's tokens; the eval
  stage reported that τ with its interval.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_reference import assert_sampled_agree, export_decoders, sampled_taus

REPO = Path(__file__).resolve().parents[1]
PROMPTS, NEW_TOKENS, SEEDS = 6, 64, 5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dflash2-run")
    argv = [sys.executable, "-m", "dflashx.cli.main", "run", "recipes/tiny.yaml", "drafter.architecture=dflash2",
            "--run-dir", str(root / "tiny")]
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True,
                          timeout=3000)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return root / "tiny"


def test_the_dflash2_run_completes_and_exports_the_published_layout(run_dir: Path) -> None:
    for stage in ("ingest", "generate", "qc", "tokenize", "train", "eval", "export"):
        assert (run_dir / stage / "_SUCCESS").is_file(), stage
    config = json.loads((run_dir / "export" / "drafter" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["is_causal"] is False
    assert {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k", "block_size"} <= set(
        config["dflash_config"])
    metrics = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    selector = [m["metrics"]["selector_loss"] for m in metrics
                if m.get("event") == "metrics" and "selector_loss" in m.get("metrics", {})]
    assert len(selector) >= 3 and selector[-1] < selector[0]  # the selector learnt on the tiny run


@pytest.fixture(scope="module")
def decoders(run_dir: Path):
    """The reference's DFlash2DraftModel and our SpecDecoder on the run's export and the tiny target, and
    the first held-out prompts, chat template applied."""
    ref, theirs, info, ours, prompts = export_decoders(run_dir, PROMPTS)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return ref, theirs, ours, prompts


def test_the_reference_decodes_our_export_as_we_do(decoders) -> None:
    ref, theirs, ours, prompts = decoders
    target = ours.target
    mine_tokens, mine_cycles, ref_lengths = 0, 0, []
    for ids in prompts:
        stats = ref.dflash_generate(theirs, target, torch.tensor([ids]), NEW_TOKENS, None, return_stats=True)
        out = stats.output_ids[0, len(ids):].tolist()
        with torch.no_grad():  # the reference's output is the target's greedy output: each token its argmax
            argmax = target(torch.tensor([ids + out])).logits[0, len(ids) - 1:-1].argmax(-1).tolist()
        assert len(out) == NEW_TOKENS and out == argmax
        mine = ours.generate(ids, NEW_TOKENS)
        assert mine.output_ids == out
        mine_tokens, mine_cycles = mine_tokens + mine.decoded_after_first, mine_cycles + len(mine.accepted)
        ref_lengths += stats.acceptance_lengths
    tau, ref_tau = mine_tokens / mine_cycles, sum(ref_lengths) / len(ref_lengths)
    assert tau == pytest.approx(ref_tau, abs=0.01)
    assert tau > 2.0  # a trained drafter: drafts are accepted


def test_at_the_serving_temperature_our_tau_agrees_with_the_references(run_dir: Path, decoders) -> None:
    """Issue 31's acceptance: the tiny recipe serves at temperature 0.6 (top_p 0.95, top_k 20); on the run's
    export both decoders sample SEEDS seeds over the same prompts, their mean τ agree within two
    standard errors of the difference and each seed decodes the reference's tokens. The eval stage
    measured that τ too (5 seeds, mean and 95% interval) and the predicted speed-up reads its acceptance."""
    ref, theirs, ours, prompts = decoders
    deploy = json.loads((run_dir / "plan.json").read_text())["resolved"]["deploy"]
    sampling = {k: deploy[k] for k in ("temperature", "top_p", "top_k")}
    assert sampling == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    compared = sampled_taus(ref, theirs, ours, prompts, NEW_TOKENS, sampling, seeds=SEEDS)
    assert_sampled_agree(compared)
    assert min(compared.mine + compared.reference) > 1.5  # a trained drafter's drafts are accepted when sampling

    report = json.loads((run_dir / "eval" / "report" / "eval.json").read_text())
    served = report["trained"]["sampled"]
    assert report["sampling"] == sampling | {"seeds": 5} and len(served["tau_per_seed"]) == 5
    assert served["tau_ci95"][0] < served["tau"] < served["tau_ci95"][1] and served["tau"] > 1.5
    assert report["predicted_speedup"]["tau"] == pytest.approx(1 + sum(served["acceptance_by_position"]))
