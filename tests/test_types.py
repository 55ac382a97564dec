"""The library type-checks, and tells type checkers so.

mypy, configured in ``pyproject.toml`` (``[tool.mypy]``: every lazykern module but the application
wing), reports no error; ``lazykern/py.typed`` (PEP 561) ships with the package, so that a user's
type checker reads lazykern's annotations instead of treating it as untyped.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_package_ships_the_pep_561_marker():
    assert importlib.resources.files("lazykern").joinpath("py.typed").is_file()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="needs mypy (a dev dependency: pip install -e '.[dev]')")
def test_library_type_checks(tmp_path):
    # A cache of its own: a run never reads another checkout's (or another mypy's) results.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "mypy-cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mypy found errors:\n{proc.stdout[-20000:]}{proc.stderr[-5000:]}"
