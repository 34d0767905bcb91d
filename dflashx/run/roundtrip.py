"""The export round-trip gate: before the expensive stages, does an export from this recipe decode with
its target? Mask token, tapped layers, chat template, block size and layer causality, all at once
(docs/running.md#the-export-round-trip-gate). The pilot runs it first (`pilot.roundtrip`).

  1. samples   the first `SAMPLES` prompts of the recipe's sources, rendered with the recipe's chat
               template (`render_prompt`, as generation renders them); the target's greedy reply to each
               (`dflash.overfit.greedy`); the reply as the generate stage records it (`split_think`) and as
               the tokenize stage encodes it (`ChatMasker`): check `chat template` when the encoding is not
               the prompt the engine renders followed by the tokens the target produced;
  2. overfit   the recipe's own drafter (`dflash.trainer.build_drafter`: the resolved drafter section,
               `drafter.init_from` too) trained `STEPS` steps on every anchor of those samples with the
               training objective (`dflash.overfit.overfit`); τ of the drafter in memory (`trained_tau`);
  3. export    through the export stage's code (`stages.export.write_folders`: the DFlash layout and, for
               DFlash, the speculators one) in `stages.export.dtype`;
  4. check     each folder: the engines' contracts (`stages.export.contract_violations`, check `contract`);
               loaded back with the eval stage's loader (`stages.eval_drafters.read_folder`: the layout, the
               speculators conversion, `DFlashConfig.from_hf_dict`; check `load`); every value the drafter
               was trained with against the one read back (tapped layers, mask token and its text, block
               size, layer types and causality, window: check `export`); its weights decoded with the target
               (`SpecDecoder`, greedy, each sample's prompt for as many tokens as the target produced: check
               `tau`, τ >= `TAU_FRACTION` x block size).
An overfitted drafter accepts nearly whole blocks of the replies it memorised (7.23 of 8 on the tiny recipe);
a changed mask token drops τ to about 1, a flipped causality to about 5, so the threshold sits between with
margin. Some faults τ does not show (the tapped layers one off: the overfitted tiny drafter decodes the
neighbouring layers the same): check `export` names them. A drafter that does not reach the threshold in
memory (`trained_tau`) names the overfit, not the export, as the cause.

Public API: `GateResult`, `prepare(recipe) -> Overfitted`, `export(overfitted, folder) -> [folders]`,
`check(overfitted, folder) -> GateResult`, `gate(overfitted, folder) -> GateResult` (export and check; the
exports deleted when it passes, kept when it fails), `run_gate(recipe, folder) -> GateResult`. torch is imported
only when the gate runs.
"""

from __future__ import annotations

import gc
import json
import shutil
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from dflashx.config.fields import TORCH_DTYPE
from dflashx.data.formats import FormatError, to_prompt
from dflashx.data.sources import iter_source
from dflashx.resolve.model import ResolvedRecipe
from dflashx.run.check import Check
from dflashx.stages.eval_drafters import load, read_folder
from dflashx.stages.export import OUT, VLLM_DIR, contract_violations, write_folders
from dflashx.targets.load import load_model, load_tokenizer, stop_ids
from dflashx.targets.locate import locate_target

