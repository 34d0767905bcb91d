"""One rank of tests/test_target_shard.py's capture check (run by `torchrun --nproc_per_node 2`).

Each rank loads the target twice: whole (the reference) and partitioned with the resolved ZeRO-3
config (`TrainJob.train.target_deepspeed_config`, read from the stage folder's train_job.json). It
captures its own batch three times through the partitioned target and writes, to
`<out>/rank<r>.json`, the largest difference to the whole target's `output_hidden_states`, the
share of the weights it holds, and whether the embedding and LM head it hands the drafter are
the whole ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main(stage_dir: str, out: str) -> None:
    from transformers import AutoModelForCausalLM

    from dflashx.dflash.capture import FeatureCapture
    from dflashx.dflash.distributed import setup_distributed, teardown_distributed
    from dflashx.dflash.job import JOB_FILE, TrainJob
    from dflashx.dflash.target_shard import frozen_io, is_sharded, shard_target

    job = TrainJob.model_validate_json((Path(stage_dir) / JOB_FILE).read_text())
    rank, _, _ = setup_distributed()
    whole = AutoModelForCausalLM.from_pretrained(job.target_path, dtype=torch.float32).eval()
    total = sum(p.numel() for p in whole.parameters())
    sharded = shard_target(AutoModelForCausalLM.from_pretrained(job.target_path, dtype=torch.float32),
                           job.train.target_deepspeed_config)
    held = sum(p.ds_tensor.numel() for p in sharded.parameters())
    ids = torch.randint(10, 200, (2, 21), generator=torch.Generator().manual_seed(100 + rank))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    layer_ids = job.drafter.target_layer_ids
    with torch.no_grad():
        hs = whole(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    want = torch.cat([hs[i + 1] for i in layer_ids], dim=-1)
    capture = FeatureCapture(sharded, layer_ids)
    diffs = [float((capture.capture(ids, mask) - want).abs().max()) for _ in range(3)]
    embed, head = frozen_io(sharded)
    result = {"diffs": diffs, "held_share": held / total, "sharded": is_sharded(sharded),
              "embed_equal": bool(torch.equal(embed.weight, whole.get_input_embeddings().weight)),
              "head_equal": bool(torch.equal(head, whole.get_output_embeddings().weight))}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    teardown_distributed()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
