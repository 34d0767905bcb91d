"""The tiny recipe on a mixture-of-experts target: `dflashx run recipes/tiny_moe.yaml` through the real
CLI, ingest -> export (backup off), every stage real: transformers generation through qwen3_moe's
routed experts, the QC gate, tokenization, online DeepSpeed training capturing the MoE target's
tapped layers, speculative-decoding evaluation and the export for SGLang and vLLM.

Kept short with overrides: 48 prompts (the source capped), 12 optimizer steps, 4 eval prompts per suite. The target is
`builtin:tiny-qwen3_moe` (the shipped tiny Qwen3 upcycled in seconds, `dflashx.tiny.moe`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STAGES = ("ingest", "generate", "qc", "tokenize", "train", "eval", "export")
FAST = ["dataset.sources.0.cap=48", "dataset.stats.samples=48", "dataset.eval_holdout=4", "stages.train.max_steps=12",
        "stages.eval.num_prompts=4", "stages.eval.max_new_tokens=48", "stages.eval.baselines=[]"]

pytestmark = pytest.mark.slow


def test_tiny_moe_recipe_runs_ingest_to_export(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny_moe"
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "dflashx.cli.main", "run", "recipes/tiny_moe.yaml", "--run-dir",
                           str(run_dir), *FAST], cwd=REPO, env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for stage in STAGES:
        assert (run_dir / stage / "_SUCCESS").is_file(), stage

    resolved = json.loads((run_dir / "plan.json").read_text())["resolved"]
    facts = resolved["target"]["facts"]
    assert facts["model_type"] == "qwen3_moe" and facts["num_experts"] == 4 and facts["num_experts_per_tok"] == 2
    qc = json.loads((run_dir / "qc" / "report" / "qc.json").read_text())
    assert qc["passed"] is True  # the upcycled MoE thinks like the dense tiny target it came from

    metrics = [json.loads(line) for line in (run_dir / "train" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 12 and metrics[-1]["tflops"] > 0
    report = json.loads((run_dir / "eval" / "report" / "eval.json").read_text())
    assert report["greedy_agreement"] == 1.0  # speculative decoding through the MoE target stays exact

    exported = json.loads((run_dir / "export" / "drafter" / "config.json").read_text())
    assert exported["architectures"] == ["DFlashDraftModel"]  # the drafter of an MoE target is dense
    assert "num_experts" not in exported
    assert exported["dflash_config"]["target_model_type"] == "qwen3_moe"
    assert exported["dflash_config"]["target_layer_ids"] == resolved["drafter"]["target_layer_ids"]
    vllm = json.loads((run_dir / "export" / "drafter-vllm" / "config.json").read_text())
    assert vllm["speculators_config"]["verifier"]["architectures"] == ["Qwen3MoeForCausalLM"]
    assert vllm["target_model_type"] == "qwen3_moe"
