"""Fixed costs: what a stage spends besides its per-prompt, per-sample and per-token work (pure).

A stage's time is its work (host.py, generation.py, training.py) plus these parts, each measured in
isolation by `python -m benchmarks.fixed_costs` (benchmarks/results/fixed_costs.json: a fresh process
doing, one at a time and in the pipeline's order, what the stages do around their work), never read off
a pipeline run:
  imports      torch + transformers, the target architecture's modeling code, matplotlib, datasets,
               W&B's service; once per process, by the first enabled stage that needs them
  loads        the target (from_pretrained), its tokenizer, a drafter checkpoint; each time a stage does
  training     the process group (imports DeepSpeed), DeepSpeed's once-per-process set-up at its first engine,
               the DeepSpeed engine, each training checkpoint, the drafter's safetensors
  export       the export stage's work on the drafter (both layouts written and checked, the READMEs)
  orchestrator each stage's bookkeeping (its log, watchdog, artifacts hashed and registered) and its W&B run
               (tracking.mode not disabled)
Process model (`dflashx.run`): the stages run one after another in the `dflashx run` process, which
imports torch itself once the first stage has ended (for its provenance record); a lone train process keeps
its one-rank group open for the next train stage (`dflashx.dflash.trainer.run_training` closes it only when
launched); a train stage of more than one rank starts one process per rank (in parallel), each paying the
interpreter and its imports again. A run that follows its pilot in the same process finds the pilot's
once-per-process parts paid (`process_parts` of the pilot's recipe, given to `fixed_costs` as `paid`). Not
measured, so not in the plan: SGLang's server start-up (generate with `backend: sglang`) and S3 (backup).
The parts were measured with the tiny target (11 MB of weights read from the page cache); a target load adds
its checkpoint's bytes at a cited cold-start loading rate (LOAD_RATE): nothing for the tiny target, most of a
large target's load.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES
from dflashx.config.schema import STAGE_ORDER
from dflashx.plan.estimates.device import pilot_ingest_seconds
from dflashx.plan.estimates.engine import Measured
from dflashx.plan.explain import Term, explained
from dflashx.plan.expr import const, total, var
from dflashx.resolve.model import ResolvedRecipe

_SOURCE = "benchmarks/results/fixed_costs.json (python -m benchmarks.fixed_costs)"
_WHERE = "the 2-core development machine, Python 3.11, torch 2.13 CPU, transformers 5, tiny-qwen3 target"

# The JSON's medians of 5 fresh processes (measured 2026-12-07 on the 2 idle cores, load average 1.2 before the
# benchmark; 3 processes on this day's new machine spread by up to 20%): the CPU time of the process (at the clock's
# resolution) and of the children it waited for (`<part>_cpu`; on a shared machine, about what the part takes on an
# idle core), and the bare interpreter's wall time.
MEDIANS_S = {
    "wandb_run_first": 0.72, "wandb_run": 0.103, "import_pandas": 0.185, "import_torch_transformers": 3.267,
    "tokenizer_load": 0.01, "model_load_first": 0.427, "model_load": 0.027, "import_matplotlib": 0.266,
    "figure_first": 0.156, "figure": 0.124, "eval_report": 0.493, "import_datasets": 0.131, "tokenize_first": 0.151,
    "tokenize_again": 0.08, "tokenize_large": 0.569, "process_group": 0.223, "engine_build": 0.708,
    "engine_build_again": 0.007, "checkpoint_save": 0.009, "drafter_save": 0.004, "drafter_load": 0.008,
    "export": 0.02, "bookkeeping": 0.005, "interpreter": 0.023,
}


def _part(what: str, measured: str, less: str | None = None) -> Measured:
    """A part: the median `measured`, less the median `less` where the first figure includes it."""
    value = MEDIANS_S[measured] - (MEDIANS_S[less] if less else 0.0)
    figure = f"{what}: {measured} {MEDIANS_S[measured]:.3f} s" + (f" - {less} {MEDIANS_S[less]:.3f} s" if less else "")
    return Measured(round(value, 3), _SOURCE, figure, _WHERE)


# The tokenize stage's function on synthetic one-line completions (about 27 tokens each with the chat template) in
# one process: its first call on TOKENIZE_SAMPLES, the same call again, and on ten times the samples. Its work per
# sample beside its per-token rate (host.py) is the slope between the two later calls; what a call costs besides
# (the tokenizer's load, the datasets steps' set-up and writes) is the later small call less its samples; what the
# first call pays once per process (the stage's module, the datasets steps' and the chat template's first use)
# is the first call less the second.
TOKENIZE_SAMPLES = 400
_TOKENIZE_SLOPE = (MEDIANS_S["tokenize_large"] - MEDIANS_S["tokenize_again"]) / (9 * TOKENIZE_SAMPLES)
_TOKENIZE_RUNS = (f"tokenize_first {MEDIANS_S['tokenize_first']:.3f} s, tokenize_again "
                  f"{MEDIANS_S['tokenize_again']:.3f} s ({TOKENIZE_SAMPLES} completions), tokenize_large "
                  f"{MEDIANS_S['tokenize_large']:.3f} s ({10 * TOKENIZE_SAMPLES})")
TOKENIZE_PER_SAMPLE = Measured(round(_TOKENIZE_SLOPE, 7), _SOURCE,
                               f"tokenize_completions per sample: (tokenize_large - tokenize_again) / "
                               f"{9 * TOKENIZE_SAMPLES}; {_TOKENIZE_RUNS}", _WHERE)
_TOKENIZE_SETUP = _part("the tokenize stage's first call in a process less a second", "tokenize_first",
                        "tokenize_again")
_TOKENIZE_CALL = Measured(
    round(MEDIANS_S["tokenize_again"] - TOKENIZE_SAMPLES * _TOKENIZE_SLOPE, 3), _SOURCE,
    f"a tokenize_completions call besides its samples: tokenize_again less {TOKENIZE_SAMPLES} x the per-sample "
    f"slope; {_TOKENIZE_RUNS}", _WHERE)

PARTS: dict[str, Measured] = {
    "interpreter": _part("python -c pass (wall)", "interpreter"),
    "wandb_service": _part("importing W&B and starting its service: the first offline run less a second",
                           "wandb_run_first", "wandb_run"),
    "wandb_run": _part("offline wandb.init + finish, the service running", "wandb_run"),
    "pandas": _part("import pandas and pyarrow (at W&B's start in the pipeline; else with datasets)",
                    "import_pandas"),
    "torch": _part("import torch, transformers (AutoModelForCausalLM)", "import_torch_transformers"),
    "tokenizer": _part("AutoTokenizer.from_pretrained", "tokenizer_load"),
    "modeling": _part("the architecture's modeling code: the first from_pretrained less a second",
                      "model_load_first", "model_load"),
    "target_load": _part("AutoModelForCausalLM.from_pretrained of the tiny target (11 MB)", "model_load"),
    "matplotlib": _part("import matplotlib (Agg) and pyplot", "import_matplotlib"),
    "figure_setup": _part("matplotlib's first figure less a second (fonts, backend)", "figure_first", "figure"),
    "figure": _part("one QC histogram figure drawn and written as PNG", "figure"),
    "eval_report": _part("the eval's report after its decodes: the predicted speed-up with speedup.png, and "
                         "acceptance.png (5 panels), on the tiny recipe's 2 suites of 16 prompts", "eval_report"),
    "datasets": _part("import datasets", "import_datasets"),
    "tokenize_setup": _TOKENIZE_SETUP,
    "tokenize_call": _TOKENIZE_CALL,
    "process_group": _part("setup_distributed: imports DeepSpeed, a one-rank gloo group", "process_group"),
    "engine_setup": _part("DeepSpeed's once-per-process set-up at its first engine: the first TrainStep less a second",
                          "engine_build", "engine_build_again"),
    "engine": _part("TrainStep around a fresh tiny drafter, DeepSpeed set up: deepspeed.initialize",
                    "engine_build_again"),
    "checkpoint": _part("checkpoint.save_training_state (engine, optimizer, RNG)", "checkpoint_save"),
    "drafter_save": _part("checkpoint.save_drafter (config.json + model.safetensors)", "drafter_save"),
    "drafter_load": _part("checkpoint.load_drafter", "drafter_load"),
    "export": _part("the export stage's work on the tiny drafter: load it, write both layouts, read them back "
                    "against the engines' contracts, the READMEs (stages.export.write_export)", "export"),
    "bookkeeping": _part("the orchestrator's work around a stage inside its timer: its output captured, its watchdog, "
                         "its artifacts hashed and registered, the manifest saved (the export's two folders)",
                         "bookkeeping"),
}
# A target's weights loaded at a cold start with the default safetensors loader (mmap through the page cache).
LOAD_RATE = Measured(
    1.1e9, "github.com/mgoin/instanttensor README, model loading benchmark on inference engines",
    "Qwen3-30B-A3B with the Safetensors backend: 57.4 s, 1.1 GB/s",
    "1x H200, an inference engine's cold start (8x H200 loading DeepSeek-R1 together: 4.3 GB/s in all)")


def target_read_seconds(recipe: ResolvedRecipe) -> float:
    """Reading the target's checkpoint once: its parameters at the load precision's bytes, at least 16-bit (an
    FP8 target is read from its bf16 checkpoint), at LOAD_RATE."""
    bytes_ = recipe.target.facts.total_params * max(PRECISION_BYTES[recipe.target.load_precision], 2)
    return bytes_ / LOAD_RATE.value


ONCE_PER_PROCESS = frozenset({"interpreter", "torch", "modeling", "matplotlib", "figure_setup", "pandas",
                              "datasets", "tokenize_setup", "wandb_service", "process_group", "engine_setup"})
# Imported by the orchestrator itself after the first stage ends (its provenance record names torch's version:
# `dflashx.track.provenance.torch_facts`), outside every stage's timer.
PROVENANCE_IMPORTS = frozenset({"torch"})
# The QC histograms the QC report draws (the code's, checked by tests/test_plan_fixed.py:
# `dflashx.data.qc_report.HISTOGRAMS`); the eval's report is a part of its own (`eval_report`).
QC_FIGURES = 3


@dataclass(frozen=True)
class FixedCosts:
    """Per stage: the fixed parts it pays (part -> count) and their seconds; `paid`: the once-per-process parts
    the `dflashx run` process holds after its stages."""

    parts: dict[str, dict[str, int]]
    seconds: dict[str, float]
    terms: dict[str, Term]
    paid: frozenset[str]


def checkpoint_saves(steps: int, every: int) -> int:
    """Training checkpoints written: every `every` optimizer steps and at the last one."""
    return -(-steps // every)


def stage_needs(recipe: ResolvedRecipe, stage: str, steps: int) -> dict[str, int]:
    """The fixed parts one stage does (its code's imports, loads and writes), before the process model."""
    st = recipe.stages
    needs: dict[str, int] = {}
    if stage == "generate" and st.generate.serving.mode == "in-process":
        needs = {"torch": 1, "modeling": 1, "tokenizer": 1, "target_load": 1}
    elif stage == "qc":  # loading a tokenizer (AutoTokenizer) imports torch
        needs = {"torch": 1, "matplotlib": 1, "figure_setup": 1, "figure": QC_FIGURES, "tokenizer": 1}
    elif stage == "tokenize":
        needs = {"torch": 1, "pandas": 1, "datasets": 1, "tokenize_setup": 1, "tokenize_call": 1}  # loads its tokenizer
    elif stage == "train":
        needs = {"torch": 1, "modeling": 1, "pandas": 1, "datasets": 1, "process_group": 1, "target_load": 1,
                 "tokenizer": 1, "engine_setup": 1, "engine": 1,
                 "checkpoint": checkpoint_saves(steps, st.train.checkpoint_every), "drafter_save": 1}
    elif stage == "eval":
        needs = {"torch": 1, "modeling": 1, "matplotlib": 1, "figure_setup": 1, "eval_report": 1,
                 "target_load": 1, "tokenizer": 1, "drafter_load": 1 + len(st.eval.baselines)}
    elif stage == "export":
        needs = {"torch": 1, "export": 1}
    return needs


def orchestrator_needs(recipe: ResolvedRecipe) -> dict[str, int]:
    """What the `dflashx run` process does around every stage: its bookkeeping, and a W&B run unless tracking is
    disabled; W&B's start imports pandas and pyarrow (`python -X importtime` of the tiny run: in ingest, after W&B's
    exporters)."""
    tracking = {} if recipe.tracking.mode == "disabled" else {"wandb_service": 1, "pandas": 1, "wandb_run": 1}
    return {"bookkeeping": 1, **tracking}


def fixed_costs(recipe: ResolvedRecipe, steps: int, paid: frozenset[str] = frozenset()) -> FixedCosts:
    """Walk the enabled stages in order: a once-per-process part is paid by the first stage needing it
    in the `dflashx run` process (torch: by none after the first stage, whose provenance imports it), unless
    the process had paid it before (`paid`: its pilot's, `process_parts`); a train stage of several ranks pays
    its own in fresh processes. An ingest its pilot ran (`hardware.calibrated.ingest_seconds`) pays none: it was
    measured whole, and the run skips it."""
    imported: set[str] = {"interpreter", *paid}  # the dflashx run process is running
    parts: dict[str, dict[str, int]] = {}
    for stage in STAGE_ORDER:
        if not getattr(recipe.stages, stage).enabled or (stage == "ingest"
                                                         and pilot_ingest_seconds(recipe.hardware) is not None):
            continue
        work = stage_needs(recipe, stage, steps)
        launched = stage == "train" and recipe.stages.train.world_size > 1
        here = orchestrator_needs(recipe) if launched else {**work, **orchestrator_needs(recipe)}
        parts[stage] = {p: n for p, n in here.items() if p not in ONCE_PER_PROCESS or p not in imported}
        if launched:  # each rank: a fresh process doing the stage's work, in parallel with the others
            parts[stage] |= {"interpreter": 1, **work}
        imported |= (here.keys() & ONCE_PER_PROCESS) | PROVENANCE_IMPORTS
    read = target_read_seconds(recipe)
    each = {p: m.value + (read if p == "target_load" else 0.0) for p, m in PARTS.items()}
    sums = {s: total(*(var(f"{p}_s", each[p]) * n for p, n in ps.items())) if ps else const(0.0)
            for s, ps in parts.items()}
    terms = {s: explained(f"{s}.fixed_seconds", sums[s], "s",
                          f"each part measured in isolation (imports once per process, loads, set-up, writes, its W&B "
                          f"run), a target load with its checkpoint's bytes at the cold-start loading rate; {_SOURCE}; "
                          f"{_WHERE}; load rate: {LOAD_RATE.source}: {LOAD_RATE.figure}",
                          **{p: f"{n} x {each[p]:.3f} s ({PARTS[p].figure}"
                             + (f" + checkpoint read {read:.3f} s" if p == "target_load" else "") + ")"
                             for p, n in parts[s].items()})
             for s in parts}
    seconds = {s: expr.value for s, expr in sums.items()}
    return FixedCosts(parts, seconds, terms, frozenset(imported))


def process_parts(recipe: ResolvedRecipe) -> frozenset[str]:
    """The once-per-process parts a `dflashx run` process holds after the enabled stages of `recipe` (a pilot's:
    the run that follows in the same process does not pay them again)."""
    return fixed_costs(recipe, steps=1).paid
