"""The uci_datasets layout and where lazykern keeps its downloads: standard library only, so that
the ``lazykern`` command checks a dataset name, a data folder and a training-set size before it
imports torch or NumPy.

Example:
    >>> from lazykern.data.layout import FILES, NUM_SPLITS
    >>> FILES, NUM_SPLITS
    (('data.csv.gz', 'test_mask.csv.gz'), 10)
"""

from __future__ import annotations

import csv
import gzip
import os
import zlib
from pathlib import Path

__all__ = ["FILES", "NUM_SPLITS", "default_cache_dir", "training_points"]

NUM_SPLITS = 10
"""Standard train/test splits per dataset (columns of ``test_mask.csv.gz``)."""

FILES = ("data.csv.gz", "test_mask.csv.gz")
"""The files of a dataset folder: one row per point (inputs, then the target), and its test mask."""


def default_cache_dir() -> Path:
    """The download cache: ``$XDG_CACHE_HOME/lazykern/uci``, by default ``~/.cache/lazykern/uci``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "lazykern" / "uci"


def training_points(folder: Path, split: int) -> int:
    """The number of training points of ``split`` (rows whose mask column ``split`` is 0), read from
    ``folder/test_mask.csv.gz``; ``OSError`` or ``ValueError`` for a file that does not read (the
    loader then says what is wrong with it)."""
    try:
        with gzip.open(folder / FILES[1], "rt", newline="") as f:
            return sum(float(row[split]) == 0 for row in csv.reader(f) if row)
    except (EOFError, zlib.error) as err:  # a cut or damaged gzip stream raises neither of the documented two
        raise ValueError(f"{folder / FILES[1]}: {err}") from None
