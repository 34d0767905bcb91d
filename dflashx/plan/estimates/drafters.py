"""Draft methods besides the target's MTP head and a DFlash drafter, as `speculative.Drafter`s (pure).

Built from the drafter's published architecture, so that the serving model prices another method's draft-verify
cycle with the same physics as ours (`benchmarks/speedup_rows.py` plans published EAGLE / EAGLE-3 curves with
them). Per cycle and sequence:

  EAGLE (v1)  one decoder layer at the target's own geometry over [embedding, feature] fused by `fc` (2h -> h),
              the target's LM head shared (yuhuili/EAGLE-LLaMA3-Instruct-* config.json: num_hidden_layers 1,
              the target's hidden, heads and FFN; EAGLE paper, arXiv 2401.15077, sec. 3)
  EAGLE-3     one decoder layer whose attention reads [embedding, fused feature] (2h wide: q, k, v from 2h),
              `fc` over three tapped layers (3h -> h), its own LM head over a reduced draft vocabulary
              (SpecForge configs/llama3-8B-eagle3.json and yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json:
              num_hidden_layers 1, the target's hidden / heads / FFN, draft_vocab_size 32,000; EAGLE-3 paper,
              arXiv 2503.01840, sec. 3)
  chain / tree  `steps` chained forwards of `topk` tokens per sequence (a chain: topk 1); the target verifies
              `verify_tokens` per sequence (a chain: steps + 1; SGLang's tree: --speculative-num-draft-tokens)
              and at most `steps` of them are accepted before the bonus token
  extension   the accepted tokens' features run through `fc` and the layer once per cycle to extend the draft's
              own KV (SGLang's draft extend; vLLM folds it into the first draft forward): `cycle_flops`

Weights and KV in 16 bits; the draft's KV is one layer's.
"""

from __future__ import annotations

from dflashx.plan.estimates.prefill import DraftPass
from dflashx.plan.estimates.serving import SpecMemory
from dflashx.plan.estimates.speculative import Drafter
from dflashx.targets.registry import TargetFacts

EAGLE3_DRAFT_VOCAB = 32_000  # SpecForge configs/llama3-8B-eagle3.json `draft_vocab_size` (module doc)


def eagle_layer_params(facts: TargetFacts, eagle3: bool) -> int:
    """The draft layer and its `fc`: EAGLE-3's attention reads 2h (q, k, v projections from 2h), `fc` 3h -> h;
    EAGLE's layer is the target's, `fc` 2h -> h."""
    h, q, kv = facts.hidden_size, facts.num_attention_heads * facts.head_dim, facts.num_kv_heads * facts.head_dim
    width = 2 * h if eagle3 else h
    attention = width * (q + 2 * kv) + q * h
    return attention + 3 * h * facts.intermediate_size + (3 if eagle3 else 2) * h * h


def eagle_drafter(facts: TargetFacts, eagle3: bool, steps: int, topk: int, verify_tokens: int,
                  tau: float) -> Drafter:
    """EAGLE (v1) or EAGLE-3 drafting `steps` chained forwards of `topk` tokens, verified over `verify_tokens`
    (module doc)."""
    layer = eagle_layer_params(facts, eagle3)
    head = facts.hidden_size * (EAGLE3_DRAFT_VOCAB if eagle3 else facts.vocab_size)
    kv_per_token = 2.0 * facts.num_kv_heads * facts.head_dim * 2
    own = (layer + (head if eagle3 else 0)) * 2.0  # EAGLE's LM head is the target's, already in memory
    return Drafter("eagle3" if eagle3 else "eagle", steps, topk, 1, (layer + head) * 2.0, 2.0 * (layer + head),
                   4.0 * facts.num_attention_heads * facts.head_dim, kv_per_token, None, 2.0 * layer * tau,
                   DraftPass(2.0 * layer, 1), verify_tokens, steps, SpecMemory(own, kv_per_token, verify_tokens))
