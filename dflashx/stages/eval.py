"""The eval stage: real speculative decoding of held-out prompts with the trained drafter.

Reads `train.checkpoint` and the held-out prompts (`stages.eval.prompts` when set, else
`ingest.eval_prompts`); decodes the first `stages.eval.num_prompts` of them with the target and the
drafter (`dflashx.dflash.spec_decode`, greedy at temperature 0, rejection sampling above), and
again with an UNTRAINED drafter of the same config (seeded init) as the baseline. Writes `report`:
eval.json (tau, acceptance per draft position, accepted-length histogram, tokens/s, per prompt tau,
and the same tau / acceptance per prompt `source` (`by_source`, missing source = "unknown") and per
prompt-length bucket (`by_context`), for both drafters) and acceptance.png. In greedy mode both
runs must produce the target's own greedy output, so `greedy_agreement` (share of prompts whose two
outputs are identical) should be 1.0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflashx.config.fields import TORCH_DTYPE
from dflashx.data import chat_contract
from dflashx.data.chat_mask import render_prompt
from dflashx.data.jsonl import iter_numbered
from dflashx.stages import eval_speedup
from dflashx.stages.base import Artifact, StageContext, StageFailed, StageResult
from dflashx.stages.graph import GRAPH
from dflashx.store.atomic import atomic_write_json

CHECKPOINT = GRAPH["eval"].inputs[0]
PROMPTS = GRAPH["eval"].optional_inputs[0]
UNTRAINED_SEED = 0


def _prompts_file(ctx: StageContext) -> Path:
    if ctx.config.prompts:
        return Path(ctx.config.prompts)
    if PROMPTS in ctx.inputs:
        return ctx.inputs[PROMPTS]
    raise ValueError(
        "eval stage has no prompts: set stages.eval.prompts (a JSONL of {id, messages}) or keep "
        "dataset.eval_holdout > 0 so the ingest stage writes eval_prompts.jsonl"
    )


def load_prompts(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first `limit` prompt records of a JSONL file, each checked for `messages`."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: eval prompts file not found (stages.eval.prompts)")
    out = []
    for line_no, record in iter_numbered(path):
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            raise ValueError(  # noqa: TRY004 - bad file content, not a bad argument type
                f"{path}:{line_no}: key `messages` missing; expected {{\"id\", \"messages\": [...]}}"
            )
        out.append(record)
        if len(out) == limit:
            break
    if not out:
        raise ValueError(f"{path}: no prompts; the eval stage needs at least one")
    return out


def stop_ids(tokenizer: Any, generation_config: Any) -> list[int]:
    """End-of-sequence ids of the tokenizer and the generation config, and `<|im_end|>` if known."""
    ids = {tokenizer.eos_token_id}
    eos = getattr(generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if isinstance(i, int))


def _load(ctx: StageContext):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflashx.dflash.checkpoint import load_drafter
    from dflashx.targets.resolve import resolve_target_path, resolve_tokenizer_path

    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = ctx.recipe.target.load_precision
    target = AutoModelForCausalLM.from_pretrained(str(resolve_target_path(ctx.recipe.target)),
                                                  dtype=getattr(torch, TORCH_DTYPE[precision]))
    if precision == "fp8":  # as served: every decoder layer's linears in FP8
        from dflashx.dflash.fp8 import target_to_fp8

        target_to_fp8(target, torch.device(device))
    target = target.to(device).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_tokenizer_path(ctx.recipe.target)))
    if CHECKPOINT not in ctx.inputs:
        raise ValueError(f"eval stage needs input `{CHECKPOINT}` (the train stage's drafter); enable stages.train")
    drafter = load_drafter(ctx.inputs[CHECKPOINT], device=device)
    text = target.config.get_text_config()
    have = (drafter.config.hidden_size, drafter.config.vocab_size, drafter.config.num_target_layers)
    want = (text.hidden_size, text.vocab_size, text.num_hidden_layers)
    if have != want:
        raise ValueError(
            f"{ctx.inputs[CHECKPOINT]}: drafter (hidden, vocab, target layers) {have} does not fit target "
            f"{ctx.recipe.target.model} {want}; evaluate it against the target it was trained for"
        )
    return target, tokenizer, drafter


def _untrained_like(drafter: Any) -> Any:
    import torch

    from dflashx.dflash.model import DFlashDrafter

    torch.manual_seed(UNTRAINED_SEED)
    return DFlashDrafter(drafter.config).to(drafter.fc.weight.device).eval()


def _encode(tokenizer: Any, prompt: dict[str, Any], chat: Any) -> list[int]:
    return tokenizer(render_prompt(tokenizer, prompt, chat), add_special_tokens=False)["input_ids"]


def _decode_all(ctx: StageContext, decoder: Any, encoded: list[list[int]], stops: list[int], label: str, seed: int):
    import torch

    cfg = ctx.config
    gen = torch.Generator(device=decoder.device).manual_seed(seed)
    results = []
    for i, ids in enumerate(encoded):
        result = decoder.generate(ids, cfg.max_new_tokens, cfg.temperature, stops, generator=gen)
        results.append(result)
        ctx.log({f"eval/{label}_tau": result.tau, f"eval/{label}_prompt": i})
    return results


def prompt_source(prompt: dict[str, Any]) -> str:
    """The source a prompt record names (ingest writes it), "unknown" when it names none."""
    from dflashx.dflash.acceptance import UNKNOWN_SOURCE

    return str(prompt.get("source") or UNKNOWN_SOURCE)


def _summary(results: list[Any], block: int, sources: list[str], buckets: list[str]) -> dict[str, Any]:
    """One drafter's eval.json entry: overall, per source and per context bucket, same definitions."""
    from dflashx.dflash.acceptance import CONTEXT_BUCKET_LABELS, summarize, summarize_groups

    return summarize(results, block) | {
        "per_prompt_tau": [r.tau for r in results],
        "by_source": summarize_groups(results, sources, block),
        "by_context": summarize_groups(results, buckets, block, order=CONTEXT_BUCKET_LABELS),
    }


