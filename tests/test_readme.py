"""The README's first two commands, run as written in a copy of the repository with no data beside it.

The first command creates a virtual environment, installs lazykern and runs ``lazykern demo``; the
install steps are left out here (this interpreter already has the dependencies; ``PYTHONPATH`` and two
small launchers on ``PATH`` stand in for the copy's editable install) and every other step of the line
runs verbatim. The second, ``python3 -m pytest -q``, runs verbatim too, narrowed through pytest's own
``PYTEST_ADDOPTS`` to ``tests/test_data.py``: the whole suite inside the suite would run this test again
and take the suite's time twice. That file holds tests on made-up data (which must pass there) and
tests of the real UCI copy (which must skip, in one summary line).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REAL_DATA_REASON, ROOT

INSTALL_STEPS = ("python3 -m venv ", ". .venv/bin/activate", "python3 -m pip install ")
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", "_build",
                                     "output")


def readme_commands() -> list[str]:
    """The README's first two ```bash blocks, each one command line."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    commands = [block.strip() for block in blocks[:2]]
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    return commands


def without_install(command: str) -> str:
    steps = command.split(" && ")
    kept = [step for step in steps if not step.startswith(INSTALL_STEPS)]
    assert kept and len(kept) < len(steps), f"expected install steps and a command in: {command}"
    return " && ".join(kept)


def copy_repository(target: Path) -> None:
    """The files a clone would have: git's tracked and not-ignored files, else the tree less build output."""
    try:
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, target, ignore=COPY_IGNORE)
        return
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def launchers(folder: Path) -> Path:
    """``python3`` (this interpreter) and ``lazykern`` (its console script's equivalent) on a PATH folder."""
    folder.mkdir()
    for name, line in (("python3", f'exec "{sys.executable}" "$@"'),
                       ("lazykern", f'exec "{sys.executable}" -m lazykern.cli "$@"')):
        (folder / name).write_text(f"#!/bin/sh\n{line}\n")
        (folder / name).chmod(0o755)
    return folder


@pytest.mark.slow
def test_readme_commands_in_a_fresh_copy(tmp_path):
    first, second = readme_commands()
    assert second in (ROOT / ".ci" / "run").read_text().splitlines(), "the README's test command is CI's"
    repo = tmp_path / "lazykern"
    copy_repository(repo)
    assert not (repo.parent / "shared").exists()
    bin_dir = launchers(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LAZYKERN_", "PYTEST_", "KEOPS_", "PYKEOPS_")) and k != "XDG_CACHE_HOME"}
    env.update(HOME=str(tmp_path / "home"), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(repo))
    (tmp_path / "home").mkdir()

    def run(command: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=repo, env={**env, **extra}, capture_output=True,
                              text=True, timeout=900)

    demo = run(without_install(first))
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "test RMSE" in demo.stdout and "mean predictor" in demo.stdout
    assert "[KeOps]" not in demo.stdout

    tests = run(second, PYTEST_ADDOPTS="tests/test_data.py")
    assert tests.returncode == 0, tests.stdout[-3000:]
    summary = tests.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed, \d+ skipped(, \d+ warnings?)? in .*", summary), summary
    skip_lines = [line for line in tests.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skip_lines) == 1 and skip_lines[0].endswith(REAL_DATA_REASON), skip_lines
    assert int(re.search(r"(\d+) skipped", summary).group(1)) == int(re.search(r"\[(\d+)\]", skip_lines[0]).group(1))
