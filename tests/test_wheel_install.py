"""The built-in hardware profiles are package data: user folders shadow them, and a wheel (not an
editable install) ships them, so `dflashx profiles` and `dflashx plan` work outside the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from site import getsitepackages

import pytest
import yaml

import dflashx
from dflashx.config.load import PROFILES_ENV, available_profiles, load_profile, profile_dirs

REPO = Path(__file__).resolve().parents[1]
BUILTIN_DIR = REPO / "dflashx" / "hardware_profiles"
BUILTIN = ("b200_nvl8", "rtx_pro_6000_x4", "h200_x1", "h200_x8", "h100_x8", "cpu")


def _priced(name: str, usd: float) -> str:
    """The built-in profile `name` with another price, to tell a user's copy from the original."""
    data = yaml.safe_load((BUILTIN_DIR / f"{name}.yaml").read_text())
    return yaml.safe_dump({**data, "usd_per_gpu_hour": usd})


def test_user_folders_are_searched_before_the_builtin_profiles(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir = tmp_path / "env_profiles"
    cwd = tmp_path / "cwd"
    local = cwd / "hardware_profiles"
    for folder in (env_dir, local):
        folder.mkdir(parents=True)
    (env_dir / "cpu.yaml").write_text(_priced("cpu", 7))
    (local / "h200_x1.yaml").write_text(_priced("h200_x1", 8))
    monkeypatch.setenv(PROFILES_ENV, str(env_dir))
    monkeypatch.chdir(cwd)

    builtin = Path(dflashx.__file__).resolve().parent / "hardware_profiles"
    assert builtin == BUILTIN_DIR.resolve()  # inside the package, not at the repository's top
    assert profile_dirs() == [env_dir.resolve(), local.resolve(), builtin]

    found = available_profiles()
    assert set(BUILTIN) <= set(found)
    assert found["cpu"] == env_dir.resolve() / "cpu.yaml"  # $DFLASHX_PROFILES_DIR shadows the built-in
    assert found["h200_x1"] == local.resolve() / "h200_x1.yaml"  # so does ./hardware_profiles
    assert found["b200_nvl8"] == builtin / "b200_nvl8.yaml"  # the rest are the built-in ones
    assert load_profile("cpu").usd_per_gpu_hour == 7
    assert load_profile("h200_x1").usd_per_gpu_hour == 8

    monkeypatch.delenv(PROFILES_ENV)
    assert available_profiles()["cpu"] == builtin / "cpu.yaml"
    assert load_profile("cpu").usd_per_gpu_hour == 0


def _env() -> dict[str, str]:
    """The environment for the subprocesses: no profile folder, no path tricks, no user site, no pip
    settings that could redirect the install."""
    drop = {PROFILES_ENV, "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PIP_")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               COLUMNS="200", NO_COLOR="1")
    return env


def _run(args: list[str | Path], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _ok(out: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert out.returncode == 0, f"{out.args} exited {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def _site_dirs() -> list[str]:
    """Where this interpreter finds its packages: its own site-packages (a virtual environment's when
    it runs in one) and any other site directory on its path (a base environment's it was let see)."""
    own = [p for p in getsitepackages() if Path(p).is_dir()]
    found = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    return list(dict.fromkeys(own + found))


def _venv_seeing_this_interpreter(venv: Path, cwd: Path) -> Path:
    """A new virtual environment whose packages are its own first, then this interpreter's (a `.pth`
    file naming `_site_dirs()`); its python.

    Not `--system-site-packages`: inside a virtual environment (README's set-up) the "system" packages
    are the base interpreter's, not the ones this test runs with. The folders are plain path entries:
    their own `.pth` files (the editable dflashx's finder) are not run, so the checkout cannot shadow
    what is installed into the new environment."""
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=cwd, timeout=120))
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    inner = _ok(_run([python, "-c", "import site; print(site.getsitepackages()[0])"], cwd=cwd, timeout=60))
    Path(inner.stdout.strip(), "zz-outer-site.pth").write_text("".join(d + "\n" for d in _site_dirs()))
    return python


@pytest.mark.slow
def test_wheel_ships_the_builtin_profiles(tmp_path: Path) -> None:
    # Built offline from the installed setuptools (build isolation would download it).
    pytest.importorskip("setuptools", minversion="69", reason="building the wheel offline needs setuptools>=69")
    started = time.monotonic()

    # A copy of what the build reads (top-level files and the package), so building never writes
    # build/ or *.egg-info into the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for f in REPO.iterdir():
        if f.is_file():
            shutil.copy2(f, src / f.name)
    shutil.copytree(REPO / "dflashx", src / "dflashx",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))

    wheels = tmp_path / "wheels"
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
              "-w", wheels, src], cwd=tmp_path, timeout=300))
    (wheel,) = wheels.glob("dflashx-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"dflashx/hardware_profiles/{n}.yaml" for n in BUILTIN} <= names

    # A fresh environment that sees the heavy dependencies (and pip) of this one, with the wheel
    # installed into it; --ignore-installed: the editable dflashx outside it is neither a reason to
    # skip the install nor something to uninstall.
    venv = tmp_path / "venv"
    python = _venv_seeing_this_interpreter(venv, tmp_path)
    bindir = python.parent
    _ok(_run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", wheel],
             cwd=tmp_path, timeout=300))

    # Outside the checkout, with no hardware_profiles folder anywhere the search looks.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recipe = elsewhere / "qwen36_27b.yaml"
    shutil.copy(REPO / "recipes" / "qwen36_27b.yaml", recipe)
    assert not (elsewhere / "hardware_profiles").exists() and not (tmp_path / "hardware_profiles").exists()

    probe = ("import json, sys, dflashx; from dflashx.config.load import available_profiles; "
             "print(json.dumps({'prefix': sys.prefix, 'file': dflashx.__file__, "
             "'profiles': {k: str(v) for k, v in available_profiles().items()}}))")
    seen = json.loads(_ok(_run([python, "-c", probe], cwd=elsewhere, timeout=120)).stdout)
    site = venv.resolve()
    assert Path(seen["prefix"]).resolve() == site
    assert Path(seen["file"]).resolve().is_relative_to(site), f"the checkout shadows the wheel: {seen['file']}"
    assert set(seen["profiles"]) == set(BUILTIN)
    for name, file in seen["profiles"].items():
        assert Path(file).resolve().is_relative_to(site), (name, file)

    listed = _ok(_run([bindir / "dflashx", "profiles"], cwd=elsewhere, timeout=120)).stdout
    for name in BUILTIN:
        assert name in listed, listed

    planned = _run([bindir / "dflashx", "plan", recipe.name, "--json"], cwd=elsewhere, timeout=120)
    assert planned.returncode in (0, 1), planned.stderr  # 1: the plan has findings
    plan = json.loads(planned.stdout)
    assert isinstance(plan, dict) and plan["stages"]
    assert plan["resolved"]["hardware"]["name"] == "rtx_pro_6000_x4"
    print(f"wheel build, install and CLI runs: {time.monotonic() - started:.1f} s")
