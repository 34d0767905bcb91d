"""The z-lab reference (`dflash` 0.1.0 from PyPI) beside dflashx: importing it, and comparing our
sampled decoding with its `dflash_generate` at the same serving settings.

- `zlab_reference(module)`: a module of the reference, read from the unpacked wheel (never installed);
- `sampled_taus(ref, theirs, ours, prompts, new_tokens, sampling, seeds=5) -> SampledComparison`: per
  seed, tau pooled over the prompts for both decoders, and how many decodings are the same tokens;
- `assert_sampled_agree(comparison)`: the issue-31 criterion (the means within two combined standard
  errors) and the paired one (the decodings of a seed are the reference's, token for token);
- `export_decoders(run_dir, prompts)`: the reference's model and our `SpecDecoder` on a tiny run's
  export and the tiny target, with the run's first held-out prompts, chat template applied.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


REFERENCE = Path("/tmp/dflash_ref")  # the z-lab `dflash` 0.1.0 wheel, unpacked (never installed)


def zlab_reference(module: str = "dflash.model"):
    """A module of the z-lab reference (`dflash.model`, `dflash.benchmark`), read from the unpacked wheel.

    The wheel is fetched from PyPI and unpacked on first use (it is not installed: it must not
    touch this environment); the test is skipped only when that is impossible (no registry)."""
    import importlib
    import subprocess
    import sys
    import zipfile

    import pytest

    if not (REFERENCE / "dflash" / "model.py").exists():
        wheels = REFERENCE.parent / "dflash_pkg"
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "dflash==0.1.0",
                                  "-d", str(wheels)], capture_output=True, text=True)
        found = sorted(wheels.glob("dflash-0.1.0-*.whl"))
        if fetched.returncode != 0 or not found:
            pytest.skip(f"z-lab dflash reference not available: {fetched.stderr.strip()[-200:]}")
        with zipfile.ZipFile(found[0]) as wheel:
            wheel.extractall(REFERENCE)
    sys.path.insert(0, str(REFERENCE))
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(f"z-lab dflash reference not importable: {exc}")
    finally:
        sys.path.remove(str(REFERENCE))


@dataclass(frozen=True)
class SampledComparison:
    """tau per seed of ours and of the reference (each pooled over the prompts), and how many of the
    seeds x prompts decodings produced the same tokens in both."""

    mine: list[float]
    reference: list[float]
    identical: int
    decodings: int


def sampled_taus(ref, theirs, ours, prompts: list[list[int]], new_tokens: int, sampling: dict[str, Any],
                 seeds: int = 5) -> SampledComparison:
    """Both decoders at the serving settings `sampling` ({temperature, top_p, top_k}), seeds 0..seeds-1:
    ours (`SpecDecoder` `ours`) with a generator seeded as the eval stage seeds it, the reference's
    `dflash_generate` with drafter `theirs` from torch's global generator seeded alike. The two
    generators give the same stream and both decoders draw in the same order (`dflashx.dflash.proposal`),
    so a seed decodes the same tokens in both unless a float difference between the two implementations
    of the drafter tips a draw."""
    from dflashx.dflash.acceptance import summarize

    mine, reference, identical = [], [], 0
    for seed in range(seeds):
        torch.manual_seed(seed)
        stats = [ref.dflash_generate(theirs, ours.target, torch.tensor([p]), new_tokens, None, return_stats=True,
                                     **sampling) for p in prompts]
        lengths = [s.acceptance_lengths for s in stats]
        reference.append(sum(map(sum, lengths)) / sum(map(len, lengths)))
        generator = torch.Generator().manual_seed(seed)
        runs = [ours.generate(p, new_tokens, generator=generator, **sampling) for p in prompts]
        mine.append(summarize(runs, ours.cfg.block_size)["tau"])
        identical += sum(run.output_ids == s.output_ids[0, len(p):].tolist() for run, s, p in zip(runs, stats, prompts))
    return SampledComparison(mine, reference, identical, seeds * len(prompts))


# Share of decodings that must be the reference's token for token. Not all: the two drafters compute the
# same function in different orders (float noise of ~1e-6), which can tip a draw at a near tie; from there
# that one decoding differs. Draws in another order than the reference's decouple the two from the first
# difference on: on the tiny DFlash2 export, before the order was aligned, 120 of 600 decodings (100 seeds)
# were the same, and those only because the tiny target at T 0.6 is nearly deterministic; aligned, 120 of 120.
IDENTICAL_SHARE = 0.9


def assert_sampled_agree(c: SampledComparison) -> None:
    """The means lie within two standard errors of their difference (each SE over its seeds), and the
    decodings are the reference's (`IDENTICAL_SHARE`)."""
    import statistics

    se = (statistics.variance(c.mine) / len(c.mine) + statistics.variance(c.reference) / len(c.reference)) ** 0.5
    assert abs(statistics.mean(c.mine) - statistics.mean(c.reference)) <= 2 * se, c
    assert c.identical >= IDENTICAL_SHARE * c.decodings, c


def export_decoders(run_dir: Path, prompts: int):
    """(reference module, its model on the run's export and the loading info, our SpecDecoder on the export
    and the tiny target, the first `prompts` held-out prompts rendered with the chat template)."""
    from dflashx.config.load import load_recipe
    from dflashx.data.chat_mask import render_prompt
    from dflashx.data.suites import load_prompts
    from dflashx.dflash.checkpoint import load_drafter
    from dflashx.dflash.spec_decode import SpecDecoder
    from dflashx.targets.load import load_model, load_tokenizer

    ref = zlab_reference()
    ref._cuda_time = time.perf_counter  # torch.cuda.synchronize cannot run on a CPU; no figure depends on it
    folder = run_dir / "export" / "drafter"
    config = json.loads((folder / "config.json").read_text())
    model = getattr(ref, config["architectures"][0])
    theirs, info = model.from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True)
    spec = load_recipe(REPO / "recipes" / "tiny.yaml").recipe.target
    target, tokenizer = load_model(spec, "fp32"), load_tokenizer(spec)
    ours = SpecDecoder(target, load_drafter(folder, dtype=torch.float32).eval())
    ids = [tokenizer(render_prompt(tokenizer, p, spec.chat_template), add_special_tokens=False)["input_ids"]
           for p in load_prompts(run_dir / "ingest" / "eval_prompts.jsonl", prompts)]
    return ref, theirs.eval(), info, ours, ids
