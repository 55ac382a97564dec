"""The ``lazykern`` command: exact GP regression with lazy kernels on UCI data or a synthetic problem.

Usage::

    lazykern uci pol                                   # additive RBF GP on pol, split 0
    lazykern uci kin40k --kernel rbf-ard --json out.json
    lazykern demo                                      # synthetic additive problem, no data needed

Mistakes in the command (unknown dataset, missing data folder, split out of range, bad option) print
one line on stderr saying what is wrong and how to fix it, and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

__all__ = ["main", "CPU_DEFAULT_N_TRAIN"]

CPU_DEFAULT_N_TRAIN = 2000
"""Training points used on a CPU when ``--n-train`` is not given (a GPU uses them all)."""

DEMO_GPU_N_TRAIN = 10000
"""Synthetic training points ``lazykern demo`` draws on a GPU when ``--n-train`` is not given."""

CHOLESKY_MAX = 2000
"""Default ``--max-cholesky``: up to this many training points a dense Cholesky factor (16 MB in
float32) is cheaper on a CPU than conjugate gradients, and exact."""

USAGE_ERROR = 2


class _UsageError(Exception):
    """A mistake in the command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block before its message; one line is easier to read and grep.
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    from .regression import KERNELS

    parser = _Parser(prog="lazykern", description="Exact GP regression with lazy KeOps kernels.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(sub: argparse.ArgumentParser, default_kernel: str, gpu_n_train: str) -> None:
        sub.add_argument("--kernel", choices=KERNELS, default=default_kernel,
                         help=f"covariance (default {default_kernel})")
        sub.add_argument("--n-train", type=_positive_int, default=None, metavar="N",
                         help=f"training points (default: {gpu_n_train} on a GPU, {CPU_DEFAULT_N_TRAIN} on a CPU)")
        sub.add_argument("--iters", type=_positive_int, default=50, help="Adam steps (default 50)")
        sub.add_argument("--lr", type=_positive_float, default=0.1, help="Adam learning rate (default 0.1)")
        sub.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                         help="floating point precision (default float32)")
        sub.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                         help="where to run (default: cuda if available, else cpu)")
        sub.add_argument("--max-cholesky", type=_int_at_least(0), default=CHOLESKY_MAX, metavar="N",
                         help=f"exact Cholesky solves up to N training points, conjugate gradients on lazy "
                         f"matvecs above (default {CHOLESKY_MAX})")
        sub.add_argument("--seed", type=int, default=0, help="seed of subsampling and training (default 0)")
        sub.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
        sub.add_argument("--quiet", action="store_true", help="no progress bar")

    uci = commands.add_parser("uci", help="train and evaluate on a UCI dataset",
                              description="Train an exact GP on one split of a UCI dataset and report test "
                              "RMSE and NLPD. Data: --data-dir, else $LAZYKERN_DATA, else downloaded.")
    uci.add_argument("dataset", help="dataset name, e.g. pol, elevators, bike, kin40k, protein, keggdirected")
    uci.add_argument("--split", type=int, default=0, help="standard train/test split, 0-9 (default 0)")
    uci.add_argument("--data-dir", type=Path, default=None, help="folder with one sub-folder per dataset")
    common(uci, "additive-rbf", "all")

    demo = commands.add_parser("demo", help="train and evaluate on a synthetic additive problem",
                               description="Train an exact GP on y = sum_j f_j(x_j) + noise, generated in code.")
    demo.add_argument("--d", type=_positive_int, default=6, help="input dimensions (default 6)")
    demo.add_argument("--n-test", type=_positive_int, default=500, help="test points (default 500)")
    common(demo, "additive-rbf", str(DEMO_GPU_N_TRAIN))
    return parser


def _device(choice: str):
    import torch

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise _UsageError("--device cuda was requested but no CUDA device is available; use --device cpu")
    return torch.device(choice)


