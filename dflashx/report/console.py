"""The terminal view of `dflashx run`: a `RunObserver` (`dflashx.run.observer`) that shows what
runs and how far it is, then where everything is and what to try next.

On a terminal: one live row per running step (rich): spinner, name, a bar, done/total and an ETA
when the stage's metrics say how far it is (train: step/total_steps with loss, tokens/s and MFU;
generate: completions/prompts, every 30 s; eval: prompts decoded over all suites and drafters), else the elapsed time
against
the plan's estimate; and the stage's latest `dflashx` log line as its phase. A finished step
prints its line (`dflashx.report.lines.outcome_line`) above the rows. Off a terminal (a pipe,
a file, CI): the same lines stamped HH:MM:SS, no control characters, and a progress line at most
every PLAIN_EVERY_S per step (and every HEARTBEAT_S when it says nothing). `summary` ends the run
with a table of the stages (this run's state, time, headline figures, output files) and the next
commands, never cut to 80 columns.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from dflashx.config.schema import STAGE_ORDER
from dflashx.report.fmt import exported_drafter, human_seconds, human_value, suite_taus, tau_curve, wide_console
from dflashx.report.lines import outcome_line, start_line
from dflashx.run.observer import StageOutcome
from dflashx.run.orchestrator import RunResult
from dflashx.store.manifest import Manifest
from dflashx.track.records import read_records
from dflashx.track.redact import RedactingFilter

PLAIN_EVERY_S = 10.0
HEARTBEAT_S = 60.0  # off a terminal, a stage that says nothing still gets a line this often
_STEP_OF = re.compile(r"\bstep (\d+)/(\d+)\b")
STYLE = {"done": "green", "skipped": "dim", "disabled": "dim", "failed": "red", "interrupted": "yellow",
         "unfinished": "yellow"}
# Headline figures per stage: (metric, format); other stages show their first scalar metrics.
Spec = str | Callable[[Any], str]  # a format string, or a function of the value
HEADLINES: dict[str, tuple[tuple[str, Spec], ...]] = {
    "ingest": (("prompts", "{:,} prompts"), ("eval_prompts", "{:,} held out")),
    "generate": (("completions_total", "{:,} completions"), ("output_tokens_per_s", "{:,.0f} tok/s"),
                 ("finish_length_frac", "{:.0%} truncated")),
    "qc": (("passed", "passed: {}"), ("samples", "{:,} samples"), ("failed_checks", "{} failed checks")),
    "tokenize": (("samples", "{:,} samples"), ("tokens", "{:,} tokens")),
    "train": (("loss", "loss {:.3f}"), ("acceptance_length", "acceptance length {:.2f}"), ("step", "{:,} steps"),
              ("tokens_per_s", "{:,.0f} tok/s"), ("heldout_tau_curve", tau_curve),
              ("heldout_tau_best_step", "best at step {:,}"), ("tau_probe_share", "τ probe {:.1%} of the stage")),
    "eval": (("tau", "τ {:.2f} trained"), ("tau_untrained", "vs {:.2f} untrained"),
             ("tau_by_suite", suite_taus), ("tau_sampled_text", "served: {}"),
             ("greedy_agreement", "greedy agreement {:.0%}"),
             ("predicted_speedup", "predicted serving speed-up {} (requests in flight)"),
             ("engine_text", "through {}")),
    "export": (("parameters", "{:,} parameters"), ("exported", exported_drafter), ("exported_step", "step {:,}"),
               ("exported_heldout_tau", "held-out τ {:.2f}")),
}
# Live figures from a stage's `ctx.log` metrics, in this order.
FIGURES = (("loss", "loss {:.3f}"), ("tokens_per_s", "{:,.0f} tok/s"), ("output_tokens_per_s", "{:,.0f} tok/s"),
           ("mfu", "MFU {:.1%}"), ("heldout_tau", "held-out τ {:.2f}"), ("eval/trained_tau", "τ {:.2f}"),
           ("eval/untrained_tau", "τ {:.2f}"))


def _format(spec: Spec, value: Any) -> str:
    if callable(spec):
        return spec(value)
    try:
        return spec.format(value)
    except (TypeError, ValueError):
        return f"{spec.split('{')[0]}{human_value(value)}"


def figures(metrics: dict[str, Any], specs: Sequence[tuple[str, Spec]] = FIGURES, fallback: int = 0) -> str:
    """`loss 2.310 · 1,234 tok/s` from metrics; without any of `specs`, the first `fallback` scalars."""
    shown = [text for k, spec in specs if metrics.get(k) is not None and (text := _format(spec, metrics[k]))]
    if not shown and fallback:
        scalars = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) and len(str(v)) < 40]
        shown = [f"{k}={human_value(v)}" for k, v in scalars[:fallback]]
    return " · ".join(shown)


def progress_of(metrics: dict[str, Any]) -> tuple[float, float | None, str] | None:
    """(done, total, unit) when a stage's metrics say how far it is."""
    if metrics.get("step") is not None and metrics.get("total_steps"):
        return float(metrics["step"]), float(metrics["total_steps"]), "steps"
    if metrics.get("completions_total") is not None and metrics.get("prompts_total"):
        return float(metrics["completions_total"]), float(metrics["prompts_total"]), "completions"
    if metrics.get("eval/decoded") is not None and metrics.get("eval/decodes"):
        return float(metrics["eval/decoded"]), float(metrics["eval/decodes"]), "prompts decoded (all suites, drafters)"
    return None


