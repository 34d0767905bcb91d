"""Wall time of the stages bound by the host (CPU, disk, network) and of evaluation.

Ingest's and tokenize's rates are measurements (cited below), and after a pilot the ingest is the one the pilot
ran; QC's, export's and backup's throughputs are conservative assumptions for one node. All are listed in
docs/planner.md.
"""

from __future__ import annotations

from dflashx.config.schema import Recipe
from dflashx.plan.estimates.deployment import SpeedupRow, predict_speedup
from dflashx.plan.estimates.speculative import drafter_window
from dflashx.plan.estimates.device import CALIBRATED_DECODE_CYCLE, device_of, factor, pilot_ingest_seconds
from dflashx.plan.estimates.engine import Measured
from dflashx.plan.estimates.fixed import TOKENIZE_PER_SAMPLE
from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.lengths import OutputLengths
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, explained, term
from dflashx.plan.expr import Expr, named, var
from dflashx.resolve.model import ResolvedRecipe

# The ingest stage on 200,000 synthetic prompts of the seeds' mean size (~1.2 KB; alpaca and sharegpt formats, 1%
# exact duplicates): read, normalise, hash, de-duplicate, order, write (benchmarks/results/ingest_generate.json's
# "ingest_full"). Its 20,000-prompt run went at 18,158 prompts/s: ingest holds every prompt in memory, and the rate
# at the seeds' scale is the larger run's.
INGEST_PROMPTS_PER_S = Measured(
    7_512, "benchmarks/results/ingest_generate.json (python benchmarks/ingest_generate.py)",
    "the stage on 200,000 prompts of ~1.2 KB: 26.63 s", "the 2-core development machine, 2026-12-02")
QC_SAMPLES_PER_S = 2_000  # per-sample checks + report plots
# The tokenize stage on 100K synthetic completions of realistic length (~2.1K tokens each, a 32,000-token BPE
# vocabulary), num_proc 2 on two pinned cores (benchmarks/results/tokenize.json's "stage"): its per-process time
# less the measured per-sample work (TOKENIZE_PER_SAMPLE) is its per-token work (render, encode, mask, write).
TOKENIZE_STAGE_RUN = {"samples": 100_000, "seconds": 210.44, "tokens": 211_579_115, "num_proc": 2}
TOKENIZE_TOKENS_PER_S_PER_PROC = Measured(
    round(TOKENIZE_STAGE_RUN["tokens"] / (TOKENIZE_STAGE_RUN["seconds"] * TOKENIZE_STAGE_RUN["num_proc"]
                                          - TOKENIZE_STAGE_RUN["samples"] * TOKENIZE_PER_SAMPLE.value), -3),
    "benchmarks/results/tokenize.json (python benchmarks/tokenize.py)",
    "the stage on 100,000 completions, 211.6M tokens, num_proc 2: 210.44 s; tokens / (210.44 s x 2 - 100,000 x "
    "the per-sample work)",
    "a lent H200 host's CPU pinned to 2 cores, 2026-12-02")
EXPORT_BYTES_PER_S = 500e6
BACKUP_BYTES_PER_S = 200e6  # multipart upload to S3 from one node
# The eval stage's decoder (SpecDecoder: transformers target, eager, batch 1) at tau 1, per output token, as a share
# of the datasheet bandwidth over the target's weight bytes: what the eval stage and the held-out tau probe cost.
EVAL_BANDWIDTH_EFFICIENCY = Measured(
    0.227, "benchmarks/results/eval_decode.json (python -m benchmarks.eval_decode)",
    "SpecDecoder with an untrained DFlash drafter (block 16: one cycle per token) on random Qwen3-32B-shaped "
    "bf16 targets of 16 / 32 / 64 layers, 512-token prompt, 128 new tokens: 0.227 / 0.262 / 0.226 of 3.35 TB/s; "
    "their median (plain greedy model.generate: 0.330 / 0.216 / 0.295)",
    "1x NVIDIA H100 80GB HBM3, torch 2.11, transformers 5.17, 2026-12-06")


def _rate_term(key: str, amount: Expr, rate: float) -> Term:
    return explained(key, amount / var("rate", rate), "s")


def host_seconds(recipe: Recipe, tokens: Tokens, storage_total: float, export_bytes: float) -> dict[str, Term]:
    num_proc = var("num_proc", recipe.stages.tokenize.num_proc)
    tokenize = (var("samples", tokens.samples) * var("per_sample_s", TOKENIZE_PER_SAMPLE.value)
                + var("tokens", tokens.total) / var("rate", TOKENIZE_TOKENS_PER_S_PER_PROC.value)) / num_proc
    return {
        "ingest": ingest_seconds(recipe, tokens),
        "qc": _rate_term("qc.seconds", var("samples", tokens.samples), QC_SAMPLES_PER_S),
        "tokenize": explained("tokenize.seconds", tokenize, "s", "rate: tokens per second per process",
                              per_sample_source=f"{TOKENIZE_PER_SAMPLE.source}: {TOKENIZE_PER_SAMPLE.figure}",
                              rate_source=f"{TOKENIZE_TOKENS_PER_S_PER_PROC.source}: "
                                          f"{TOKENIZE_TOKENS_PER_S_PER_PROC.figure}"),
        "export": _rate_term("export.seconds", var("drafter_bytes", export_bytes), EXPORT_BYTES_PER_S),
        "backup": _rate_term("backup.seconds", var("run_bytes", storage_total), BACKUP_BYTES_PER_S),
    }


