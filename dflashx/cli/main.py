"""The `dflashx` command: one small module per sub-command under `dflashx/cli/`.

Each module defines `command(...)` (a typer command function) and imports nothing heavy at module
level, so `--help`, `plan`, `validate` and `schema` never import torch, deepspeed or transformers.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from typing import Any

# Commands that only read and print, in a process of a fraction of a second that starts no other
# program (`plan`, `validate`, `schema`, `--help`), start faster:
# - without the cyclic garbage collector: the ~80 collections that the imports' allocations trigger
#   cost ~15 ms of `dflashx plan` and free next to nothing (its peak memory grows by ~0.3 MB);
# - without pydantic's plugin discovery, which reads every installed distribution's entry points on
#   the first model built (~8 ms). A PYDANTIC_DISABLE_PLUGINS the user set is kept.
# Every other command may import torch and the libraries around it: its collector runs at a higher young
# threshold (`dflashx.track.collector`).
PURE_COMMANDS = ("plan", "validate", "schema", "--help")
if len(sys.argv) > 1 and sys.argv[1] in PURE_COMMANDS:
    gc.disable()
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
else:
    from dflashx.track.collector import for_long_process

    for_long_process()

import typer  # noqa: E402  (after the start-up settings above)
from typer.core import TyperCommand  # noqa: E402

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
    ("pilot", "pilot", "Measure the plan's assumptions on a few hundred prompts, then re-plan."),
    ("run", "run", "Run (or resume) a recipe's stages."),
    ("preflight", "preflight", "Check the world before a run: data, target, disk, S3, GPUs, servers."),
    ("status", "status", "Show each stage's state, outputs and timings of a run."),
    ("qc", "qc", "Run the QC gate alone on generated or tokenized data."),
    ("target", "target", "Build and inspect targets (e.g. the built-in tiny target)."),
    ("inventory", "inventory", "List every artifact of a run: tier, size, where, checksums."),
    ("backup", "backup", "Copy a run's artifacts to S3 and verify them."),
    ("gc", "gc", "Delete a run's garbage artifacts after confirmation."),
    ("compare", "compare", "Compare runs side by side."),
    ("calibrate", "calibrate", "Fit the planner's measured factors from finished runs and pilots."),
    ("review", "review", "Markdown review of a recipe change for a pull request."),
]


@app.callback()
def _root() -> None:
    """One reviewed YAML recipe -> a whole DFlash drafter project."""


def override_hint(option: str, args: list[str]) -> str | None:
    """`--hardware b200_nvl8`, `--hardware=b200_nvl8`, `--train.lr 1e-4`: an override written as an
    option. The hint names the override to write, or None when `option` names no recipe key."""
    from dflashx.config.schema import STAGE_ORDER, Recipe

    key = option.lstrip("-")
    if key.split(".")[0] not in (*Recipe.model_fields, *STAGE_ORDER):
        return None
    value = "VALUE"
    for i, arg in enumerate(args):
        if arg.startswith(option + "="):
            value = arg[len(option) + 1:]
            break
        if arg == option:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            break
    return f"no option {option}: did you mean `{key}={value}` (an override)?"


class OverridesCommand(TyperCommand):
    """A sub-command; when it takes `KEY=VALUE` overrides, an unknown option that names a recipe
    key is answered with the override to write instead of a bare "No such option" (exit 2)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes `args`
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:  # click's NoSuchOption, or the copy of click that typer vendors
            if type(exc).__name__ != "NoSuchOption" or not any(p.name == "overrides" for p in self.params):
                raise
            no_such: Any = exc  # NoSuchOption: option_name, and (message, ctx) keywords
            hint = override_hint(no_such.option_name, given)
            if hint is None:
                raise
            raise type(no_such)(no_such.option_name, message=hint, ctx=ctx) from None


def _register(argv: list[str]) -> None:
    """Register the sub-commands; when argv names one, import only that one (faster start-up)."""
    wanted = argv[1] if len(argv) > 1 and any(argv[1] == c[0] for c in COMMANDS) else None
    for name, module_name, help_text in COMMANDS:
        if wanted is not None and name != wanted:
            continue
        module = importlib.import_module(f"dflashx.cli.{module_name}")
        if isinstance(getattr(module, "app", None), typer.Typer):
            app.add_typer(module.app, name=name, help=help_text)
        else:
            app.command(name=name, help=help_text, cls=OverridesCommand)(module.command)


_register(sys.argv)


def main() -> None:
    """The `dflashx` process (its console script): the command, then `process_end.end_process` with its exit code
    (`typer` ends every command with SystemExit)."""
    from dflashx.cli.process_end import end_process

    try:
        app()
    except SystemExit as done:
        end_process(done.code)


if __name__ == "__main__":
    main()