def clock(seconds: float) -> str:
    """42s, 3m10s, 2h05m."""
    s = max(0, round(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class _Step:
    name: str
    started: float
    estimate_s: float | None = None
    done: float | None = None
    total: float | None = None
    unit: str = ""
    figures: str = ""
    phase: str = ""
    first: tuple[float, float] | None = None  # (time, done) of the first progress sample
    last_at: float = 0.0
    printed: float = 0.0  # when the last plain progress line was printed
    task: Any = None

    def update(self, now: float, metrics: dict[str, Any]) -> None:
        seen = progress_of(metrics)
        if seen is not None:
            if self.unit != seen[2]:
                self.first = None
            self.done, self.total, self.unit = seen
            self.first = self.first or (now, self.done)
            self.last_at = now
        self.figures = figures(metrics) or self.figures

    def eta(self, now: float) -> float | None:
        if self.total is None or self.done is None or self.first is None or not self.first[1] < self.done < self.total:
            return None
        rate = (self.done - self.first[1]) / max(self.last_at - self.first[0], 1e-9)
        return max(0.0, (self.total - self.done) / rate - (now - self.last_at))

    def cells(self, now: float) -> tuple[str, str, str]:
        """(done/total unit, ETA or the plan's estimate, figures or phase) for the row or line."""
        count = "" if self.done is None else (f"{self.done:,.0f}/{self.total:,.0f} {self.unit}" if self.total
                                              else f"{self.done:,.0f} {self.unit}")
        eta = self.eta(now)
        when = (f"ETA {clock(eta)}" if eta is not None else
                f"plan ~{human_seconds(self.estimate_s)}" if (self.estimate_s or 0) >= 1 and self.done is None else "")
        return count, when, self.figures or self.phase


class _Cells(ProgressColumn):
    """The step's count, ETA and figures, read from the step each refresh (the ETA ticks down)."""

    def __init__(self, index: int, now: Callable[[], float]):
        super().__init__()
        self.index, self.now = index, now

    def render(self, task: Any) -> Text:
        step = task.fields.get("step")
        return Text(step.cells(self.now())[self.index] if step else "", style="dim" if self.index == 2 else "")


class _LogToView(logging.Handler):
    """`dflashx` log records: warnings as lines, INFO as the running step's phase."""

    dflashx_console = True  # dflashx.track.redact.install_console_logging then adds no second one

    def __init__(self, view: RunConsole):
        super().__init__(logging.INFO)
        self.view = view
        self.addFilter(RedactingFilter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().strip()
            if record.levelno >= logging.WARNING:
                self.view.message(f"{record.levelname} {record.name}: {text}")
            elif text:
                self.view.phase(text.splitlines()[0])
        except Exception:  # noqa: BLE001 - logging never raises
            self.handleError(record)


class RunConsole:
    """The run's view on `console` (a `wide_console` on the terminal stream by default)."""

    def __init__(self, console: Console | None = None, file: IO[str] | None = None,
                 clock_fn: Callable[[], float] = time.monotonic):
        self.console = console or wide_console(file)
        self.live = self.console.is_terminal
        self.now = clock_fn
        self.steps: dict[str, _Step] = {}
        self.lock = threading.RLock()
        self.started = self.now()
        self.progress: Progress | None = None
        self.stopped = threading.Event()
        self.ticker: threading.Thread | None = None

    def line(self, text: str, style: str | None = None) -> None:
        with self.lock:
            if self.live:
                self.console.print(Text(text, style=style or ""), soft_wrap=True)
            else:
                self.console.print(f"{time.strftime('%H:%M:%S')} {text}", markup=False, highlight=False, soft_wrap=True)

    def message(self, text: str) -> None:
        self.line(text, "yellow" if text.startswith(("WARNING", "ERROR", "~")) else None)

    def run_started(self, run_dir: Path, stages: Sequence[str]) -> None: ...

    def stage_started(self, name: str, key: str, reason: str | None, estimate_s: float | None) -> None:
        self._begin(name, start_line(name, key, reason), estimate_s)

    def stage_metrics(self, name: str, metrics: dict[str, Any], step: int | None) -> None:
        with self.lock:
            if name in self.steps:
                self.steps[name].update(self.now(), metrics)
                self._show(self.steps[name])

    def stage_ended(self, outcome: StageOutcome) -> None:
        self._end(outcome.name, outcome_line(outcome), STYLE.get(outcome.state))

    def phase(self, text: str) -> None:
        """The running step's current activity (its latest INFO log line); `step N/M` in it is progress."""
        with self.lock:
            if self.steps:
                step = list(self.steps.values())[-1]
                step.phase = text
                if counted := _STEP_OF.search(text):
                    step.update(self.now(), {"step": int(counted[1]), "total_steps": int(counted[2])})
                self._show(step)

    @contextmanager
    def route_logs(self) -> Iterator[None]:
        """While the block runs, the `dflashx` loggers' lines come here instead of stderr."""
        logger = logging.getLogger("dflashx")
        others = [h for h in logger.handlers if getattr(h, "dflashx_console", False)]
        handler = _LogToView(self)
        for h in others:
            logger.removeHandler(h)
        logger.addHandler(handler)
        try:
            yield
        finally:
            logger.removeHandler(handler)
            for h in others:
                logger.addHandler(h)

    def _begin(self, name: str, text: str, estimate_s: float | None) -> None:
        with self.lock:
            self.line(text, "bold")
            step = self.steps[name] = _Step(name, self.now(), estimate_s)
            step.printed = step.started
            if self.live:
                if self.progress is None:
                    self.progress = Progress(
                        SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(bar_width=24),
                        _Cells(0, self.now), TimeElapsedColumn(), _Cells(1, self.now), _Cells(2, self.now),
                        console=self.console, transient=True, redirect_stdout=False, redirect_stderr=False)
                    self.progress.start()
                step.task = self.progress.add_task(name, total=None, step=step)
            elif self.ticker is None:
                self.ticker = threading.Thread(target=self._tick, name="dflashx-view", daemon=True)
                self.ticker.start()

    def _tick(self) -> None:
        while not self.stopped.wait(PLAIN_EVERY_S):
            with self.lock:
                for step in list(self.steps.values()):
                    if self.now() - step.printed >= HEARTBEAT_S:
                        self._show(step, heartbeat=True)

    def _show(self, step: _Step, heartbeat: bool = False) -> None:
        now = self.now()
        if self.progress is not None and step.task is not None:
            self.progress.update(step.task, completed=step.done or 0, total=step.total)
        elif not self.live and (heartbeat or now - step.printed >= PLAIN_EVERY_S):
            step.printed = now
            cells = [c for c in step.cells(now) if c] if step.done is not None else [
                f"running {clock(now - step.started)}", *(c for c in step.cells(now) if c)]
            self.line(f"  {step.name}: " + " · ".join(cells))

    def _end(self, name: str, text: str, style: str | None) -> None:
        with self.lock:
            step = self.steps.pop(name, None)
            if step is not None and self.progress is not None and step.task is not None:
                self.progress.remove_task(step.task)
            if self.progress is not None and not self.steps:
                self.progress.stop()  # no live rows between steps: other output cannot tear them
                self.progress = None
            self.line(text, style)

    def close(self, interrupted: bool = False) -> None:
        """Stop the live rows; steps still running are reported as interrupted."""
        with self.lock:
            for name, step in list(self.steps.items()):
                self._end(name, f"x {name}: interrupted after {self.now() - step.started:.1f}s"
                          if interrupted else f"x {name}: stopped", STYLE["interrupted"])
            if self.progress is not None:
                self.progress.stop()
                self.progress = None
            self.stopped.set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.close(interrupted=kind is not None)

    def summary(self, result: RunResult, rerun: str, retrain: str | None = None) -> None:
        """The stages table and the next commands: `rerun` repeats this run, `retrain` changes the
        learning rate only."""
        self.close()
        self.console.print(self.table(result))
        self.console.print("Next:", style="bold", soft_wrap=True)
        commands = next_commands(result, rerun, retrain)
        width = max(len(c) for c, _ in commands)
        for command, what in commands:
            self.console.print(f"  {command:<{width}}  # {what}", markup=False, highlight=False, soft_wrap=True)

    def table(self, result: RunResult) -> Table:
        """One row per stage: this run's state, time, headline figures (the last finished attempt's
        for a stage that did not run now) and where its outputs are."""
        outcomes = {o.name: o for o in result.outcomes}
        earlier = {r["stage"]: r for r in read_records(result.run_dir) if r.get("event") == "stage_end"}
        manifest = Manifest.load(result.run_dir)
        counts = {s: sum(o.state == s for o in result.outcomes) for s in ("done", "skipped")}
        table = Table(title=f"dflashx run {_shown(result.run_dir)}: {counts['done']} stage(s) ran, {counts['skipped']} "
                            f"unchanged, {clock(self.now() - self.started)} in all", title_justify="left")
        for column in ("stage", "this run", "time", "figures", "outputs"):
            table.add_column(column, no_wrap=column in ("stage", "this run", "time"),
                             overflow="fold", max_width=80 if column == "figures" else None)
        for name in STAGE_ORDER:
            o = outcomes.get(name) or StageOutcome(name, "not run")
            ran = o.state in ("done", "failed", "unfinished")
            seconds = o.duration_s if ran else earlier.get(name, {}).get("duration_s")
            spent = "-" if seconds is None else human_seconds(seconds) + ("" if ran else " earlier")
            metrics = o.metrics if ran else earlier.get(name, {}).get("metrics") or {}
            shown = (o.message or "").splitlines()[0] if o.state in ("failed", "unfinished") else figures(
                metrics, HEADLINES.get(name, ()), fallback=3)
            table.add_row(name, Text({"skipped": "unchanged"}.get(o.state, o.state), style=STYLE.get(o.state, "")),
                          spent, shown or "-", "\n".join(output_paths(result.run_dir, manifest.by_stage(name))) or "-")
        return table


def _shown(path: Path) -> str:
    """A path relative to the working directory when it is below it, else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def output_paths(run_dir: Path, entries: Sequence[Any]) -> list[str]:
    """Where a stage's outputs are: a report folder's .md/.json files and its plots, else the artifact."""
    shown: list[str] = []
    for entry in entries:
        path = Path(run_dir) / entry.path
        if entry.artifact != "report" or not path.is_dir():
            shown.append(_shown(path) + ("/" if path.is_dir() else ""))
            continue
        files = sorted(p for p in path.iterdir() if p.is_file())
        shown += [_shown(p) for p in files if p.suffix in (".md", ".json")]
        plots = [p for p in files if p.suffix == ".png"]
        if len(plots) == 1:
            shown.append(_shown(plots[0]))
        elif plots:
            shown.append(f"{_shown(path)}/*.png ({len(plots)} plots)")
    return shown


def next_commands(result: RunResult, rerun: str, retrain: str | None = None) -> list[tuple[str, str]]:
    """What to try after this run: (command, what it shows)."""
    run = _shown(result.run_dir)
    failed = next((o for o in result.outcomes if o.state == "failed"), None)
    if failed is not None:
        commands = [(rerun, "after fixing the cause: finished stages are skipped, the failed one resumes"),
                    (f"dflashx status {run}", "each stage's state, key, outputs and the failure")]
        for log in ("report/report.md", "error.log", "stage.log"):
            if (result.run_dir / failed.name / log).is_file():
                commands.append((f"less {run}/{failed.name}/{log}", f"the {failed.name} stage's {log}"))
        return commands
    commands = [(f"dflashx status {run}", "each stage's state, key, timings and headline figures"),
                (f"dflashx inventory {run}", "every artifact: tier, size, where it is, checksums")]
    for rel, what in (("qc/report/report.md", "the QC report of the generated data"),
                      ("export/drafter/README.md", "how to serve the exported drafter (SGLang, vLLM)")):
        if (result.run_dir / rel).is_file():
            commands.append((f"less {run}/{rel}", what))
    if retrain:
        commands.append((retrain, "another learning rate: only train, eval and export re-run, and say why"))
    commands.append((f"dflashx compare {run} OTHER_RUN", "two runs side by side: recipe differences, results"))
    if Path("recipes/qwen36_27b.yaml").is_file() and "qwen36_27b" not in rerun:
        commands.append(("dflashx plan recipes/qwen36_27b.yaml", "what a real 27B drafter costs, before any GPU"))
    return commands