def _check_json_path(path: Path | None) -> None:
    if path is not None and not path.parent.resolve().is_dir():
        raise _UsageError(f"--json {path}: folder {path.parent} does not exist; create it or choose another path")


def _load(args: argparse.Namespace, device, dtype):
    """The data split and a sentence saying how many training points were used and why."""
    from .data import load_uci, synthetic_additive

    if args.command == "demo":
        n = args.n_train or (CPU_DEFAULT_N_TRAIN if device.type == "cpu" else DEMO_GPU_N_TRAIN)
        data = synthetic_additive(n, args.n_test, args.d, seed=args.seed, dtype=dtype, device=device)
        return data, f"n_train={n} synthetic points"
    kwargs = dict(split=args.split, seed=args.seed, dtype=dtype, device=device, data_dir=args.data_dir)
    try:
        if args.n_train is not None:
            return load_uci(args.dataset, n_train=args.n_train, **kwargs), f"n_train={args.n_train} (--n-train)"
        data = load_uci(args.dataset, **kwargs)
        if device.type == "cpu" and data.n_train > CPU_DEFAULT_N_TRAIN:
            note = (f"n_train={CPU_DEFAULT_N_TRAIN}: a random subset of the {data.n_train} training points "
                    "(CPU default; --n-train N to change)")
            return load_uci(args.dataset, n_train=CPU_DEFAULT_N_TRAIN, **kwargs), note
        return data, f"n_train={data.n_train}: all training points"
    except (ValueError, TypeError, OSError) as err:
        raise _UsageError(str(err)) from None


def _format_value(value: Any) -> str:
    if isinstance(value, list):
        shown = ", ".join(f"{v:.3g}" for v in value[:8])
        return f"[{shown}{', ...' if len(value) > 8 else ''}] ({len(value)} values)"
    return f"{value:.4g}"


def _report(record: dict[str, Any]) -> str:
    rows = [
        ("test RMSE", f"{record['rmse']:.4f}", f"{record['rmse_original']:.5g}"),
        ("test NLPD", f"{record['nlpd']:.4f}", f"{record['nlpd_original']:.5g}"),
    ]
    lines = [f"{'':<12}{'standardized':>14}{'original units':>18}"]
    lines += [f"{name:<12}{a:>14}{b:>18}" for name, a, b in rows]
    memory = "peak process RSS" if record["memory_measure"] == "process_peak_rss" else "peak CUDA allocated"
    lines += [
        f"{'train time':<12}{record['train_seconds']:>13.1f}s   ({record['iters']} Adam steps, "
        f"final loss {record['final_loss']:.4f})",
        f"{'predict':<12}{record['predict_seconds']:>13.2f}s",
        f"{'memory':<12}{record['peak_memory_mb']:>11.0f} MB   ({memory})",
        "hyperparameters:",
    ]
    lines += [f"  {name} = {_format_value(value)}" for name, value in record["hyperparameters"].items()]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    import torch

    from .regression import fit_evaluate

    _check_json_path(args.json)
    device = _device(args.device)
    dtype = getattr(torch, args.dtype)
    data, note = _load(args, device, dtype)
    print(f"{data.name} split {data.split}: {note}; n_test={data.n_test}, d={data.d}, "
          f"kernel={args.kernel}, {args.dtype} on {device}", flush=True)
    torch.manual_seed(args.seed)
    result = fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=args.kernel,
                          iters=args.iters, lr=args.lr, y_scale=data.y_std, max_cholesky_size=args.max_cholesky,
                          progress=not args.quiet)
    record = {"dataset": data.name, "split": data.split, "seed": args.seed, **result.to_dict()}
    print(_report(record))
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lazykern`` console script; returns the exit status.

    Example:
        >>> from lazykern.cli import main
        >>> main(["demo", "--n-train", "200", "--n-test", "50", "--iters", "5", "--quiet"])  # doctest: +SKIP
        0
    """
    try:
        args = _build_parser().parse_args(argv)
        return _run(args)
    except _UsageError as err:
        print(f"lazykern: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("lazykern: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
