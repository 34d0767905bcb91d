"""Storage per artifact, in bytes. Offline hidden states = tokens x layers x hidden x bytes."""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES as BYTES
from dflashx.plan.estimates.fixed import checkpoint_saves
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.estimates.training import Training
from dflashx.plan.explain import Term, term
from dflashx.resolve.model import ResolvedRecipe

JSON_OVERHEAD_BYTES = 512  # keys, usage, ids of one completion record
ARROW_BYTES_PER_TOKEN = 5  # int32 input_ids + int8 loss mask
ARROW_ROW_OVERHEAD = 16  # list offsets
REPORT_BYTES = 20e6  # QC / eval reports with plots
# One saved DeepSpeed training state per trainable parameter: bf16 weights (2) + fp32 master weights,
# Adam m and v (4 + 4 + 4), as ZeRO counts mixed-precision Adam states (Rajbhandari et al. 2020, sec. 3.1).
STATE_BYTES_PER_PARAM = 14


@dataclass(frozen=True)
class Storage:
    by_artifact: dict[str, float]  # "<stage>.<artifact>" -> bytes
    offline_hidden_states: float  # what mode=offline would write (also reported in online mode)
    terms: tuple[Term, ...]

    def for_stage(self, stage: str) -> float:
        return sum(v for k, v in self.by_artifact.items() if k.startswith(stage + "."))

    @property
    def total(self) -> float:
        return sum(self.by_artifact.values())


def estimate_storage(recipe: ResolvedRecipe, tokens: Tokens, tr: Training) -> Storage:
    facts, layers = recipe.target.facts, len(recipe.drafter.target_layer_ids)
    stats, train = recipe.dataset.stats, recipe.stages.train
    params = tr.drafter.trainable
    train_tokens = tokens.train_tokens_per_epoch
    hidden = train_tokens * layers * facts.hidden_size * 2
    n_ckpt = checkpoint_saves(tr.steps, train.checkpoint_every)
    kept = n_ckpt if train.keep_checkpoints is None else min(n_ckpt, train.keep_checkpoints + 1)  # K newest + best
    checkpoints = kept * STATE_BYTES_PER_PARAM * params
    sizes = {
        "ingest.prompts": tokens.raw_prompts * stats.prompt_bytes_mean,
        "generate.completions": tokens.samples * (
            stats.prompt_bytes_mean + tokens.output_mean * stats.output_bytes_per_token + JSON_OVERHEAD_BYTES),
        "qc.report": REPORT_BYTES,
        "tokenize.dataset": tokens.samples * (tokens.train_len_mean * ARROW_BYTES_PER_TOKEN + ARROW_ROW_OVERHEAD),
        "train.checkpoint": checkpoints,
        "eval.report": REPORT_BYTES,
        "export.drafter": params * BYTES[recipe.stages.export.dtype],
    }
    if train.mode == "offline":
        sizes["train.hidden_states"] = hidden
    enabled = {name for name, stage in recipe.stages if stage.enabled}
    sizes = {k: v for k, v in sizes.items() if k.split(".")[0] in enabled}
    terms = (
        term("storage.offline_hidden_states", hidden, "bytes", "train tokens x k target layers x hidden x 2 (bf16)",
             train_tokens=train_tokens, layers=layers, hidden=facts.hidden_size,
             written=train.mode == "offline"),
        term("storage.checkpoints", checkpoints, "bytes",
             "kept checkpoints x 14 bytes x drafter params (each a full training state: bf16 weights + fp32 "
             "master weights and two Adam moments); kept = min(checkpoints, keep_checkpoints + 1) (the K newest "
             "+ the best), all when keep_checkpoints is null",
             checkpoints=n_ckpt, keep_checkpoints=train.keep_checkpoints, kept=kept, params=params),
        term("storage.completions", tokens.samples * (stats.prompt_bytes_mean + tokens.output_mean
                                                      * stats.output_bytes_per_token + JSON_OVERHEAD_BYTES),
             "bytes", "samples x (prompt bytes + output tokens x bytes/token + JSON overhead)"),
        Term("storage.total", sum(sizes.values()), "bytes", "sum over enabled stages' artifacts", dict(sizes)),
    )
    return Storage(sizes, hidden, terms)
