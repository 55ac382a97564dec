"""The command line's grammar: the commands, every option with its default and its check, and the
defaults that depend on the device. Standard library only (and lazykern's plain-name modules), so
that ``--help``, ``--version`` and a mistake in an option are answered before torch, GPyTorch or
KeOps is imported."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import NoReturn

from .. import __version__
from ..data.layout import NUM_SPLITS
from ..kernel_names import (
    COMPARE_KERNELS,
    COMPONENT_KERNELS,
    DEFAULT_KERNEL,
    GPYTORCH_KERNELS,
    INTERACTION_KERNELS,
    KERNELS,
    LARGE_N_KERNEL,
    LARGE_N_MAX_PROJECTIONS,
    LEARNED_PROJECTION_KERNELS,
    OPTIMIZERS,
    PROJECTED_KERNELS,
    PROJECTIONS_PER_DIMENSION,
    TOLERANCES,
)

__all__ = ["build_parser", "UsageError", "CPU_DEFAULT_N_TRAIN", "DEMO_CPU_N_TRAIN", "DEMO_GPU_N_TRAIN", "CHOLESKY_MAX",
           "DEFAULT_ITERS", "PLOT_FORMATS", "PRECOMPILE_DIMS", "LAZYKERN_KERNELS", "COMPILE_TIMES"]


CPU_DEFAULT_N_TRAIN = 2000
"""Training points ``lazykern uci`` uses on a CPU when ``--n-train`` is not given (a GPU uses them all)."""

DEMO_CPU_N_TRAIN = 500
"""Synthetic training points ``lazykern demo`` draws on a CPU when ``--n-train`` is not given: enough
for an accurate fit of the six-dimensional additive function, small enough to answer in seconds."""

DEMO_GPU_N_TRAIN = 10000
"""Synthetic training points ``lazykern demo`` draws on a GPU when ``--n-train`` is not given."""

CHOLESKY_MAX = 2000
"""Default ``--max-cholesky``: up to this many training points a dense Cholesky factor (16 MB in
float32) is cheaper on a CPU than conjugate gradients, and exact."""

DEFAULT_ITERS = 200
"""fit_evaluate's default ``iters`` (tests/test_cli.py checks they agree), repeated here because the
parser answers before lazykern.regression (torch, GPyTorch) is imported."""

LARGE_N_ITERS, LARGE_N_LR, LARGE_N_WARM_START, LARGE_N_WARM_START_ITERS = 150, 0.01, 2000, 150
"""The large-N recipe's budget, step and warm start (:data:`lazykern.regression.recipe.LARGE_N`; tests/test_cli.py
checks they agree), for the help text, which is answered before torch is imported."""

PLOT_FORMATS = (".png", ".pdf", ".svg", ".eps", ".jpg", ".jpeg")

PRECOMPILE_DIMS = (6, 26)
"""Input dimensions ``lazykern precompile`` compiles for unless told (``--dims``, ``--dataset``):
the demo's and pol's (the README's first commands)."""

LAZYKERN_KERNELS = tuple(k for k in KERNELS if k not in GPYTORCH_KERNELS)

COMPILE_TIMES = "about 1 s each with lazykern's CPU engine, 5-40 s each with KeOps on a GPU"


class UsageError(Exception):
    """A mistake in the command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the whole usage block before its message; one line is easier to read and grep.
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


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


def _split(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < NUM_SPLITS:
        raise argparse.ArgumentTypeError(f"expected one of the {NUM_SPLITS} standard splits, 0-{NUM_SPLITS - 1}, "
                                         f"got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _noise_floor(text: str) -> float | str | None:
    if text in ("ard", "auto"):
        return text
    if text == "none":
        return None
    try:
        return _positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive number, 'ard' or 'none', got {text!r}") from None


def _training_options(sub: argparse.ArgumentParser, cpu_n_train: int, gpu_n_train: str) -> None:
    """The options ``uci`` and ``demo`` share: the kernel, the recipe, the run and its outputs."""
    sub.add_argument("--kernel", choices=KERNELS, default=None,
                     help=f"covariance (default: on a CPU, for a dataset of more than {CPU_DEFAULT_N_TRAIN} "
                     f"training points, {LARGE_N_KERNEL} on all of them by the large-N recipe; else "
                     f"{DEFAULT_KERNEL}: one-dimensional RBF kernels combined over interaction orders 1..R, one "
                     "variance per order)")
    sub.add_argument("--max-degree", type=_positive_int, default=None, metavar="R",
                     help=f"highest interaction order of {' and '.join(INTERACTION_KERNELS)} "
                     "(default: all orders, R = d)")
    sub.add_argument("--projections", type=_positive_int, default=None, metavar="J",
                     help=f"number of projections of {', '.join(PROJECTED_KERNELS)} "
                     f"(default: {PROJECTIONS_PER_DIMENSION} per input dimension, J = {PROJECTIONS_PER_DIMENSION}d; "
                     f"{LARGE_N_KERNEL} on all training points: 8 per input, at most {LARGE_N_MAX_PROJECTIONS})")
    sub.add_argument("--compare", action="store_true",
                     help=f"also train {' and '.join(COMPARE_KERNELS)} (lazykern's and GPyTorch's ARD RBF) "
                     "on the same split and report them side by side")
    sub.add_argument("--n-train", type=_int_at_least(2), default=None, metavar="N",
                     help=f"training points, a random subset (default: {gpu_n_train} on a GPU; on a CPU "
                     f"{cpu_n_train}, or all of them where the kernel trains on all by the large-N recipe)")
    sub.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                     help="lbfgs: L-BFGS with a line search (meant for the exact likelihood); adam: Adam, halving "
                     "its step on plateaus; auto (default): L-BFGS up to --max-cholesky training points, "
                     "Adam above (the large-N recipe: adam)")
    sub.add_argument("--iters", type=_positive_int, default=None, metavar="N",
                     help=f"most L-BFGS iterations (at most 2N loss evaluations) or Adam steps on all training "
                     f"points; training stops earlier once converged (default {DEFAULT_ITERS}; the large-N "
                     f"recipe: {LARGE_N_ITERS})")
    sub.add_argument("--lr", type=_positive_float, default=None,
                     help="initial step: default 1 for L-BFGS (its line search adapts it), 0.1 for Adam (the "
                     f"large-N recipe: {LARGE_N_LR})")
    sub.add_argument("--tolerance", type=_positive_float, default=None, metavar="T",
                     help="converged when the loss (nats per training point) changes by less than this per "
                     "step: between L-BFGS iterations, over Adam's plateau window of 30 steps (default "
                     f"{TOLERANCES['lbfgs']:.0e} for L-BFGS, {TOLERANCES['adam']:.0e} for Adam)")
    sub.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                     help="floating point precision (default float32; L-BFGS then finishes in float64, and on a CPU "
                          "conjugate gradients run in float64)")
    sub.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="where to run (default: cuda if available, else cpu)")
    sub.add_argument("--max-cholesky", type=_int_at_least(0), default=None, metavar="N",
                     help=f"exact Cholesky solves up to N training points, conjugate gradients on lazy "
                     f"matvecs above (default {CHOLESKY_MAX})")
    sub.add_argument("--warm-start", type=_positive_int, default=None, metavar="M",
                     help="start from hyperparameters fitted exactly (L-BFGS, Cholesky) on a random subset "
                     "of M of the training points, at most --max-cholesky (default: from the recipe's "
                     f"initialization; the large-N recipe: {LARGE_N_WARM_START} points)")
    sub.add_argument("--warm-start-iters", type=_positive_int, default=None, metavar="N",
                     help="most L-BFGS iterations of the warm start's fit, its own budget beside --iters "
                     f"(default: --iters; the large-N recipe: {LARGE_N_WARM_START_ITERS})")
    sub.add_argument("--noise-floor", type=_noise_floor, default="auto", metavar="V",
                     help="lower bound of the noise variance (standardized targets) of --kernel's model, for "
                     "kernels that can explain the noise, such as learned projections; 'ard': the noise ARD "
                     "RBF fits exactly on 1,000 of the training points (its seconds count as training); "
                     f"'none': GPyTorch's 1e-4; --compare's models keep 1e-4 (default 'auto': 'ard' for "
                     f"{', '.join(LEARNED_PROJECTION_KERNELS)}, 'none' for the others)")
    sub.add_argument("--seed", type=int, default=0, help="seed of subsampling and training (default 0)")
    sub.add_argument("--json", type=Path, default=None, metavar="PATH",
                     help="also write the results as JSON ('-': to stdout, the report then goes to stderr)")
    sub.add_argument("--plot", type=Path, default=None, metavar="FILE",
                     help=f"save the component plot of an additive kernel ({', '.join(COMPONENT_KERNELS)}): "
                     f"each input's component with its band, the order and input shares "
                     f"({', '.join(PLOT_FORMATS)})")
    sub.add_argument("--quiet", action="store_true", help="no progress bars or compile notes")
    sub.add_argument("--verbose", action="store_true",
                     help="show KeOps' own messages, and kernels whose reductions were cached (on stderr)")


def build_parser() -> argparse.ArgumentParser:
    """The ``lazykern`` parser: its commands ``uci``, ``demo`` and ``precompile`` and their options; a
    mistake raises :class:`UsageError` (one line) instead of argparse's usage block and exit.

    Example:
        >>> from lazykern.cli.parser import build_parser
        >>> args = build_parser().parse_args(["uci", "pol", "--warm-start", "500", "--warm-start-iters", "50"])
        >>> args.dataset, args.warm_start, args.warm_start_iters, args.noise_floor
        ('pol', 500, 50, 'auto')
    """
    parser = _Parser(prog="lazykern", description="Exact GP regression with lazy KeOps kernels.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    uci = commands.add_parser("uci", help="train and evaluate on a UCI dataset",
                              description="Train an exact GP on one split of a UCI dataset and report test "
                              "RMSE and NLPD. Data: --data-dir, else $LAZYKERN_DATA, else downloaded once "
                              "(checksum-verified) from the uci_datasets collection into ~/.cache/lazykern/uci.")
    uci.add_argument("dataset", help="dataset name, e.g. pol, elevators, bike, kin40k, protein, keggdirected")
    uci.add_argument("--split", type=_split, default=0, help="standard train/test split, 0-9 (default 0)")
    uci.add_argument("--data-dir", type=Path, default=None, help="folder with one sub-folder per dataset")
    _training_options(uci, CPU_DEFAULT_N_TRAIN, "all")

    demo = commands.add_parser("demo", help="train and evaluate on a synthetic additive problem",
                               description="Train an exact GP on y = sum_j f_j(x_j) + 2.5 x1 x2 + noise, generated "
                               "in code (no files, no network).")
    demo.add_argument("--d", type=_positive_int, default=6, help="input dimensions (default 6)")
    demo.add_argument("--n-test", type=_positive_int, default=500, help="test points (default 500)")
    _training_options(demo, DEMO_CPU_N_TRAIN, str(DEMO_GPU_N_TRAIN))

    _precompile_parser(commands)
    return parser


def _precompile_parser(commands) -> None:
    """``lazykern precompile`` and its options."""
    pre = commands.add_parser("precompile", help="compile the kernels' reductions ahead of the first run",
                              description="Compile the reductions that training and prediction with the "
                              "command's kernels run, into the cache that later runs read (one line per "
                              "kernel, dimension and dtype on stderr; a summary on stdout). Reductions depend "
                              "on the kernel, the number of input dimensions and the dtype, never on the "
                              f"number of points. Compiling takes {COMPILE_TIMES}.")
    pre.add_argument("--kernel", choices=LAZYKERN_KERNELS, nargs="+", action="extend", default=None, metavar="K",
                     help=f"kernels to compile (default: all of lazykern's: {', '.join(LAZYKERN_KERNELS)})")
    pre.add_argument("--dims", type=_positive_int, nargs="+", action="extend", default=None, metavar="D",
                     help="numbers of input dimensions (default: "
                     f"{' and '.join(map(str, PRECOMPILE_DIMS))}, the demo's and pol's, unless --dataset is given)")
    pre.add_argument("--dataset", nargs="+", action="extend", default=None, metavar="NAME",
                     help="also compile for the input dimensions of these UCI datasets (read from their data, "
                     "found as for 'lazykern uci')")
    pre.add_argument("--data-dir", type=Path, default=None, help="folder with one sub-folder per dataset")
    pre.add_argument("--dtype", choices=("float32", "float64"), nargs="+", action="extend", default=None,
                     help="floating point precisions (default float32 and float64: 'lazykern uci' trains in "
                     "float32 and refines L-BFGS's optimum in float64)")
    pre.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="where the kernels will run (default: cuda if available, else cpu)")
    pre.add_argument("--jobs", type=_positive_int, default=1, metavar="J",
                     help="compile up to J kernel configurations at once, in separate processes (default 1)")
    pre.add_argument("--quiet", action="store_true", help="no progress lines")
    pre.add_argument("--verbose", action="store_true", help="show KeOps' own messages (on stderr)")
