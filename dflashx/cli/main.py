"""The `dflashx` command: one small module per sub-command under `dflashx/cli/`.

Each module defines `command(...)` (a typer command function) and imports nothing heavy at module
level, so `--help`, `plan`, `validate` and `schema` never import torch, deepspeed or transformers.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import typer

app = typer.Typer(
    name="dflashx",
    help="One reviewed YAML recipe -> a whole DFlash drafter project.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# (command name, module under dflashx.cli, one-line help)
COMMANDS: list[tuple[str, str, str]] = [
    ("plan", "plan", "Validate a recipe and print what it will run, cost and need."),
    ("validate", "validate", "Check a recipe (schema and planner rules) without planning output."),
    ("schema", "schema", "Print the JSON Schema of recipes (for editors)."),
    ("profiles", "profiles", "List the hardware profiles."),
    ("run", "run", "Run (or resume) a recipe's stages."),
    ("status", "status", "Show each stage's state, outputs and timings of a run."),
    ("qc", "qc", "Run the QC gate alone on generated or tokenized data."),
    ("target", "target", "Build and inspect targets (e.g. the built-in tiny target)."),
    ("inventory", "inventory", "List every artifact of a run: tier, size, where, checksums."),
    ("backup", "backup", "Copy a run's artifacts to S3 and verify them."),
    ("gc", "gc", "Delete a run's garbage artifacts after confirmation."),
    ("compare", "compare", "Compare runs side by side."),
    ("calibrate", "calibrate", "Fit the planner's efficiency factors from finished runs."),
    ("review", "review", "Markdown review of a recipe change for a pull request."),
]


@app.callback()
def _root() -> None:
    """One reviewed YAML recipe -> a whole DFlash drafter project."""


def _register(argv: list[str]) -> None:
    """Register the sub-commands; when argv names one, import only that one (faster start-up)."""
    wanted = argv[1] if len(argv) > 1 and any(argv[1] == c[0] for c in COMMANDS) else None
    for name, module_name, help_text in COMMANDS:
        if wanted is not None and name != wanted:
            continue
        qualified = f"dflashx.cli.{module_name}"
        if importlib.util.find_spec(qualified) is None:
            continue  # command not built yet
        module = importlib.import_module(qualified)
        if isinstance(getattr(module, "app", None), typer.Typer):
            app.add_typer(module.app, name=name, help=help_text)
        else:
            app.command(name=name, help=help_text)(module.command)


_register(sys.argv)

if __name__ == "__main__":
    app()
