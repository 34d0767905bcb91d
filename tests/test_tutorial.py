"""docs/tutorial.md cannot rot: every command of its ```bash blocks is run, in order, and a few of
the things the prose claims about their output are checked.

How the tutorial is read (keep docs/tutorial.md to these rules):

- Every non-empty line of a ```bash block that is not a comment is one command; a line ending in
  `\\` continues on the next. Each command runs on its own in `bash -e -o pipefail -c`, so a `cd`
  or an `export` does not carry over to the next line: the tutorial runs everything from the
  repository root.
- The working directory is a temporary copy of the repository: a `git clone` of this checkout's
  HEAD with the working tree's files (tracked and untracked-not-ignored) copied over it. So
  `runs/` and edited recipes land in tmp, and `path@HEAD` resolves for `dflashx review`. The
  installed `dflashx` (the one next to this interpreter) is first on PATH.
- A command must exit 0, unless its trailing comment says `# exits N`: then it must exit N
  (`dflashx plan` exits 1 on a plan with errors, which the tutorial shows on purpose).
- The set-up lines (`python3 -m venv ...`, `python -m pip install ...`) are detected and not run: a
  fresh environment and install are .ci/run's and tests/test_wheel_install.py's job, and this test
  uses the environment it runs in.
- Each command has a time limit (COMMAND_TIMEOUT_S). The tiny target comes from the package (or
  the cache, $DFLASHX_CACHE or ~/.cache/dflashx, exactly as for a newcomer): the test never
  points the cache elsewhere, so it does not start a build of its own when one is there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorial.md"
COMMAND_TIMEOUT_S = 1200  # one command; the two tiny runs take ~1.5 min each on 2 cores
EXIT_MARK = re.compile(r"#\s*exits\s+(\d+)\s*$")
SETUP = re.compile(r"^python3?\s+-m\s+(pip\s+install|venv)\b")


def tutorial_commands(text: str) -> list[tuple[str, int]]:
    """(command, expected exit code) for every command of every ```bash block, in order."""
    commands: list[tuple[str, int]] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        pending = ""
        for raw in block.splitlines():
            line = raw.rstrip()
            if pending:
                line = pending + " " + line.lstrip()
                pending = ""
            if line.endswith("\\"):
                pending = line[:-1].rstrip()
                continue
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            mark = EXIT_MARK.search(line)
            commands.append((line.strip(), int(mark.group(1)) if mark else 0))
        assert not pending, f"a bash block ends in a continued line: {pending!r}"
    return commands


def _copy_repo(dest: Path) -> None:
    """A clone of HEAD, then the working tree's files over it (what a newcomer's checkout holds)."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], check=True,
                   capture_output=True)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src, dst = REPO / rel, dest / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        elif not src.exists() and dst.is_file():
            dst.unlink()  # deleted in the working tree
    assert not (dest / "runs").exists()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["COLUMNS"] = "120"  # rich tables as on a laptop terminal, not squeezed to 80
    env.pop("DFLASHX_TINY_SIZE", None)  # the tutorial's figures are the full tiny target's
    return env  # DFLASHX_CACHE, when set, is passed through untouched: the cache a newcomer's run uses


def _output_of(outputs: list[tuple[str, str]], pattern: str) -> str:
    """The output of the first command matching `pattern` (a regex)."""
    for command, output in outputs:
        if re.search(pattern, command):
            return output
    raise AssertionError(f"the tutorial has no command matching {pattern!r}")


def test_parser_reads_continuations_comments_and_exit_marks() -> None:
    text = ("x\n```bash\n# a comment\npython -m pip install -e '.[dev]'\ndflashx plan a.yaml \\\n"
            "    hardware=cpu\n\ndflashx plan b.yaml 'acknowledge=[]'   # exits 1\n```\n"
            "```python\nprint()\n```\n```bash\nls runs\n```\n")
    assert tutorial_commands(text) == [("python -m pip install -e '.[dev]'", 0),
                                       ("dflashx plan a.yaml hardware=cpu", 0),
                                       ("dflashx plan b.yaml 'acknowledge=[]'   # exits 1", 1),
                                       ("ls runs", 0)]


