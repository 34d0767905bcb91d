"""Cross-field rules: each a small function of the plan context returning its findings.

Rules run on a context whose estimates are already computed; they never change it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import pairwise

from dflashx.config.schema import STAGE_ORDER
from dflashx.plan.context import PlanContext, stage_estimates, totals
from dflashx.plan.expand.servers import ENGINES
from dflashx.plan.explain import human_bytes
from dflashx.plan.findings import Finding, acknowledged, error, warning
from dflashx.plan.rules_data import DATA_RULES
from dflashx.plan.rules_drafter import DRAFTER_RULES
from dflashx.plan.rules_hardware import HARDWARE_RULES
from dflashx.plan.rules_serving import SERVING_RULES
from dflashx.plan.rules_training import TRAINING_RULES
from dflashx.resolve.formulas import spread_layer_ids

Rule = Callable[[PlanContext], Iterable[Finding]]

BIG_TARGET_PARAMS = 4e9  # above this, transformers' generate() is too slow for a dataset


def training_fits(ctx: PlanContext) -> Iterable[Finding]:
    hw = ctx.recipe.hardware
    if hw.gpu is None or not ctx.recipe.stages.train.enabled:
        return
    need, have = ctx.memory["train"].bytes, hw.gpu.memory_gb * 1e9
    if need > have:
        yield error("train_memory", "stages.train.micro_batch",
                    f"training needs about {human_bytes(need)} per GPU ({_parts(ctx.memory['train'].parts)}) "
                    f"but {hw.gpu.name} has {human_bytes(have)}", train_memory_fix(ctx))


def train_memory_fix(ctx: PlanContext) -> str:
    """The knobs that lower this recipe's training memory, the ones that would change nothing left out."""
    train = ctx.recipe.stages.train
    knobs = [_sharding_fix(ctx)] if _sharding_fix(ctx) else []
    if train.micro_batch > 1:
        knobs.append("lower stages.train.micro_batch")
    if train.master_weights == "fp32" and train.precision == "bf16":
        knobs.append("set stages.train.master_weights: bf16" + (" with stages.train.zero_stage 1 or 2"
                                                                 if train.zero_stage == 0 else ""))
    if train.world_size > 1 and train.zero_stage < 2:
        knobs.append("raise stages.train.zero_stage")
    knobs.append("shorten stages.train.anchors_per_seq or stages.train.max_length")
    return ", ".join(knobs) + ", or use a profile with more GPU memory"


def _sharding_fix(ctx: PlanContext) -> str:
    """With the target held whole: shard it over the node, or, where one GPU cannot even hold it, get GPUs
    to shard over ("" when sharding would not help)."""
    train, gpu = ctx.recipe.stages.train, ctx.recipe.hardware.gpu
    if train.mode != "online" or train.target_sharding == "zero3" or gpu is None:
        return ""
    if train.world_size > 1:
        return "shard the target over the node's GPUs (stages.train.shard_target: always, or auto)"
    if ctx.memory["train"].parts["target_weights"] >= gpu.memory_gb * 1e9:
        return "shard the target over several GPUs (a profile with more GPUs, stages.train.shard_target: auto)"
    return ""


def _parts(parts: dict[str, float]) -> str:
    return ", ".join(f"{k} {human_bytes(v)}" for k, v in parts.items())


def master_weights_need_zero(ctx: PlanContext) -> Iterable[Finding]:
    train = ctx.recipe.stages.train
    if train.master_weights == "bf16" and train.precision == "bf16" and train.zero_stage == 0:
        yield error("master_weights_zero", "stages.train.master_weights",
                    "bf16 master weights need a ZeRO optimizer (DeepSpeed keeps them only with ZeRO 1 or 2), "
                    "but stages.train resolves ZeRO stage 0",
                    "set stages.train.zero_stage to 1 or 2, or stages.train.master_weights to fp32")


def target_layer_ids_valid(ctx: PlanContext) -> Iterable[Finding]:
    ids, n = ctx.recipe.drafter.target_layer_ids, ctx.facts.num_layers
    k = ctx.recipe.drafter.num_target_layers
    spread = ids == spread_layer_ids(n, k)  # resolved from num_target_layers, not given as ids
    key = "drafter.num_target_layers" if spread else "drafter.target_layer_ids"
    if len(ids) != k:
        yield error("target_layers_count", key, f"{len(ids)} target layer ids given but num_target_layers is {k}",
                    "make drafter.num_target_layers equal the number of drafter.target_layer_ids")
    outside = [i for i in ids if not 0 <= i < n]
    if outside:
        yield error("target_layers_range", key,
                    f"target layer ids {outside} are outside the target's layers 0..{n - 1}",
                    f"use ids between 0 and {n - 1}, or lower drafter.num_target_layers (at most {n})")
    if any(b <= a for a, b in pairwise(ids)):
        yield error("target_layers_order", key, f"target layer ids {ids} are not strictly increasing",
                    "list distinct ids in increasing order, or drop drafter.target_layer_ids to spread them")


