"""Fixed costs: what a stage spends besides its per-prompt, per-sample and per-token work (pure).

A stage's time is its work (host.py, generation.py, training.py) plus these parts, each measured in
isolation by `python -m benchmarks.fixed_costs` (benchmarks/results/fixed_costs.json: a fresh process
doing, one at a time and in the pipeline's order, what the stages do around their work), never read off
a pipeline run:
  imports      torch + transformers, the target architecture's modeling code, matplotlib, datasets,
               W&B's service; once per process, by the first enabled stage that needs them
  loads        the target (from_pretrained), its tokenizer, a drafter checkpoint; each time a stage does
  training     the process group (imports DeepSpeed), the DeepSpeed engine, each training checkpoint,
               the drafter's safetensors
  tracking     one W&B run per stage (tracking.mode not disabled)
Process model (`dflashx.run`): the stages run one after another in the `dflashx run` process; a train
stage of more than one rank starts one process per rank (in parallel), each paying the interpreter and
its imports again. Not measured, so not in the plan: SGLang's server start-up (generate with
`backend: sglang`) and S3 (backup). The parts were measured with the tiny target (a few MB of weights
read from the page cache): a large target's load adds its bytes read from disk, which no hardware
profile states yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.schema import STAGE_ORDER
from dflashx.plan.estimates.engine import Measured
from dflashx.plan.explain import Term, term
from dflashx.resolve.model import ResolvedRecipe

_SOURCE = "benchmarks/results/fixed_costs.json (python -m benchmarks.fixed_costs)"
_WHERE = "the 2-core development machine, Python 3.11, torch 2.13 CPU, transformers 5, tiny-qwen3 target"


def _measured(seconds: float, figure: str) -> Measured:
    return Measured(seconds, _SOURCE, figure, _WHERE)


# Medians of 3 fresh processes (measured 2026-12-05, load average 4.5 on the 2 cores): the CPU time of the
# process and of the children it waited for (`<part>_cpu` in the JSON; on a shared machine, about what the
# part takes on an idle core), except the bare interpreter (wall time). A part that is a difference of two
# figures says so.
PARTS: dict[str, Measured] = {
    "interpreter": _measured(0.062, "python -c pass: 0.062 s (interpreter, wall)"),
    "wandb_service": _measured(0.48, "first offline wandb.init + finish 0.55 s less a second one 0.07 s: importing "
                                     "W&B and starting its service (wandb_run_first_cpu - wandb_run_cpu)"),
    "wandb_run": _measured(0.07, "offline wandb.init + finish, service running: 0.07 s (wandb_run_cpu)"),
    "torch": _measured(1.72, "import torch, transformers (AutoModelForCausalLM): 1.72 s "
                             "(import_torch_transformers_cpu)"),
    "tokenizer": _measured(0.01, "AutoTokenizer.from_pretrained: 0.01 s (tokenizer_load_cpu)"),
    "modeling": _measured(1.65, "first from_pretrained 1.67 s less a second one 0.02 s: the architecture's "
                                "modeling code (model_load_first_cpu - model_load_cpu)"),
    "target_load": _measured(0.02, "AutoModelForCausalLM.from_pretrained of the tiny target (11 MB), modeling "
                                   "imported: 0.02 s (model_load_cpu)"),
    "matplotlib": _measured(0.27, "import matplotlib (Agg) and pyplot: 0.27 s (import_matplotlib_cpu)"),
    "datasets": _measured(0.52, "import datasets: 0.52 s (import_datasets_cpu)"),
    "process_group": _measured(0.21, "dflashx.dflash.distributed.setup_distributed (imports DeepSpeed, one-rank "
                                     "gloo group): 0.21 s (process_group_cpu)"),
    "engine": _measured(1.86, "TrainStep around a fresh tiny drafter (deepspeed.initialize and its compiler "
                              "probes): 1.86 s (engine_build_cpu)"),
    "checkpoint": _measured(0.01, "checkpoint.save_training_state (engine, optimizer, RNG): 0.01 s "
                                  "(checkpoint_save_cpu)"),
    "drafter_save": _measured(0.01, "checkpoint.save_drafter (config.json + model.safetensors): 0.01 s "
                                    "(drafter_save_cpu)"),
    "drafter_load": _measured(0.02, "checkpoint.load_drafter: 0.02 s (drafter_load_cpu)"),
}
ONCE_PER_PROCESS = frozenset({"interpreter", "torch", "modeling", "matplotlib", "datasets", "wandb_service"})


@dataclass(frozen=True)
class FixedCosts:
    """Per stage: the fixed parts it pays (part -> count) and their seconds."""

    parts: dict[str, dict[str, int]]
    seconds: dict[str, float]
    terms: dict[str, Term]


def checkpoint_saves(steps: int, every: int) -> int:
    """Training checkpoints written: every `every` optimizer steps and at the last one."""
    return -(-steps // every)


def stage_needs(recipe: ResolvedRecipe, stage: str, steps: int) -> dict[str, int]:
    """The fixed parts one stage does (its code's imports, loads and writes), before the process model."""
    st = recipe.stages
    needs: dict[str, int] = {}
    if stage == "generate" and st.generate.backend == "transformers":
        needs = {"torch": 1, "modeling": 1, "tokenizer": 1, "target_load": 1}
    elif stage == "qc":  # loading a tokenizer (AutoTokenizer) imports torch
        needs = {"torch": 1, "matplotlib": 1, "tokenizer": 1}
    elif stage == "tokenize":
        needs = {"torch": 1, "datasets": 1, "tokenizer": 1}
    elif stage == "train":
        needs = {"torch": 1, "modeling": 1, "datasets": 1, "process_group": 1, "target_load": 1, "tokenizer": 1,
                 "engine": 1, "checkpoint": checkpoint_saves(steps, st.train.checkpoint_every), "drafter_save": 1}
    elif stage == "eval":
        needs = {"torch": 1, "modeling": 1, "matplotlib": 1, "target_load": 1, "tokenizer": 1,
                 "drafter_load": 1 + len(st.eval.baselines)}
    elif stage == "export":
        needs = {"torch": 1, "drafter_load": 1, "drafter_save": 1}
    if recipe.tracking.mode != "disabled":  # every stage runs inside its own W&B run
        needs |= {"wandb_service": 1, "wandb_run": 1}
    return needs


def fixed_costs(recipe: ResolvedRecipe, steps: int) -> FixedCosts:
    """Walk the enabled stages in order: a once-per-process part is paid by the first stage needing it
    in the `dflashx run` process; a train stage of several ranks pays its own in fresh processes."""
    imported: set[str] = {"interpreter"}  # the dflashx run process is running
    parts: dict[str, dict[str, int]] = {}
    for stage in STAGE_ORDER:
        if not getattr(recipe.stages, stage).enabled:
            continue
        needs = stage_needs(recipe, stage, steps)
        if stage == "train" and recipe.stages.train.world_size > 1:
            needs = {"interpreter": 1, **needs}  # each rank: a fresh process, in parallel with the others
            parts[stage] = needs
            continue
        parts[stage] = {p: n for p, n in needs.items() if p not in ONCE_PER_PROCESS or p not in imported}
        imported |= needs.keys() & ONCE_PER_PROCESS
    seconds = {s: sum(PARTS[p].value * n for p, n in ps.items()) for s, ps in parts.items()}
    terms = {s: term(f"{s}.fixed_seconds", seconds[s], "s",
                     "sum of the stage's fixed parts x count (imports once per process, loads, set-up, writes, "
                     "its W&B run), each measured in isolation",
                     **{p: f"{n} x {PARTS[p].value:.3f} s ({PARTS[p].figure})" for p, n in parts[s].items()},
                     source=f"{_SOURCE}; {_WHERE}")
             for s in parts}
    return FixedCosts(parts, seconds, terms)
