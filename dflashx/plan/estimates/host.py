"""Wall time of the stages bound by the host (CPU, disk, network) and of evaluation.

Throughputs are conservative assumptions for one node, listed in docs/planner.md.
"""

from __future__ import annotations

from dflashx.config.schema import Recipe
from dflashx.plan.estimates.device import device_of
from dflashx.plan.estimates.generation import Serving
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.explain import Term, term
from dflashx.resolve.model import ResolvedRecipe

INGEST_PROMPTS_PER_S = 5_000  # read, normalise, dedupe (includes a datasets download amortised)
QC_SAMPLES_PER_S = 2_000  # per-sample checks + report plots
TOKENIZE_TOKENS_PER_S_PER_PROC = 200_000  # chat template + fast tokenizer
EXPORT_BYTES_PER_S = 500e6
BACKUP_BYTES_PER_S = 200e6  # multipart upload to S3 from one node
EVAL_BANDWIDTH_EFFICIENCY = 0.5  # batch-1 decode reaches about half the memory bandwidth


def host_seconds(recipe: Recipe, tokens: Tokens, storage_total: float, export_bytes: float) -> dict[str, Term]:
    num_proc = recipe.stages.tokenize.num_proc
    return {
        "ingest": term("ingest.seconds", tokens.raw_prompts / INGEST_PROMPTS_PER_S, "s",
                       "raw prompts / prompts per second", rate=INGEST_PROMPTS_PER_S),
        "qc": term("qc.seconds", tokens.samples / QC_SAMPLES_PER_S, "s", "samples / samples per second",
                   rate=QC_SAMPLES_PER_S),
        "tokenize": term("tokenize.seconds", tokens.total / (TOKENIZE_TOKENS_PER_S_PER_PROC * num_proc), "s",
                         "all tokens / (tokens per second per process x num_proc)",
                         rate=TOKENIZE_TOKENS_PER_S_PER_PROC, num_proc=num_proc),
        "export": term("export.seconds", export_bytes / EXPORT_BYTES_PER_S, "s", "drafter bytes / write rate",
                       rate=EXPORT_BYTES_PER_S),
        "backup": term("backup.seconds", storage_total / BACKUP_BYTES_PER_S, "s", "run bytes / upload rate",
                       rate=BACKUP_BYTES_PER_S),
    }


def eval_seconds(recipe: ResolvedRecipe, s: Serving) -> Term:
    """Batch-1 target decode of every eval token (an upper bound: speculation only shortens it):
    each suite's prompts, once per drafter (`ResolvedEvalStage.decodes`)."""
    ev, dev = recipe.stages.eval, device_of(recipe.hardware)
    tokens = ev.decodes * ev.max_new_tokens
    per_token = s.weight_bytes / (dev.bandwidth_bps * s.tp) / EVAL_BANDWIDTH_EFFICIENCY
    return term("eval.seconds", tokens * per_token, "s",
                "prompt decodes (suites x drafters) x max_new_tokens x weights / (bandwidth x tp x batch-1 "
                "efficiency)", tokens=tokens, seconds_per_token=per_token, efficiency=EVAL_BANDWIDTH_EFFICIENCY)