ROUNDTRIP_DIR = "roundtrip"  # the pilot's folder for the gate's export (pilot/roundtrip/)
SAMPLES = 2  # prompts overfitted: two replies, so the drafter cannot learn one fixed sequence of tokens
STEPS = 120  # AdamW steps at LR: enough for the shipped recipes' drafters to memorise two replies
LR = 3e-3
BLOCKS = 6  # each reply: up to this many blocks of tokens (the decode then runs as many cycles)
TAU_FRACTION = 0.8  # τ must reach this fraction of the block size
# a value the drafter was trained with, its key in each layout's config.json, what breaks, the fix
_TRAINED: dict[str, tuple[str, str, str, str]] = {
    "target_layer_ids": ("dflash_config.target_layer_ids", "aux_hidden_state_layer_ids (- 1)",
                         "the drafter reads other target layers' features than it was trained on",
                         "export from the trained checkpoint unedited: drafter.target_layer_ids decides training "
                         "and export alike"),
    "mask_token_id": ("dflash_config.mask_token_id", "mask_token_id",
                      "the engine fills the block with another token than the drafter was trained with",
                      "keep the mask token the drafter was trained with (drafter.mask_token_id, default the "
                      "target tokenizer's `<|mask|>`)"),
    "block_size": ("block_size", "block_size", "the engine drafts blocks of another size",
                   "keep the trained block size (drafter.block_size)"),
    "causal_layers": ("dflash_config.causal_layers (is_causal)", "sliding_window_non_causal",
                      "a layer attends with the other causality within the block than in training",
                      "keep the trained causality: DFlash layers are bidirectional within a block, sliding layers "
                      "causal (drafter.layer_types)"),
    "layer_types": ("layer_types", "transformer_layer_config.layer_types",
                    "a layer attends over another span than in training", "keep drafter.layer_types"),
    "sliding_window": ("sliding_window", "transformer_layer_config.sliding_window",
                       "a sliding layer sees another window than in training", "keep drafter.sliding_window"),
    "num_target_layers": ("num_target_layers", "aux_hidden_state_layer_ids",
                          "the drafter is declared for another target", "train for this target"),
}


@dataclass
class Overfitted:
    """Steps 1-2 done: the target, its tokenizer, the samples and the drafter trained on them."""

    recipe: ResolvedRecipe
    target: Any
    tokenizer: Any
    drafter: Any
    samples: list[Any]
    stops: list[int]
    loss: float
    trained_tau: float
    checks: list[Check] = field(default_factory=list)  # step 1's (the chat template)
    seconds: float = 0.0


@dataclass(frozen=True)
class GateResult:
    """What the gate found: its checks (`ok` when none failed), τ per exported folder, the threshold."""

    checks: list[Check]
    tau: dict[str, float]
    trained_tau: float
    threshold: float
    block_size: int
    seconds: float

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def message(self) -> str:
        """One line when it passed; else every failed check with its key, what was measured and the fix."""
        taus = ", ".join(f"{name} {tau:.2f}" for name, tau in self.tau.items())
        head = (f"export round trip: τ {taus} (in memory {self.trained_tau:.2f}; needs >= {self.threshold:.1f} = "
                f"{TAU_FRACTION} x block size {self.block_size}), {self.seconds:.0f} s")
        if self.ok:
            return head
        failed = [c for c in self.checks if c.status == "fail"]
        lines = [f"{head}: {len(failed)} check(s) failed"]
        lines += [f"  - [{c.code}] {c.key}: {c.message}; fix: {c.fix}" for c in failed]
        return "\n".join(lines)


def _prompts(recipe: ResolvedRecipe, n: int) -> list[dict[str, Any]]:
    """The first `n` prompts of the recipe's sources, as ingest parses them."""

    out: list[dict[str, Any]] = []
    for spec in recipe.dataset.sources:
        for raw in islice(iter_source(spec), 4 * n):
            try:
                if raw.error is None:
                    out.append(to_prompt(raw.data, spec.format, spec.fields, spec.system_prompt))
            except FormatError:
                continue  # the preflight names unparsable records; the gate needs only a few good ones
            if len(out) == n:
                return out
    if not out:
        raise ValueError("dataset.sources: no prompt could be read for the export round-trip gate; fix the sources "
                         "(`dflashx preflight` names the broken one)")
    return out


