"""Storage per artifact, in bytes. Offline hidden states = tokens x layers x hidden x bytes."""

from __future__ import annotations

from dataclasses import dataclass

from dflashx.config.fields import PRECISION_BYTES as BYTES
from dflashx.plan.estimates.fixed import checkpoint_saves
from dflashx.plan.estimates.tokens import Tokens
from dflashx.plan.estimates.training import Training
from dflashx.plan.explain import Term, explained
from dflashx.plan.expr import minimum, named, total, var
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
    hidden = var("train_tokens", train_tokens) * var("layers", layers) * var("hidden", facts.hidden_size) * 2
    n_ckpt = var("checkpoints", checkpoint_saves(tr.steps, train.checkpoint_every))
    kept = named("kept", n_ckpt if train.keep_checkpoints is None  # the K newest + the best
                 else minimum(n_ckpt, var("keep_checkpoints", train.keep_checkpoints) + 1))
    checkpoints = kept * var("state_bytes_per_param", STATE_BYTES_PER_PARAM) * var("params", params)
    completions = var("samples", tokens.samples) * (
        var("prompt_bytes_mean", stats.prompt_bytes_mean) + var("output_tokens_mean", tokens.output_mean)
        * var("output_bytes_per_token", stats.output_bytes_per_token) + var("json_overhead", JSON_OVERHEAD_BYTES))
    sizes = {
        "ingest.prompts": tokens.raw_prompts * stats.prompt_bytes_mean,
        "generate.completions": completions.value,
        "qc.report": REPORT_BYTES,
        "tokenize.dataset": tokens.samples * (tokens.train_len_mean * ARROW_BYTES_PER_TOKEN + ARROW_ROW_OVERHEAD),
        "train.checkpoint": checkpoints.value,
        "eval.report": REPORT_BYTES,
        "export.drafter": params * BYTES[recipe.stages.export.dtype],
    }
    if train.mode == "offline":
        sizes["train.hidden_states"] = hidden.value
    enabled = {name for name, stage in recipe.stages if stage.enabled}
    sizes = {k: v for k, v in sizes.items() if k.split(".")[0] in enabled}
    terms = (
        explained("storage.offline_hidden_states", hidden, "bytes", "bf16 states of the k tapped target layers",
                  written=train.mode == "offline"),
        explained("storage.checkpoints", checkpoints, "bytes", "each kept checkpoint a full training state: bf16 "
                  "weights + fp32 master weights and two Adam moments; kept: the K newest + the best, all when "
                  "keep_checkpoints is null", keep_checkpoints=train.keep_checkpoints),
        explained("storage.completions", completions, "bytes"),
        explained("storage.total", total(*(var(k, v) for k, v in sizes.items())), "bytes",
                  "the enabled stages' artifacts"),
    )
    return Storage(sizes, hidden.value, terms)
