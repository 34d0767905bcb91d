"""How each serving engine turns speculative decoding off above a batch size, at the releases the export targets.

`dflashx plan` predicts the concurrency N above which the drafter stops paying (`estimates/deployment.py`); this
module says how to act on it with the engine's own setting, read in the engine releases `dflashx.export.engines`
checks the serve commands against (`CHECKED`: a test keeps the two tables equal; `export/` sits above `plan/`
and may read this one, not the other way round):

- vLLM 0.32.0: `speculative_config.num_speculative_tokens_per_batch_size` ("dynamic speculative decoding",
  vllm-project/vllm PR #32374; `vllm/config/speculative.py`: `list[tuple[int, int, int]] | None`), entries
  `[range_start, range_end, K]` over inclusive batch-size ranges, the first starting at 1, K >= 0; the ranges
  are clamped to `max_num_seqs`, a gap or the tail carries the previous K, K is clamped to
  `num_speculative_tokens` (`vllm/v1/spec_decode/dynamic/utils.py` `build_dynamic_sd_schedule_lookup`). K = 0
  drafts nothing: speculation off for that band. The batch size is the step's scheduled requests, prefill chunks
  included (`vllm/v1/core/sched/scheduler.py`); the DFlash proposer takes the step's K
  (`vllm/v1/worker/gpu_model_runner.py`: `self.drafter.propose(num_speculative_tokens=num_spec_tokens_to_schedule)`
  for `use_dflash()`); with data parallelism > 1 vLLM drops the schedule and keeps the static K
  (`vllm/config/vllm.py` `_maybe_disable_dynamic_sd_for_data_parallel`). The older `disable_by_batch_size` is gone:
  ignored since v0.10.0 and removed by PR #35060, and 0.32.0's `SpeculativeConfig` (extra="forbid") rejects it.
- SGLang 0.5.23: no setting switches DFLASH off by batch size. `--speculative-adaptive` with
  `--speculative-adaptive-config FILE` picks `speculative_num_steps` per batch-size slot, 0 turning drafting off
  (`srt/speculative/adaptive_spec_params.py`: slots keyed by batch size, the batch padded to its CUDA-graph size
  and mapped to the largest slot key not above it), but only for `--speculative-algorithm EAGLE|EAGLE3` with top-k
  1 (`adaptive_unsupported_reason`; any other algorithm falls back to the static flags with a warning): the
  target's MTP head as the plan serves it, not a DFlash drafter. For DFLASH the advice is to send the load above N
  per server to servers started without the drafter (`--max-running-requests` only queues requests beyond it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dflashx.config.architectures import names
from dflashx.plan.expand.draft import dflash_spec

# The releases these facts were read in: `dflashx.export.engines.ENGINES`' `checked` (tests keep them equal).
CHECKED = {"vllm": "0.32.0", "sglang": "0.5.23"}
VLLM_SCHEDULE_END = 65_536  # the last band's end: vLLM clamps every range to max_num_seqs (module doc)


@dataclass(frozen=True)
class SwitchOff:
    engine: str  # "vLLM" or "SGLang", with the release read
    text: str  # the setting, or the advice where the engine has none


def vllm_schedule(above: int, drafts: int) -> list[list[int]]:
    """vLLM's batch-size schedule: `drafts` draft tokens up to `above` requests, none beyond."""
    return [[1, above, drafts], [above + 1, VLLM_SCHEDULE_END, 0]]


def _vllm(method: str, block: int, above: int) -> SwitchOff:
    drafts = block - 1
    spec = dflash_spec("<drafter>", block) if method in names() else {
        "method": method, "num_speculative_tokens": drafts}
    spec["num_speculative_tokens_per_batch_size"] = vllm_schedule(above, drafts)
    text = (f"--speculative-config '{json.dumps(spec)}' (the batch is the step's scheduled requests; ignored with "
            "--data-parallel-size > 1)")
    return SwitchOff(f"vLLM {CHECKED['vllm']}", text)


def _sglang(method: str, above: int, steps: int) -> SwitchOff:
    if method in ("mtp", "eagle", "eagle3"):
        config = json.dumps({"1": {"candidate_steps": [steps]}, str(above + 1): {"candidate_steps": [0]}})
        return SwitchOff(f"SGLang {CHECKED['sglang']}",
                         f"--speculative-adaptive --speculative-adaptive-config FILE with {config} (EAGLE/EAGLE3, "
                         "top-k 1; the batch is padded to its CUDA-graph size first)")
    return SwitchOff(f"SGLang {CHECKED['sglang']}",
                     f"no switch for DFLASH (--speculative-adaptive takes EAGLE/EAGLE3 only): send the load above "
                     f"{above} requests per server to servers started without the drafter")


def _not_needed(method: str, block: int) -> list[SwitchOff]:
    """The engines' settings in general form, for a grid on which the drafter pays everywhere."""
    vllm = (f"none needed on this grid; the setting: \"num_speculative_tokens_per_batch_size\": [[1, N, {block - 1}], "
            f"[N + 1, {VLLM_SCHEDULE_END}, 0]] in --speculative-config (N: the last batch size to draft at)")
    sglang = ("none needed on this grid; --speculative-adaptive with a FILE whose slot above N has candidate_steps "
              "[0] (EAGLE/EAGLE3, top-k 1)" if method in ("mtp", "eagle", "eagle3") else
              "none needed on this grid; DFLASH has no switch (--speculative-adaptive takes EAGLE/EAGLE3 only)")
    return [SwitchOff(f"vLLM {CHECKED['vllm']}", vllm), SwitchOff(f"SGLang {CHECKED['sglang']}", sglang)]


def switch_off_settings(method: str, block: int, above: int | None, steps: int = 0) -> list[SwitchOff]:
    """Each engine's way to stop drafting above `above` requests in flight (None: it pays on the whole grid, the
    settings in general form; 0: it pays nowhere, serve without it). `block`: tokens verified per cycle; `steps`:
    an EAGLE-style draft's steps."""
    if above is None:
        return _not_needed(method, block)
    if above == 0:
        return [SwitchOff("any engine", "the drafter does not pay at any concurrency of the grid: serve without it")]
    return [_vllm(method, block, above), _sglang(method, above, steps or block - 1)]
