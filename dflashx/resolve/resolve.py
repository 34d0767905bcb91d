"""`resolve(recipe, facts) -> ResolvedRecipe`: every derived value, computed once (pure).

What it fills in, and from what:
  drafter      target_layer_ids (spread over the target's layers unless given), mask_token_id
               (the recipe's, else the target's), layer_types (all full attention unless given),
               the shapes the drafter shares with the target (hidden, heads, head_dim, vocab) and
               its FFN width (the target's unless given; `TargetFacts.dense_ffn_width`: a drafter
               is dense, for an MoE target as wide as the FFN a token runs through);
  train        micro_batch and zero_stage (the recipe's, else `default_micro_batch` and
               `default_zero_stage` below; with the target sharded, the largest micro batch that
               fits), target_sharding (`dflashx.resolve.sharding`), world_size (one process per GPU; `gpus_per_node`
               processes on a CPU profile, at least 1),
               grad_accum = ceil(global_batch / (micro_batch x world)), loss_gamma, max_length
               (tokenize.max_length unless given), precision (bf16 on GPUs unless the target is
               fp32), peak FLOP/s, compile and loss_kernel (`auto`: compiled and liger on GPUs,
               eager and torch on CPU; torch for D-PACE), muon_lr (lr x MUON_LR_FACTOR unless
               given), the DeepSpeed config and the launch argv, target_sharding (`shard_target`,
               `auto`: when the target's weights exceed one GPU) and the ZeRO-3 config that shards it,
               the held-out τ slice (`dflashx.resolve.tau.tau_slice`; `tau_every` itself, when unset,
               is planned from the train-time estimate: the plan's `stage("train").tau_every`);
  target       facts, load_precision (fp32 on a CPU profile for a bf16/fp16 target);
  generate     context_length and the serving settings (tp, dp, dp_mode, weight dtype, checkpoint,
               online quantization, the MTP acceptance profile): `dflashx.resolve.serving`, one function each;
  eval         each suite's definition (built-in names filled in) and count, the sampled runs at
               deploy.temperature and the decodes the stage runs at most: `dflashx.resolve.suites`;
  deploy       the drafter's expected tau and acceptance profile before training
               (`dflashx.resolve.speculative`).
Inconsistent values (layer ids out of range, a batch that does not divide) are resolved as
given and reported by the plan's rules; only a value that cannot be decided at all raises
`ResolveError` (it names the key and the fix).
"""

from __future__ import annotations

import math
from typing import Literal

from dflashx.config.fields import Precision
from dflashx.config.problem import describe
from dflashx.config.schema import GenerateStage, HardwareProfile, Recipe, TargetSpec, TrainStage
from dflashx.resolve.deepspeed import deepspeed_config, launch_argv, target_shard_config
from dflashx.resolve.formulas import loss_gamma, muon_lr, spread_layer_ids, train_precision
from dflashx.resolve.model import (
    ResolvedDeploy, ResolvedDrafter, ResolvedGenerateStage, ResolvedRecipe, ResolvedStages, ResolvedTarget,
    ResolvedTrainStage,
)
from dflashx.resolve.serving import context_length, resolve_serving
from dflashx.resolve.sharding import gpu_micro_batch, target_sharding
from dflashx.resolve.speculative import expected_drafter_acceptance, expected_tau, tau_source
from dflashx.resolve.suites import resolve_eval
from dflashx.resolve.tau import tau_slice
from dflashx.targets.registry import TargetFacts


class ResolveError(ValueError):
    """A derived value that cannot be decided (a `dflashx.config.problem.Problem`); `key` is the
    recipe key to set."""

    def __init__(self, code: str, key: str, message: str, fix: str):
        self.code, self.key, self.message, self.fix = code, key, message, fix
        super().__init__(describe(self))


def world_size(hw: HardwareProfile) -> int:
    """Training processes: one per GPU; on a CPU profile `gpus_per_node` x nodes processes, at least 1."""
    return max(hw.num_gpus, 1)


# Sequences per rank per micro step when the recipe leaves stages.train.micro_batch unset. On a GPU one
# sequence is already anchors_per_seq x block_size drafter tokens (8,192 for the seeds' 512 x 16): the
# matmuls are full, and memory is the limit (the plan's `train_memory` rule says when even one does not
# fit; a recipe may raise it). On the CPU profile 2: the figure the tiny run was measured with (the
# planner's CPU MFU row and the CI's run time come from it).
GPU_MICRO_BATCH, CPU_MICRO_BATCH = 1, 2


def default_micro_batch(hw: HardwareProfile) -> int:
    return CPU_MICRO_BATCH if hw.gpu is None else GPU_MICRO_BATCH


def default_zero_stage(world: int) -> int:
    """ZeRO stage when the recipe leaves it unset: 0 for one process (nothing to partition), else 2:
    gradients and optimizer states partitioned (2 P + 18 P / N bytes per rank, against 20 P for stage 0),
    for the same all-reduce volume per micro step as plain data parallelism (Rajbhandari et al. 2020,
    sec. 7); ZeRO-3 is not run by the trainer."""
    return 0 if world == 1 else 2


def loss_kernel(train: TrainStage, on_gpu: bool) -> str:
    """`auto`: liger-kernel's fused loss on GPUs when the objective is `decay_ce` (liger reduces with one
    weight per call; D-PACE's weights are per token), the torch fused loss otherwise."""
    if train.loss_kernel != "auto":
        return train.loss_kernel
    return "liger" if on_gpu and train.loss == "decay_ce" else "torch"