def ingest_seconds(recipe: Recipe, tokens: Tokens) -> Term:
    """The ingest stage: as the pilot ran it (hardware.calibrated.ingest_seconds: the pilot runs the run's own
    ingest, which the run then skips), else the raw prompts at the measured rate (INGEST_PROMPTS_PER_S)."""
    measured = pilot_ingest_seconds(recipe.hardware)
    if measured is not None:
        return term("ingest.seconds", measured, "s", "measured_s",
                    "the run's own ingest stage as its pilot ran it (hardware.calibrated.ingest_seconds)",
                    measured_s=measured)
    return explained("ingest.seconds", var("raw_prompts", tokens.raw_prompts) / var("rate", INGEST_PROMPTS_PER_S.value),
                     "s", f"{INGEST_PROMPTS_PER_S.source}: {INGEST_PROMPTS_PER_S.figure}")


def batch1_seconds_per_token(recipe: ResolvedRecipe, weight_bytes: Expr, tp: int) -> Expr:
    """A GPU's batch-1 decode of one token: the weights read at EVAL_BANDWIDTH_EFFICIENCY of the bandwidth."""
    return named("seconds_per_token", weight_bytes / (var("bandwidth_bps", device_of(recipe.hardware).bandwidth_bps)
                                                      * var("tp", tp)) / var("efficiency",
                                                                             EVAL_BANDWIDTH_EFFICIENCY.value))


def _in_process_row(recipe: ResolvedRecipe, acceptance: list[float | None], concurrency: int) -> SpeedupRow:
    """deploy.speedup's row for the recipe's own drafter accepting `acceptance` at `concurrency` in flight."""
    return predict_speedup(recipe, acceptance, recipe.drafter.dims, window=drafter_window(recipe),
                           concurrencies=[concurrency]).rows[0]


def in_process_tokens_per_s(recipe: ResolvedRecipe, acceptance: list[float | None]) -> float:
    """The in-process speculative decoder at batch 1 with a drafter accepting `acceptance` (deploy.speedup's
    model at concurrency 1; on the CPU its fixed time per layer call was measured: engine.IN_PROCESS)."""
    return _in_process_row(recipe, acceptance, 1).tokens_per_second_drafter


def eval_seconds(recipe: ResolvedRecipe, s: Serving) -> Term:
    """The eval stage's decodes: batched (`eval_batched_seconds`), unless the target's cache cannot roll rows back
    (linear-attention or sliding layers), whose prompts decode one at a time: on the CPU through the measured
    in-process engine (`eval_in_process_seconds`), on a GPU at the batch-1 bandwidth bound
    (`eval_one_by_one_seconds`)."""
    if recipe.target.facts.full_attention_only:
        return eval_batched_seconds(recipe, s)
    if recipe.hardware.gpu is None:
        return eval_in_process_seconds(recipe)
    return eval_one_by_one_seconds(recipe, s)


def eval_one_by_one_seconds(recipe: ResolvedRecipe, s: Serving) -> Term:
    """Batch-1 target decode of every eval token, one prompt after another (an upper bound: speculation only
    shortens it): each suite's prompts, once per drafter and run (greedy, and the sampled runs at
    deploy.temperature: `ResolvedEvalStage.decodes`)."""
    ev = recipe.stages.eval
    tokens = named("tokens", var("decodes", ev.decodes) * var("max_new_tokens", ev.max_new_tokens))
    per_token = batch1_seconds_per_token(recipe, var("weight_bytes", s.weight_bytes), s.tp)
    return explained("eval.seconds", tokens * per_token, "s", "decodes: suites x drafters x runs, one prompt each; "
                     "efficiency: the batch-1 decoder's share of the bandwidth (EVAL_BANDWIDTH_EFFICIENCY)")


def decode_cycle_seconds(recipe: ResolvedRecipe, weight_bytes: Expr, tp: int) -> Expr:
    """One batched draft-verify cycle on a GPU: what the pilot's held-out τ measurements measured per cycle on this
    node (hardware.calibrated.decode_cycle_seconds: a small model's decode is launch-bound, which no roofline
    prices, and costs about the same whatever its rows), else the batch-1 bandwidth bound per token (a cycle at
    τ 1 reads the weights once)."""
    measured, calibrated = factor(recipe.hardware, CALIBRATED_DECODE_CYCLE, 0.0)
    if calibrated:
        return var("measured_cycle_s", measured)
    return batch1_seconds_per_token(recipe, weight_bytes, tp)