def _sample(recipe: ResolvedRecipe, target: Any, tokenizer: Any, prompt: dict[str, Any], stops: list[int]):
    """One prompt's sample (module doc, step 1) and its `chat template` check, or None when it holds."""
    from dflashx.backends.base import split_think
    from dflashx.data.chat_mask import THINK_OPEN, ChatMasker, completion_messages, render_prompt
    from dflashx.dflash.overfit import Sample, greedy

    chat = recipe.target.chat_template
    text = render_prompt(tokenizer, prompt, chat)
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    reply = greedy(target, prompt_ids, BLOCKS * recipe.drafter.block_size, stops)
    decoded = tokenizer.decode(reply, skip_special_tokens=False).removesuffix(tokenizer.eos_token or "")
    reasoning, answer = split_think(decoded, opened_in_prompt=text.rstrip().endswith(THINK_OPEN))
    record = {**prompt, "reasoning": reasoning, "answer": answer}
    masker = ChatMasker(tokenizer, enable_thinking=chat.enable_thinking, template_kwargs=chat.kwargs)
    enc = masker.encode_conversations([(completion_messages(record), prompt.get("tools"))])[0]
    served = [*prompt_ids, *reply]
    at = next((i for i, (a, b) in enumerate(zip(enc.input_ids, served)) if a != b), min(len(enc.input_ids),
                                                                                       len(served)))
    sample = Sample(list(prompt_ids), list(enc.input_ids), [int(m) for m in enc.loss_mask], len(reply))
    if at >= len(served) - 1:  # the last served token may render with the template's trailing newline
        return sample, None
    where = "the prompt" if at < len(prompt_ids) else f"the reply's token {at - len(prompt_ids)}"
    shown = [tokenizer.decode(ids[at: at + 4]) for ids in (enc.input_ids, served)]
    return sample, Check("chat template", "target.chat_template", "fail",
                         f"the tokenize stage encodes the target's own reply differently from what the engine "
                         f"serves, from {where} on: trained {shown[0]!r}, served {shown[1]!r}",
                         "make target.chat_template (enable_thinking, kwargs) and target.tokenizer the ones the "
                         "target is served with")


def prepare(recipe: ResolvedRecipe) -> Overfitted:
    """Steps 1-2: the target loaded (`target.load_precision`, on the GPU when there is one), the samples,
    the recipe's drafter overfitted on them."""
    import torch

    from dflashx.dflash.job import TrainJob
    from dflashx.dflash.overfit import decode_tau, overfit
    from dflashx.dflash.trainer import build_drafter

    t0 = time.perf_counter()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    target = load_model(recipe.target, recipe.target.load_precision).to(device).requires_grad_(False)
    tokenizer = load_tokenizer(recipe.target)
    stops = stop_ids(recipe.target, tokenizer)
    made = [_sample(recipe, target, tokenizer, p, stops) for p in _prompts(recipe, SAMPLES)]
    job = TrainJob.of(recipe, "", "", "", "")  # the drafter and train sections as training reads them
    with device:
        drafter = build_drafter(job, target.config, tokenizer)
    train = recipe.stages.train
    samples = [s for s, _ in made]
    loss = overfit(drafter, target, samples, STEPS, LR, train.loss_gamma, train.selector_weight)
    trained_tau = decode_tau(target, drafter, samples, stops)
    return Overfitted(recipe, target, tokenizer, drafter, samples, stops, loss, trained_tau,
                      [c for _, c in made if c is not None], time.perf_counter() - t0)


def export(o: Overfitted, folder: Path) -> list[Path]:
    """Step 3: the export stage's folders under `folder` (`drafter/`, and `drafter-vllm/` for DFlash), written
    afresh: an earlier export's folders there are deleted first (`check` reads every folder present)."""
    import torch


    dtype = getattr(torch, TORCH_DTYPE[o.recipe.stages.export.dtype])
    for old in (OUT, VLLM_DIR):
        shutil.rmtree(folder / old, ignore_errors=True)
    vllm = write_folders(o.drafter, folder / OUT, folder / VLLM_DIR, dtype, str(locate_target(o.recipe.target)))
    return [folder / OUT] + ([vllm] if vllm is not None else [])


