"""Mistakes in a command that the parser cannot see (a dataset that does not exist, more training
points than a split has, a flag that does not fit the kernel, a folder missing for an output),
found with the standard library before any data is read or torch imported."""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from ..data.checksums import SHA256
from ..data.layout import FILES, default_cache_dir, training_points
from ..kernel_names import COMPONENT_KERNELS, INTERACTION_KERNELS, PROJECTED_KERNELS
from .parser import CHOLESKY_MAX, PLOT_FORMATS, UsageError

__all__ = ["check_kernel_flags", "check_options", "json_to_stdout"]


def json_to_stdout(path: Path | None) -> bool:
    """Whether ``--json -`` sends the record to stdout (the report then goes to stderr, so that stdout
    carries the JSON alone).

    Example:
        >>> from pathlib import Path
        >>> from lazykern.cli.checks import json_to_stdout
        >>> json_to_stdout(Path("-")), json_to_stdout(Path("out.json")), json_to_stdout(None)
        (True, False, False)
    """
    return path is not None and str(path) == "-"


def _check_folder(flag: str, path: Path) -> None:
    if not path.parent.resolve().is_dir():
        raise UsageError(f"{flag} {path}: folder {path.parent} does not exist; create it or choose another path")


def _check_dataset(args: argparse.Namespace) -> None:
    """``lazykern uci``'s dataset: a known name or a folder of the data folder, a data folder that
    exists, and at most as many ``--n-train`` points as the split has; read with the standard library
    (before torch is imported), from the data where it is already on disk."""
    if args.data_dir is not None:
        root, flag = args.data_dir, f"--data-dir {args.data_dir}"
    elif os.environ.get("LAZYKERN_DATA"):
        root, flag = Path(os.environ["LAZYKERN_DATA"]), f"$LAZYKERN_DATA ({os.environ['LAZYKERN_DATA']})"
    else:
        root, flag = None, None
    if root is not None and not root.is_dir():
        raise UsageError(f"{flag}: folder does not exist; point it at the folder that holds one sub-folder per dataset "
                         f"(pol/, elevators/, ...), or leave it out to download the data")
    folder = (root if root is not None else default_cache_dir()) / args.dataset
    if args.dataset not in SHA256 and not (folder / FILES[0]).is_file():
        where = f", nor a folder of {flag}" if flag else ""
        raise UsageError(f"unknown UCI dataset {args.dataset!r}: not in the uci_datasets collection{where}; choose "
                         f"one of: {', '.join(SHA256)}")
    if args.n_train is not None and (folder / FILES[1]).is_file():
        try:
            available = training_points(folder, args.split)
        except (OSError, ValueError, IndexError):
            return  # a damaged file: the loader says what is wrong with it
        if args.n_train > available:
            raise UsageError(f"--n-train {args.n_train} exceeds the {available} training points of "
                             f"{args.dataset} split {args.split}; use at most {available}, or leave it out")


def check_kernel_flags(args: argparse.Namespace, kernel: str) -> None:
    """Mistakes of flags that apply to some kernels only, for ``kernel`` (the one given or planned).

    Example:
        >>> from lazykern.cli.parser import build_parser
        >>> check_kernel_flags(build_parser().parse_args(["uci", "pol", "--max-degree", "2"]), "dpa-matern52-learned")
        Traceback (most recent call last):
        lazykern.cli.parser.UsageError: --max-degree applies to --kernel additive-ng or oak only, not 'dpa-matern52-learned'
    """
    if args.max_degree is not None and kernel not in INTERACTION_KERNELS:
        raise UsageError(f"--max-degree applies to --kernel {' or '.join(INTERACTION_KERNELS)} only, "
                         f"not {kernel!r}")
    if args.projections is not None and kernel not in PROJECTED_KERNELS:
        raise UsageError(f"--projections applies to --kernel {', '.join(PROJECTED_KERNELS)} only, not {kernel!r}")
    if args.plot is not None and kernel not in COMPONENT_KERNELS:
        raise UsageError(f"--plot needs a kernel with additive components ({', '.join(COMPONENT_KERNELS)}), "
                         f"not {kernel!r}")


def check_options(args: argparse.Namespace) -> None:
    """Mistakes a flag combination makes, found before any data is read or anything trained (and
    before torch is imported, so that a mistake is answered at once).

    Args:
        args: the parsed ``uci`` or ``demo`` command line.

    Raises:
        UsageError: the first mistake, in one line that says how to fix it.

    Example:
        >>> from lazykern.cli.checks import check_options
        >>> from lazykern.cli.parser import build_parser
        >>> check_options(build_parser().parse_args(["demo", "--kernel", "rbf-ard", "--max-degree", "2"]))
        Traceback (most recent call last):
        lazykern.cli.parser.UsageError: --max-degree applies to --kernel additive-ng or oak only, not 'rbf-ard'
    """
    if args.command == "uci":
        _check_dataset(args)
    if args.json is not None and not json_to_stdout(args.json):
        _check_folder("--json", args.json)
    if args.kernel is not None:  # else the kernel depends on the device and the data: checked once planned
        check_kernel_flags(args, args.kernel)
    max_cholesky = CHOLESKY_MAX if args.max_cholesky is None else args.max_cholesky
    if args.warm_start is not None and args.warm_start > max_cholesky:
        raise UsageError(f"--warm-start {args.warm_start} exceeds --max-cholesky {max_cholesky}: the subset's fit "
                         "is exact; use at most that many points")
    if args.plot is not None:
        if args.plot.suffix.lower() not in PLOT_FORMATS:
            raise UsageError(f"--plot {args.plot}: unknown image format {args.plot.suffix or '(no suffix)'!r}; "
                             f"use one of {', '.join(PLOT_FORMATS)}")
        _check_folder("--plot", args.plot)
        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("--plot needs matplotlib: pip install matplotlib (or lazykern's [dev] extra)")
