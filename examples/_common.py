"""What the examples share: their command line, where they write files, where their data come from,
and one-line errors (like the ``lazykern`` command's) instead of tracebacks for mistakes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

OUT_DEFAULT = Path(__file__).resolve().parent / "output"
"""Where the examples write files unless ``--out`` says otherwise (git-ignored)."""


def fail(message: str) -> NoReturn:
    """Print ``<example>: error: <message>`` on one line of stderr and exit with status 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see --help)")


def parser(doc: str) -> argparse.ArgumentParser:
    """The example's argument parser with the options every example has: ``--out`` and ``--data-dir``.
    Its description is the docstring's first two paragraphs (the title and the command)."""
    p = _Parser(description="\n\n".join(doc.strip().split("\n\n")[:2]),
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT_DEFAULT,
                   help=f"folder for the files it writes (default: {OUT_DEFAULT})")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder with one sub-folder per UCI dataset (default: $LAZYKERN_DATA, else downloaded)")
    return p


def training_parser(doc: str) -> argparse.ArgumentParser:
    """:func:`parser` plus the options of the examples that train an exact GP on one dataset:
    the dataset, ``--n-train`` and ``--iters`` (the recipe of :func:`lazykern.regression.train`)."""
    p = parser(doc)
    p.add_argument("dataset", nargs="?", default="pol", help="UCI dataset name, or 'synthetic' (default pol)")
    p.add_argument("--n-train", type=int, default=2000, help="training points (default 2000)")
    p.add_argument("--iters", type=int, default=200,
                   help="most training iterations (L-BFGS on the exact path, Adam on CG; default 200)")
    return p


def load(name: str, *, n_train: int | None, dtype, split: int = 0, data_dir: Path | None = None, seed: int = 0,
         device="cpu"):
    """The UCI dataset ``name`` (split, subset of ``n_train`` training points, ``None``: all), or, for
    ``name == "synthetic"``, :func:`lazykern.data.synthetic_additive` (6 inputs, no files needed).
    Mistakes (unknown name, missing folder, offline, too many points) and damaged files (the loader's
    ``DataError``, naming the file, row and column) end the example in one line."""
    from lazykern.data import load_uci, synthetic_additive

    try:
        if name == "synthetic":
            return synthetic_additive(n_train, 500, 6, seed=seed, dtype=dtype, device=device)
        return load_uci(name, split, n_train=n_train, seed=seed, dtype=dtype, device=device, data_dir=data_dir,
                        progress=True)
    except (ValueError, TypeError, OSError) as err:
        fail(str(err))


def output(folder: Path, name: str) -> Path:
    """``folder / name``, creating the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        fail(f"--out {folder}: {err.strerror}")
    return folder / name