def _differences(o: Overfitted, name: str, read: Any, raw: dict[str, Any]) -> list[Check]:
    """Every trained value the folder's config.json gives back otherwise (check `export`)."""
    trained, out = o.drafter.config, []
    column = 1 if "speculators_model_type" in raw else 0
    for attr, (dflash_key, spec_key, what, fix) in _TRAINED.items():
        have, want = getattr(read, attr), getattr(trained, attr)
        if have != want:
            out.append(Check("export", f"{name}/config.json {(dflash_key, spec_key)[column]}", "fail",
                             f"trained with {want!r}, exported {have!r}: {what}", fix))
    text = (raw.get("dflash_config") or {}).get("mask_token")
    mask_id = read.mask_token_id
    if isinstance(text, str) and text and o.tokenizer.convert_tokens_to_ids(text) != mask_id:
        out.append(Check("export", f"{name}/config.json dflash_config.mask_token", "fail",
                         f"{text!r} is token {o.tokenizer.convert_tokens_to_ids(text)} of the target's tokenizer but "
                         f"mask_token_id is {mask_id}: SGLang refuses the drafter",
                         "write the mask token's text and id together (drafter.mask_token_id)"))
    return out


def check(o: Overfitted, folder: Path) -> GateResult:
    """Step 4 on every exported folder under `folder`; `GateResult` with the checks of steps 1 and 4."""
    from dflashx.dflash.overfit import decode_tau

    t0, recipe = time.perf_counter(), o.recipe
    facts, block = recipe.target.facts, o.drafter.config.block_size
    threshold = TAU_FRACTION * block
    vllm = folder / VLLM_DIR
    checks, taus = list(o.checks), {}
    for engine, path, violations in contract_violations(facts, folder / OUT, vllm if vllm.is_dir() else None):
        checks += [Check("contract", f"{path.name}/config.json {v.key}", "fail", f"{engine}: {v.message}", v.fix)
                   for v in violations]
        try:
            read = read_folder(path.name, "baseline", f"the export {path.name}/", path, facts, False)
        except ValueError as exc:
            checks.append(Check("load", f"{path.name}/config.json", "fail", str(exc),
                                "export from the trained checkpoint unedited (`dflashx run --only export`)"))
            continue
        found = _differences(o, path.name, read.config, json.loads((path / "config.json").read_text()))
        checks += found
        taus[path.name] = tau = decode_tau(o.target, load(read, next(o.target.parameters()).device), o.samples,
                                           o.stops)
        if tau < threshold:
            checks.append(_low_tau(path.name, tau, threshold, o.trained_tau, bool(found or violations)))
    return GateResult(checks, taus, o.trained_tau, threshold, block, o.seconds + time.perf_counter() - t0)


def _low_tau(name: str, tau: float, threshold: float, trained: float, named: bool) -> Check:
    """Check `tau`, with the likely cause: the export (named above, or its weights), or the overfit itself."""
    if trained < threshold:
        cause = (f"the drafter reached only τ {trained:.2f} in memory after {STEPS} steps, before any export: the "
                 "recipe's drafter does not learn two replies of its target")
        fix = ("check drafter.mask_token_id (an id the target never generates), drafter.target_layer_ids and "
               "target.chat_template; a drafter.init_from for another target")
    else:
        cause = (f"the drafter decodes τ {trained:.2f} in memory but not from the export: "
                 + ("the differences above" if named else "its weights or a value the checks do not read"))
        fix = "export from the trained checkpoint unedited; compare the folder's config.json with the recipe's drafter"
    return Check("tau", f"{name}/", "fail", f"τ {tau:.2f} < {threshold:.1f}; likely cause: {cause}", fix)


def release(o: Overfitted) -> None:
    """Free the target and the drafter (the GPU is the generation servers' next)."""
    import torch

    o.target = o.drafter = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gate(o: Overfitted, folder: Path) -> GateResult:
    """Steps 3-4 in `folder`; the exports deleted when the gate passes (a real drafter's are gigabytes), kept
    for inspection when it fails."""
    export(o, folder)
    result = check(o, folder)
    if result.ok:
        shutil.rmtree(folder)
    return result


def run_gate(recipe: ResolvedRecipe, folder: Path) -> GateResult:
    """Steps 1-4 with the export in `folder` (`gate`); the target and the drafter freed after."""
    o = prepare(recipe)
    try:
        return gate(o, folder)
    finally:
        release(o)