def test_the_tutorial_sets_up_as_the_readme_does() -> None:
    """Its first commands are README's set-up block (a virtual environment, then the install), which
    the run below skips; nothing else is skipped."""
    readme_setup = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S).group(1)
    commands = [c for c, _ in tutorial_commands(TUTORIAL.read_text())]
    assert commands[:2] == readme_setup.strip().splitlines()
    assert [c for c in commands if SETUP.match(c)] == commands[:2]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_tutorial_runs_top_to_bottom(tmp_path: Path) -> None:
    commands = tutorial_commands(TUTORIAL.read_text())
    assert any(SETUP.match(c) for c, _ in commands), "the tutorial starts with the set-up"
    workdir = tmp_path / "dflashx"
    _copy_repo(workdir)
    env = _env()

    outputs: list[tuple[str, str]] = []
    timings: list[tuple[float, str]] = []
    for command, expected in commands:
        if SETUP.match(command):
            continue
        started = time.monotonic()
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=workdir, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
        timings.append((time.monotonic() - started, command))
        output = done.stdout + done.stderr
        assert done.returncode == expected, (
            f"`{command}` exited {done.returncode}, the tutorial says {expected}:\n{output[-6000:]}")
        outputs.append((command, output))
    print("\n".join(f"{s:7.1f} s  {c}" for s, c in timings))  # shown with -s / -rP

    runs = workdir / "runs"
    a, b = runs / "tutorial-a", runs / "tutorial-b"

    # step 2-3: the tiny run's folder is what the tutorial walks through
    for rel in ("qc/report/report.md", "qc/report/qc.json", "eval/report/eval.json", "eval/report/acceptance.png",
                "export/drafter/config.json", "export/drafter/model.safetensors", "export/drafter/README.md",
                "records.jsonl", "manifest.json", "PROGRESS.md", "plan.json", "recipe.yaml"):
        assert (a / rel).is_file(), rel
    assert list((a / "qc" / "report").glob("*.png")), "no QC histograms"
    assert json.loads((a / "qc" / "report" / "qc.json").read_text())["passed"] is True
    for run in (a, b):  # "the trained drafter is accepted far more often than an untrained one"
        report = json.loads((run / "eval" / "report" / "eval.json").read_text())
        tau, tau0 = report["trained"]["tau"], report["untrained"]["tau"]
        assert tau > tau0 + 0.4 and tau0 < 1.5, (run.name, tau, tau0)
        assert report["greedy_agreement"] == 1.0
    readme = (a / "export" / "drafter" / "README.md").read_text()
    assert "sglang.launch_server" in readme and "--speculative-algorithm DFLASH" in readme
    status = _output_of(outputs, r"^dflashx status runs/tutorial-a$")
    assert all(re.search(rf"{stage}\s.*done", status) for stage in ("ingest", "generate", "train", "export")), status
    resumed = [o for c, o in outputs if c == "dflashx run recipes/tiny.yaml --run-dir runs/tutorial-a"]
    assert len(resumed) == 2 and resumed[1].count("unchanged (skipped)") == 7, resumed[-1]

    # step 4-5: the seeds' plan and the B200 node
    plan = _output_of(outputs, r"^dflashx plan recipes/qwen36_27b\.yaml$")
    assert "train_truncation" in plan and "(acknowledged in the recipe)" in plan and "9.6 d" in plan, plan
    assert "0 error(s)" in plan
    assert "error [train_truncation]" in _output_of(outputs, r"acknowledge=\[\]")
    assert "offline_over_budget" in _output_of(outputs, r"train\.mode=offline")
    b200 = _output_of(outputs, r"^dflashx plan recipes/qwen36_27b\.yaml hardware=b200_nvl8$")
    assert "b200_nvl8" in b200 and "10.9 h" in b200 and "--dp-size 8" in b200, b200

    # step 6: the comparison names both runs and the one key that differs
    compare = _output_of(outputs, r"^dflashx compare runs/tutorial-a runs/tutorial-b")
    assert "tutorial-a" in compare and "tutorial-b" in compare and "stages.train.lr" in compare, compare
    recipe_a = (a / "recipe.yaml").read_text()
    assert "lr: 0.005" in recipe_a and "lr: 0.001" in (b / "recipe.yaml").read_text()

    # step 7: the review shows the edited keys and the warning the change resolves
    review = _output_of(outputs, r"^dflashx review recipes/qwen36_27b\.yaml@HEAD recipes/qwen36_27b\.yaml")
    assert "`stages.tokenize.max_length` | 3072 | 5400" in review, review
    assert "Resolved warnings" in review and "train_truncation" in review, review
    at_head = subprocess.run(["git", "show", "HEAD:recipes/qwen36_27b.yaml"], cwd=workdir, capture_output=True,
                             text=True, check=True).stdout
    assert (workdir / "recipes" / "qwen36_27b.yaml").read_text() == at_head, "the tutorial leaves the recipe edited"


def test_the_tutorial_is_linked_from_the_readme() -> None:
    assert "[tutorial](docs/tutorial.md)" in (REPO / "README.md").read_text()
    text = TUTORIAL.read_text()
    for command in ("dflashx run recipes/tiny.yaml", "dflashx plan recipes/qwen36_27b.yaml",
                    "hardware=b200_nvl8", "dflashx compare", "dflashx review", "dflashx status", "dflashx inventory"):
        assert command in text, command
