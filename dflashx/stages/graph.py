"""What each stage consumes and produces: the one declaration of the stage graph.

`inputs` are required artifacts ("<stage>.<artifact>"), `optional_inputs` are used when present,
`outputs` are the artifacts the stage returns, `sections` are the dotted keys of the resolved
recipe that decide its output (its stage key). Which fields under a section count is declared on
the schema fields themselves (`dflashx.config.fields`: OUTPUT, OPERATIONAL, PATH). The
orchestrator builds its graph from this table, each stage reads its input names from it, and
docs/design.md's stage table is checked against it by a test.
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class StageSpec:
    reads: str  # what the stage reads, in words (the docs table)
    inputs: tuple[str, ...] = ()
    optional_inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    all_inputs: bool = False  # backup: every live artifact of the other stages


_TARGET = "target"

GRAPH: dict[str, StageSpec] = {
    "ingest": StageSpec("dataset sources", outputs=("prompts", "eval_prompts"), sections=("dataset", "stages.ingest")),
    # Not hardware: moving to another node or serving layout must never regenerate.
    "generate": StageSpec("`ingest.prompts`", inputs=("ingest.prompts",), outputs=("completions",),
                          sections=(_TARGET, "stages.generate")),
    "qc": StageSpec("`generate.completions`", inputs=("generate.completions",), outputs=("report",),
                    sections=(_TARGET, "drafter.block_size", "stages.qc")),
    "tokenize": StageSpec("`generate.completions`", inputs=("generate.completions",), outputs=("dataset",),
                          sections=(_TARGET, "drafter.block_size", "stages.tokenize")),
    "train": StageSpec("`tokenize.dataset`, `ingest.eval_prompts`", inputs=("tokenize.dataset",),
                       optional_inputs=("ingest.eval_prompts",), outputs=("checkpoint", "logs"),
                       sections=(_TARGET, "drafter", "stages.train")),
    "eval": StageSpec("`train.checkpoint`, `ingest.eval_prompts`", inputs=("train.checkpoint",),
                      optional_inputs=("ingest.eval_prompts",), outputs=("report",),
                      sections=(_TARGET, "drafter", "stages.eval", "deploy")),
    "export": StageSpec("`train.checkpoint`", inputs=("train.checkpoint",), outputs=("drafter", "drafter_vllm"),
                        sections=("drafter", "stages.export")),
    "backup": StageSpec("the whole run (manifest)", outputs=("receipt",), sections=("stages.backup", "storage.s3"),
                        all_inputs=True),
}


def input_name(stage: str, index: int = 0) -> str:
    """The stage's `index`-th required input, as declared above."""
    return GRAPH[stage].inputs[index]