def evaluate(ctx: StageContext, target: Any, tokenizer: Any, drafter: Any) -> dict[str, Any]:
    """Decode the prompts with the trained and an untrained drafter; the eval.json content."""
    from dflashx.dflash.acceptance import context_bucket
    from dflashx.dflash.spec_decode import SpecDecoder

    prompts = load_prompts(_prompts_file(ctx), ctx.config.num_prompts)
    encoded = [_encode(tokenizer, p, ctx.recipe.target.chat_template) for p in prompts]
    sources = [prompt_source(p) for p in prompts]
    buckets = [context_bucket(len(ids)) for ids in encoded]
    stops = stop_ids(tokenizer, getattr(target, "generation_config", None))
    block = drafter.config.block_size
    runs = {}
    for label, model in (("trained", drafter), ("untrained", _untrained_like(drafter))):
        runs[label] = _decode_all(ctx, SpecDecoder(target, model), encoded, stops, label, seed=0)
    trained, untrained = runs["trained"], runs["untrained"]
    same = sum(a.output_ids == b.output_ids for a, b in zip(trained, untrained)) / len(prompts)
    return {
        "block_size": block,
        "temperature": ctx.config.temperature,
        "max_new_tokens": ctx.config.max_new_tokens,
        "prompts": len(prompts),
        "trained": _summary(trained, block, sources, buckets),
        "untrained": _summary(untrained, block, sources, buckets),
        "greedy_agreement": same if ctx.config.temperature == 0 else None,
        "prompt_ids": [p.get("id") for p in prompts],
        "prompt_sources": sources,
        "prompt_tokens": [len(ids) for ids in encoded],
    }


def run(ctx: StageContext) -> StageResult:
    from dflashx.dflash.acceptance import plot_acceptance

    report = ctx.out_dir / "report"
    report.mkdir(parents=True, exist_ok=True)
    target, tokenizer, drafter = _load(ctx)
    chat = ctx.recipe.target.chat_template
    contract = chat_contract.ChatContract.for_tokenizer(tokenizer, chat.enable_thinking, chat.kwargs)
    try:  # evaluate with the template and thinking mode the drafter was trained for
        chat_contract.check(contract, ctx.inputs[CHECKPOINT], CHECKPOINT)
    except chat_contract.ContractMismatch as e:
        raise StageFailed(str(e)) from None
    result = evaluate(ctx, target, tokenizer, drafter) | {"chat_contract": contract.to_json()}
    result |= eval_speedup.section(ctx.recipe, result, report)  # tokens/s with the drafter where it is served
    atomic_write_json(report / "eval.json", result)
    plot_acceptance({"trained": result["trained"], "untrained": result["untrained"]}, report / "acceptance.png")
    t, u = result["trained"], result["untrained"]
    metrics = {
        "tau": t["tau"],
        "tau_untrained": u["tau"],
        "acceptance_by_position": t["acceptance_by_position"],
        "tokens_per_s": t["tokens_per_s"],
        "tokens_per_s_untrained": u["tokens_per_s"],
        "tau_by_source": {k: v["tau"] for k, v in t["by_source"].items()},
        "tau_by_context": {k: v["tau"] for k, v in t["by_context"].items()},
        **eval_speedup.metrics(result),
    }
    if result["greedy_agreement"] is not None:
        metrics["greedy_agreement"] = result["greedy_agreement"]
    return StageResult(
        artifacts={"report": Artifact("report", tier="replaceable", description="eval.json + acceptance.png")},
        metrics=metrics,
    )
