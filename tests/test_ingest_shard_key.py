"""Re-sharding the prompts does not re-run generation: `stages.ingest.shard_size` is how the
prompts are cut into files, not what they are, so it is OPERATIONAL; and generation's output does
not depend on how its input was cut (shown on the tiny target with the transformers backend)."""

from __future__ import annotations

from pathlib import Path

from helpers_models import make_recipe, resolved, stage_context, tiny_target

from dflashx.config.fields import OPERATIONAL
from dflashx.config.stages import IngestStage
from dflashx.data.jsonl import iter_shards, write_jsonl_atomic
from dflashx.run.keys import stage_key
from dflashx.stages import generate
from dflashx.store.manifest import Manifest


def test_shard_size_leaves_the_ingest_and_generate_keys(tmp_path):
    assert IngestStage.model_fields["shard_size"].json_schema_extra == OPERATIONAL
    keys = [{stage: stage_key(stage, resolved(make_recipe(stages={"ingest": {"shard_size": size}})),
                              Manifest(tmp_path)).key for stage in ("ingest", "generate")} for size in (7, 50_000)]
    assert keys[0] == keys[1]


def _generate(tmp_path: Path, target: Path, rows: list[dict], per_shard: int) -> list[dict]:
    prompts = tmp_path / "run" / "ingest" / "prompts"
    for k in range(0, len(rows), per_shard):
        write_jsonl_atomic(prompts / f"shard-{k // per_shard:05d}.jsonl", rows[k:k + per_shard])
    recipe = make_recipe(target={"model": str(target), "precision": "fp32"},
                         stages={"generate": {"backend": "transformers", "max_tokens": 6, "temperature": 0,
                                              "batch_size": 2}})
    ctx = stage_context("generate", recipe, tmp_path / "run", inputs={"ingest.prompts": prompts})
    generate.run(ctx)
    return list(iter_shards(ctx.out_dir / "completions"))


def test_generation_does_not_depend_on_the_prompt_shards(tmp_path):
    target = tiny_target(tmp_path / "target")
    rows = [{"id": f"id{i:02d}", "source": "s", "messages": [{"role": "user", "content": f"prompt {i}"}]}
            for i in range(5)]
    one = _generate(tmp_path / "a", target, rows, per_shard=5)
    many = _generate(tmp_path / "b", target, rows, per_shard=2)
    assert [r["id"] for r in one] == [r["id"] for r in rows]
    assert one == many