def sliding_window_coherent(ctx: PlanContext) -> Iterable[Finding]:
    d = ctx.recipe.drafter
    types = d.layer_types or []
    if types and len(types) != d.num_layers:
        yield error("layer_types_length", "drafter.layer_types",
                    f"{len(types)} layer types for {d.num_layers} drafter layers",
                    "give one entry per drafter layer, or drop drafter.layer_types (all full attention)")
    sliding = "sliding_attention" in types
    if sliding and d.sliding_window is None:
        yield error("sliding_window_missing", "drafter.sliding_window",
                    "drafter.layer_types has sliding_attention layers but no sliding_window",
                    "set drafter.sliding_window (e.g. 2048)")
    if d.sliding_window is not None and not sliding:
        yield warning("sliding_window_unused", "drafter.sliding_window",
                      "drafter.sliding_window is set but no drafter layer uses sliding_attention",
                      "add sliding_attention to drafter.layer_types, or drop drafter.sliding_window")
    if sliding and d.sliding_window is not None and d.sliding_window < d.block_size:
        yield error("sliding_window_small", "drafter.sliding_window",
                    f"sliding window {d.sliding_window} is shorter than the block ({d.block_size})",
                    f"set drafter.sliding_window >= drafter.block_size ({d.block_size})")


def mask_token_known(ctx: PlanContext) -> Iterable[Finding]:
    mask = ctx.recipe.drafter.mask_token_id
    if not 0 <= mask < ctx.facts.vocab_size:
        yield error("mask_token_range", "drafter.mask_token_id",
                    f"mask token id {mask} is outside the vocabulary (0..{ctx.facts.vocab_size - 1})",
                    "use an unused token id below the target's vocab_size")
    elif mask in ctx.facts.template_token_ids:
        yield error("mask_token_special", "drafter.mask_token_id",
                    f"mask token id {mask} is a special token the chat template writes "
                    f"(template tokens {ctx.facts.template_token_ids}): the drafter could not tell a mask from it",
                    "use an unused embedding row (e.g. the tokenizer's <|mask|>), not a template token")


def offline_within_storage(ctx: PlanContext) -> Iterable[Finding]:
    limit = ctx.recipe.budget.max_storage_bytes
    hidden = ctx.storage.offline_hidden_states
    if ctx.recipe.stages.train.mode == "offline" and limit is not None and hidden > limit:
        yield error("offline_over_budget", "stages.train.mode",
                    f"offline hidden states need {human_bytes(hidden)} "
                    f"({len(ctx.recipe.drafter.target_layer_ids)} layers "
                    f"x hidden {ctx.facts.hidden_size} x {ctx.tokens.train_tokens_per_epoch:.3g} tokens, bf16), "
                    f"over budget.max_storage_bytes {human_bytes(limit)}",
                    "set stages.train.mode=online (hidden states are recomputed each step, nothing stored)")


def within_budget(ctx: PlanContext) -> Iterable[Finding]:
    b = ctx.recipe.budget
    t = totals([stage_estimates(ctx, s) for s in STAGE_ORDER])
    hw = ctx.recipe.hardware.name
    if b.max_usd is not None and t.usd > b.max_usd:
        yield error("budget_usd", "budget.max_usd", f"the plan costs about ${t.usd:,.0f} on {hw}, "
                    f"over budget.max_usd ${b.max_usd:,.0f}",
                    "raise budget.max_usd, lower stages.train.epochs or the dataset size, or use a cheaper profile")
    if b.max_days is not None and t.days > b.max_days:
        yield error("budget_days", "budget.max_days", f"the plan takes about {t.days:.1f} days on {hw}, "
                    f"over budget.max_days {b.max_days:g}",
                    "raise budget.max_days, lower stages.train.epochs or the dataset size, or use a faster "
                    "profile (e.g. hardware=b200_nvl8)")
    if b.max_storage_bytes is not None and t.storage_bytes > b.max_storage_bytes:
        yield error("budget_storage", "budget.max_storage_bytes",
                    f"the run stores about {human_bytes(t.storage_bytes)}, over budget.max_storage_bytes "
                    f"{human_bytes(b.max_storage_bytes)}",
                    "raise budget.max_storage_bytes, or keep fewer checkpoints (stages.train.keep_checkpoints)")


