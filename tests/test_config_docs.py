"""docs/recipes.md is generated from the schema: it must be current and describe every key."""

from __future__ import annotations

from pathlib import Path

from dflashx.config.docs import render, sections

DOC = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"


def test_committed_doc_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/recipes.md is stale: run `python -m dflashx.config.docs > docs/recipes.md`"
    )


def test_every_schema_key_has_a_description() -> None:
    undocumented = [f"{prefix}.{name}" if prefix else name
                    for prefix, model in sections() for name, field in model.model_fields.items()
                    if not (field.description or "").strip()]
    assert not undocumented, f"add description= to these fields in dflashx/config/schema.py: {undocumented}"


def test_nested_sections_and_list_items_get_rows() -> None:
    rows = [line.split("|")[1].strip().strip("`") for line in render().splitlines() if line.startswith("| `")]
    assert len(rows) == len(set(rows))
    for key in ("name", "stages.train.lr", "dataset.sources[].path", "hardware.gpu.fp8_tflops",
                "stages.qc.thresholds.max_truncated_frac", "storage.s3.bucket", "budget.max_storage_bytes"):
        assert key in rows