def _drafter(recipe: Recipe, facts: TargetFacts) -> ResolvedDrafter:
    d = recipe.drafter
    mask = d.mask_token_id if d.mask_token_id is not None else facts.mask_token_id
    if mask is None:
        raise ResolveError("mask_token_unknown", "drafter.mask_token_id",
                           f"no mask token id: the recipe leaves it null and {facts.name} offers none "
                           "(no registered id, no `<|mask|>` token in its tokenizer)",
                           "set drafter.mask_token_id to an unused token id of the target's vocabulary")
    ids = list(d.target_layer_ids) if d.target_layer_ids else spread_layer_ids(facts.num_layers, d.num_target_layers)
    return ResolvedDrafter(**{
        **d.model_dump(),
        "target_layer_ids": ids,
        "mask_token_id": mask,
        "layer_types": list(d.layer_types) if d.layer_types else ["full_attention"] * d.num_layers,
        "intermediate_size": d.intermediate_size or facts.dense_ffn_width,
        "hidden_size": facts.hidden_size,
        "num_attention_heads": facts.num_attention_heads,
        "num_key_value_heads": facts.num_kv_heads,
        "head_dim": facts.head_dim,
        "vocab_size": facts.vocab_size,
    })


def _train(recipe: Recipe, facts: TargetFacts, drafter: ResolvedDrafter, load_precision: str) -> ResolvedTrainStage:
    train, hw = recipe.stages.train, recipe.hardware
    world = world_size(hw)
    micro = train.micro_batch or default_micro_batch(hw)
    zero = train.zero_stage if train.zero_stage is not None else default_zero_stage(world)
    sharding = target_sharding(recipe, facts, drafter.dims, load_precision, world, zero, micro)
    if hw.gpu is not None and train.micro_batch is None:
        micro = gpu_micro_batch(recipe, facts, drafter.dims, load_precision, world, zero, sharding)
    accum = max(1, math.ceil(train.global_batch / (micro * world)))
    on_gpu = hw.gpu is not None
    precision = train_precision(on_gpu, recipe.target.precision)
    bf16 = precision == "bf16"
    peak = hw.peak_flops
    prompts, new_tokens = tau_slice(recipe)
    return ResolvedTrainStage(**{
        **train.model_dump(include=set(TrainStage.model_fields)),
        "micro_batch": micro,
        "zero_stage": zero,
        "loss_gamma": train.loss_gamma or loss_gamma(drafter.block_size),
        "max_length": train.max_length or recipe.stages.tokenize.max_length,
        "world_size": world,
        "target_sharding": sharding,
        "target_deepspeed_config": target_shard_config(hw, world, micro,
                                                       load_precision) if sharding == "zero3" else None,
        "grad_accum": accum,
        "precision": precision,
        "peak_flops": peak,
        "compile": compile_mode(train.compile, on_gpu),
        "loss_kernel": loss_kernel(train, on_gpu),
        "muon_lr": muon_lr(train.lr, train.muon_lr) if train.optimizer == "muon" else None,
        "deepspeed_config": deepspeed_config(train, micro, accum, zero, world, bf16, on_gpu),
        "launch_argv": launch_argv(hw, world),
        "tau_prompts": prompts,
        "tau_max_new_tokens": new_tokens,
    })


def compile_mode(compile: bool | Literal["auto"], on_gpu: bool) -> Literal["on", "off", "when_it_pays"]:
    """`stages.train.compile` resolved: `auto` compiles on a GPU when it pays (decided by the train stage)."""
    if compile == "auto":
        return "when_it_pays" if on_gpu else "off"
    return "on" if compile else "off"


def load_precision(precision: Precision, on_gpu: bool) -> Precision:
    """What every stage that runs the target in-process (transformers generation, training, evaluation)
    loads it in: `target.precision`, but fp32 for a 16-bit target on a CPU profile."""
    return "fp32" if not on_gpu and precision in ("bf16", "fp16") else precision


def _target(recipe: Recipe, facts: TargetFacts) -> ResolvedTarget:
    t = recipe.target
    return ResolvedTarget(**t.model_dump(include=set(TargetSpec.model_fields)), facts=facts,
                          load_precision=load_precision(t.precision, recipe.hardware.gpu is not None))


def _generate(recipe: Recipe, facts: TargetFacts) -> ResolvedGenerateStage:
    gen = recipe.stages.generate
    return ResolvedGenerateStage(**{
        **gen.model_dump(include=set(GenerateStage.model_fields) - {"serving"}),
        "context_length": context_length(recipe, facts),
        "serving": resolve_serving(recipe, facts),
    })


def _deploy(recipe: Recipe) -> ResolvedDeploy:
    return ResolvedDeploy(**{**recipe.deploy.model_dump(), "expected_tau": expected_tau(recipe),
                             "acceptance": expected_drafter_acceptance(recipe), "tau_source": tau_source(recipe)})


def resolve(recipe: Recipe, facts: TargetFacts) -> ResolvedRecipe:
    """The recipe with every derived value filled in (see the module docstring)."""
    drafter, target = _drafter(recipe, facts), _target(recipe, facts)
    stages = ResolvedStages(**{**dict(recipe.stages), "train": _train(recipe, facts, drafter, target.load_precision),
                               "generate": _generate(recipe, facts),
                               "eval": resolve_eval(recipe.stages.eval, recipe.deploy)})
    return ResolvedRecipe(**{**dict(recipe), "target": target, "drafter": drafter, "stages": stages,
                             "deploy": _deploy(recipe)})