def generate_backend_fits(ctx: PlanContext) -> Iterable[Finding]:
    gen, hw = ctx.recipe.stages.generate, ctx.recipe.hardware
    if not gen.enabled:
        return
    if gen.serving.mode == "in-process" and ctx.facts.total_params > BIG_TARGET_PARAMS:
        yield warning("transformers_big_target", "stages.generate.backend",
                      f"transformers generate() on a {ctx.facts.total_params / 1e9:.0f}B target is far slower "
                      "than a serving engine", "set stages.generate.backend=sglang")
    if gen.serving.mode == "spawn" and hw.gpu is None and not ENGINES[gen.backend].runs_on_cpu:
        yield error("sglang_needs_gpu", "stages.generate.backend",
                    f"SGLang servers need GPUs; profile {hw.name} has none",
                    "set stages.generate.backend=vllm (its CPU build: README) or transformers, or give "
                    "stages.generate.urls of running servers")
    if gen.serving.drafter and ctx.recipe.target.mtp:
        yield error("two_generation_drafters", "stages.generate.serving.drafter",
                    "the servers would draft with both the target's MTP head (target.mtp) and a DFlash drafter",
                    "keep one: unset stages.generate.serving.drafter or set target.mtp: false")
    native = ctx.facts.max_position_embeddings
    needed = ctx.tokens.prompt_mean + gen.max_tokens
    if gen.context_length > native:
        yield error("context_too_long", "stages.generate.context_length",
                    f"context length {gen.context_length} exceeds the target's {native}",
                    f"set stages.generate.context_length <= {native}")
    elif needed > gen.context_length:
        yield error("context_too_long", "stages.generate.max_tokens",
                    f"a mean prompt ({ctx.tokens.prompt_mean:g} tokens) + max_tokens {gen.max_tokens} does not fit "
                    f"the context length {gen.context_length} (target native {native})",
                    "lower stages.generate.max_tokens (or raise stages.generate.context_length up to the native)")


def servers_local(ctx: PlanContext) -> Iterable[Finding]:
    gen, hw = ctx.recipe.stages.generate, ctx.recipe.hardware
    if gen.enabled and gen.serving.mode == "spawn" and hw.nodes > 1:
        yield warning("servers_on_other_nodes", "stages.generate.urls",
                      f"generation spans {hw.nodes} nodes: each node starts only its own SGLang servers (the plan's "
                      "commands marked [on node-i]) and node 0 sends the prompts to all of them",
                      "on node i run `dflashx run RECIPE --until generate --skip-pilot --node-rank i` "
                      "(docs/running.md); node 0 reaches node i at DFLASHX_NODE_HOSTS's i-th address, else at the "
                      "name node-<i>; "
                      "or start servers yourself and give their URLs in stages.generate.urls")


def mtp_available(ctx: PlanContext) -> Iterable[Finding]:
    if ctx.recipe.target.mtp and not ctx.facts.mtp_layers:
        yield warning("mtp_unavailable", "target.mtp", f"{ctx.facts.name} ships no MTP layer; serving without it",
                      "set target.mtp=false")


def batch_divides(ctx: PlanContext) -> Iterable[Finding]:
    d = ctx.recipe.stages.train
    gb = d.global_batch
    per_step = d.micro_batch * d.world_size
    if gb % per_step:
        yield error("global_batch", "stages.train.global_batch",
                    f"global_batch {gb} is not a multiple of micro_batch {d.micro_batch} x {d.world_size} GPUs",
                    f"set stages.train.global_batch to a multiple of {per_step} "
                    f"(e.g. {max(gb // per_step, 1) * per_step})")


RULES: tuple[Rule, ...] = (
    *SERVING_RULES, training_fits, master_weights_need_zero, target_layer_ids_valid,
    sliding_window_coherent, *DRAFTER_RULES, mask_token_known, offline_within_storage, within_budget,
    generate_backend_fits, servers_local, mtp_available, batch_divides, *DATA_RULES, *TRAINING_RULES,
    *HARDWARE_RULES,
)


def check(ctx: PlanContext) -> list[Finding]:
    """Every rule's findings, blocking ones resolved against the recipe's `acknowledge` list."""
    return acknowledged([finding for rule in RULES for finding in rule(ctx)], ctx.recipe.acknowledge)
