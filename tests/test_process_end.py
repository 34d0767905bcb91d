"""How a `dflashx` process ends (`dflashx.cli.process_end`), in real child processes: once torch is loaded it
runs what Python's exit runs (non-daemon threads joined, atexit handlers, the streams flushed) and skips the
interpreter's teardown (a module-level finaliser never runs); without torch it exits as Python does. The exit
status is SystemExit's either way, and the console script's `main` ends through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHILD = """
import atexit, pathlib, sys, threading, time
{imports}
from dflashx.cli.process_end import end_process
out = pathlib.Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
class Finalised:
    def __del__(self):
        (out / "teardown").write_text("ran")
kept = Finalised()
def late():
    time.sleep(0.3)
    (out / "thread").write_text("ran")
threading.Thread(target=late).start()
sys.stdout.write("the last line, unflushed")
end_process({code})
"""


def _child(tmp_path: Path, imports: str, code: str) -> subprocess.CompletedProcess[str]:
    script = CHILD.format(imports=imports, code=code)
    return subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("code, status", [("3", 3), ("None", 0), ("'stopped: see above'", 1)])
def test_with_torch_loaded_the_teardown_is_skipped_and_nothing_else(tmp_path: Path, code: str, status: int) -> None:
    done = _child(tmp_path, "import torch", code)
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stdout == "the last line, unflushed"
    assert (tmp_path / "thread").read_text() == "ran"  # the non-daemon thread finished before the end
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "teardown").exists()  # the interpreter's teardown did not run
    assert ("stopped: see above" in done.stderr) == (status == 1)


def test_without_torch_the_process_exits_as_python_does(tmp_path: Path) -> None:
    done = _child(tmp_path, "", "3")
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == "the last line, unflushed"
    assert {p.name for p in tmp_path.iterdir()} == {"atexit", "thread", "teardown"}
    assert "torch" not in done.stderr


def test_the_console_script_ends_with_the_commands_status(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    code = ("import sys\nsys.argv = ['dflashx', 'validate', sys.argv[1]]\n"
            "from dflashx.cli.main import main\nmain()\n")
    done = subprocess.run([sys.executable, "-c", code, str(missing)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode != 0 and "missing.yaml" in done.stdout + done.stderr
    valid = code.replace("'validate', sys.argv[1]", "'validate', 'recipes/tiny.yaml'")
    ok = subprocess.run([sys.executable, "-c", valid], cwd=REPO, capture_output=True, text=True, timeout=120,
                        check=False)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