def in_process_cycle_seconds(recipe: ResolvedRecipe, rows: int) -> float:
    """One batched draft-verify cycle of `rows` rows on the CPU, whose cost grows with its rows: the deploy model's
    cycle at `rows` in flight (the in-process engine's measured time per layer call, the verify and the drafter's
    forward over rows x block tokens at the CPU's compute). The pilot's probes measure one row count only."""
    return _in_process_row(recipe, list(recipe.deploy.acceptance), rows).cycle_s


def eval_batched_seconds(recipe: ResolvedRecipe, s: Serving) -> Term:
    """The eval stage's decoder (`BatchDecoder`): one batch per drafter and setting, every suite's prompts its rows
    (the trained drafter greedily, its sampled runs as one more batch of runs x prompts rows, each baseline
    greedily; assumed to fit one batch: the decoder chunks by memory). A batch runs until its longest row ends:
    the output-length quantile at rows / (rows + 1) (the longest of `rows` draws), capped at max_new_tokens, over
    the row's τ (the trained drafter at deploy's expected τ, a baseline at τ 1) cycles, each at
    `decode_cycle_seconds` on a GPU, `in_process_cycle_seconds` of its batch's rows on the CPU."""
    ev, lengths = recipe.stages.eval, OutputLengths.of(recipe.dataset.stats)
    prompts = round(prompts_per_drafter(recipe))

    def longest(name: str, rows: int) -> Expr:
        return var(name, min(lengths.quantile(rows / (rows + 1)), ev.max_new_tokens))

    greedy, tau = longest("longest_output", prompts), var("expected_tau", recipe.deploy.expected_tau)
    cycles = greedy / tau + var("baselines", len(ev.baselines)) * greedy
    sampled = longest("longest_sampled_output", prompts * ev.sampled_runs) / tau if ev.sampled_runs else None
    if recipe.hardware.gpu is None:  # a cycle's cost grows with its rows: the sampled batch's apart
        seconds = named("cycles", cycles) * var("cycle_s", in_process_cycle_seconds(recipe, prompts))
        if sampled is not None:
            seconds = seconds + named("sampled_cycles", sampled) * var(
                "sampled_cycle_s", in_process_cycle_seconds(recipe, prompts * ev.sampled_runs))
    else:
        cycle = named("cycle_s", decode_cycle_seconds(recipe, var("weight_bytes", s.weight_bytes), s.tp))
        seconds = named("cycles", cycles if sampled is None else cycles + sampled) * cycle
    return explained("eval.seconds", seconds, "s",
                     "longest_*: the output-length quantile at rows / (rows + 1), capped at max_new_tokens; a batch "
                     "runs until its longest row ends", rows=prompts, sampled_runs=ev.sampled_runs)


def prompts_per_drafter(recipe: ResolvedRecipe) -> float:
    """Every suite's prompts, once: what one drafter decodes greedily (`ResolvedEvalStage.decodes` over the trained
    drafter, the baselines and the sampled runs)."""
    ev = recipe.stages.eval
    return ev.decodes / (1 + len(ev.baselines) + ev.sampled_runs)


def eval_in_process_seconds(recipe: ResolvedRecipe) -> Term:
    """The eval stage on the CPU: its speculative decoder is the in-process engine whose fixed time per
    layer call was measured (engine.IN_PROCESS), decoding one prompt at a time, as `deploy.speedup` at
    concurrency 1 predicts it. Each suite's prompts run greedily once per drafter, and with the trained
    drafter once more per sampled run at deploy.temperature (`ResolvedEvalStage.decodes`): the trained one
    at the recipe's expected acceptance, each baseline at none (tau 1: the untrained drafter's; an upper
    bound for a public one). A decode stops at the end of turn: the output-length distribution's mean, capped at
    max_new_tokens (the suites' prompts taken as like the training prompts)."""
    ev, block = recipe.stages.eval, recipe.drafter.block_size
    prompts = prompts_per_drafter(recipe)
    output = OutputLengths.of(recipe.dataset.stats).clipped_moment(1, ev.max_new_tokens)
    trained = var("tokens_per_s_trained", in_process_tokens_per_s(recipe, list(recipe.deploy.acceptance)))
    baseline = var("tokens_per_s_baseline", in_process_tokens_per_s(recipe, [0.0] * (block - 1)))
    runs, baselines = var("sampled_runs", ev.sampled_runs), var("baselines", len(ev.baselines))
    seconds = var("prompts_per_drafter", prompts) * var("output_tokens", output) * (
        (1 + runs) / trained + baselines / baseline)
    return explained("eval.seconds", seconds, "s", "engine.IN_PROCESS (benchmarks/results/cpu_decode.json): the "
                     "in-process decoder at batch 1, deploy.speedup's model at concurrency 1; baselines at tau 1",
                     expected_tau=recipe.deploy.expected_tau)
