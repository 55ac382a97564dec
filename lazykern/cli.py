"""The ``lazykern`` command: exact GP regression with lazy kernels on UCI data or a synthetic problem.

Usage::

    lazykern demo                                      # synthetic additive problem, no data needed
    lazykern demo --compare                            # ... next to ARD RBF kernels on the same split
    lazykern uci pol                                   # additive GP over all interaction orders on UCI pol
    lazykern uci kin40k --kernel oak --max-degree 3 --plot kin40k.png
    lazykern uci kin40k --kernel rbf-ard --json out.json
    lazykern precompile --jobs 2                       # compile the kernels' reductions ahead of the first run
    lazykern --version

The default kernel is :data:`~lazykern.kernel_names.DEFAULT_KERNEL` (``additive-ng``), trained by
:func:`lazykern.regression.fit_evaluate`'s recipe (``--optimizer``, ``--iters``, ``--lr``,
``--tolerance``). The report goes to stdout: test RMSE and NLPD next to the mean predictor's (RMSE
1.0 in standardized units) and a line of reading where a model does no better than it, the
optimizer that ran and its loss evaluations, for additive kernels the order shares and the inputs
with the largest total effects (:func:`lazykern.components.report_lines`; ``--plot FILE`` saves the
component plot), with ``--compare`` next to lazykern's and GPyTorch's ARD RBF kernels trained on the
same split. Progress bars, warnings and, with ``--verbose``, KeOps' own messages go to
stderr, as does a note when a kernel's reductions are compiled before training (the first time only:
about a second each with lazykern's CPU engine, 5-40 s each with KeOps). ``lazykern precompile``
compiles them ahead of time for the command's kernels, several at once with ``--jobs``. ``--help``,
``--version`` and mistakes in the command are answered before torch, GPyTorch or KeOps is imported;
a mistake (unknown dataset, missing data folder, split out of range, bad option) prints one line on
stderr saying what is wrong and how to fix it, and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, NoReturn, Sequence, TextIO

from . import __version__
from .keops import messages as keops_messages
from .data.checksums import SHA256
from .data.layout import FILES, NUM_SPLITS, default_cache_dir, training_points
from .kernel_names import (
    COMPARE_KERNELS,
    COMPONENT_KERNELS,
    DEFAULT_KERNEL,
    GPYTORCH_KERNELS,
    INTERACTION_KERNELS,
    KERNELS,
    OPTIMIZERS,
    TOLERANCES,
)

__all__ = ["main", "CPU_DEFAULT_N_TRAIN", "DEMO_CPU_N_TRAIN", "PRECOMPILE_DIMS"]

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

PLOT_FORMATS = (".png", ".pdf", ".svg", ".eps", ".jpg", ".jpeg")

PRECOMPILE_DIMS = (6, 26)
"""Input dimensions ``lazykern precompile`` compiles for unless told (``--dims``, ``--dataset``):
the demo's and pol's (the README's first commands)."""

LAZYKERN_KERNELS = tuple(k for k in KERNELS if k not in GPYTORCH_KERNELS)

COMPILE_TIMES = "about 1 s each with lazykern's CPU engine, 5-40 s each with KeOps on a GPU"

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


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lazykern", description="Exact GP regression with lazy KeOps kernels.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def common(sub: argparse.ArgumentParser, cpu_n_train: int, gpu_n_train: str) -> None:
        sub.add_argument("--kernel", choices=KERNELS, default=DEFAULT_KERNEL,
                         help=f"covariance (default {DEFAULT_KERNEL}: one-dimensional RBF kernels combined over "
                         "interaction orders 1..R, one variance per order)")
        sub.add_argument("--max-degree", type=_positive_int, default=None, metavar="R",
                         help=f"highest interaction order of {' and '.join(INTERACTION_KERNELS)} "
                         "(default: all orders, R = d)")
        sub.add_argument("--compare", action="store_true",
                         help=f"also train {' and '.join(COMPARE_KERNELS)} (lazykern's and GPyTorch's ARD RBF) "
                         "on the same split and report them side by side")
        sub.add_argument("--n-train", type=_int_at_least(2), default=None, metavar="N",
                         help=f"training points (default: {gpu_n_train} on a GPU, {cpu_n_train} on a CPU)")
        sub.add_argument("--optimizer", choices=OPTIMIZERS, default="auto",
                         help="lbfgs: L-BFGS with a line search (meant for the exact likelihood); adam: Adam, halving "
                         "its step on plateaus; auto (default): L-BFGS up to --max-cholesky training points, "
                         "Adam above")
        sub.add_argument("--iters", type=_positive_int, default=DEFAULT_ITERS, metavar="N",
                         help=f"most L-BFGS iterations (at most 2N loss evaluations) or Adam steps; training "
                         f"stops earlier once converged (default {DEFAULT_ITERS})")
        sub.add_argument("--lr", type=_positive_float, default=None,
                         help="initial step: default 1 for L-BFGS (its line search adapts it), 0.1 for Adam")
        sub.add_argument("--tolerance", type=_positive_float, default=None, metavar="T",
                         help="converged when the loss (nats per training point) changes by less than this per "
                         "step: between L-BFGS iterations, over Adam's plateau window of 30 steps (default "
                         f"{TOLERANCES['lbfgs']:.0e} for L-BFGS, {TOLERANCES['adam']:.0e} for Adam)")
        sub.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                         help="floating point precision (default float32; L-BFGS then finishes in float64)")
        sub.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                         help="where to run (default: cuda if available, else cpu)")
        sub.add_argument("--max-cholesky", type=_int_at_least(0), default=CHOLESKY_MAX, metavar="N",
                         help=f"exact Cholesky solves up to N training points, conjugate gradients on lazy "
                         f"matvecs above (default {CHOLESKY_MAX})")
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

    uci = commands.add_parser("uci", help="train and evaluate on a UCI dataset",
                              description="Train an exact GP on one split of a UCI dataset and report test "
                              "RMSE and NLPD. Data: --data-dir, else $LAZYKERN_DATA, else downloaded once "
                              "(checksum-verified) from the uci_datasets collection into ~/.cache/lazykern/uci.")
    uci.add_argument("dataset", help="dataset name, e.g. pol, elevators, bike, kin40k, protein, keggdirected")
    uci.add_argument("--split", type=_split, default=0, help="standard train/test split, 0-9 (default 0)")
    uci.add_argument("--data-dir", type=Path, default=None, help="folder with one sub-folder per dataset")
    common(uci, CPU_DEFAULT_N_TRAIN, "all")

    demo = commands.add_parser("demo", help="train and evaluate on a synthetic additive problem",
                               description="Train an exact GP on y = sum_j f_j(x_j) + 2.5 x1 x2 + noise, generated "
                               "in code (no files, no network).")
    demo.add_argument("--d", type=_positive_int, default=6, help="input dimensions (default 6)")
    demo.add_argument("--n-test", type=_positive_int, default=500, help="test points (default 500)")
    common(demo, DEMO_CPU_N_TRAIN, str(DEMO_GPU_N_TRAIN))

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
    return parser


@contextlib.contextmanager
def _library_output(verbose: bool) -> Iterator[None]:
    # KeOps prints its CUDA status when it is imported and a notice whenever it compiles a formula
    # (to stderr, lazykern.keops_messages). stdout carries the command's report alone (it is read,
    # piped and parsed), so library output goes to stderr with --verbose and nowhere otherwise.
    if verbose:
        with contextlib.redirect_stdout(sys.stderr), keops_messages.verbose():
            yield
    else:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), keops_messages.silenced():
            yield


def _device(choice: str):
    import torch

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise _UsageError("--device cuda was requested but no CUDA device is available; use --device cpu")
    return torch.device(choice)


def _json_to_stdout(path: Path | None) -> bool:
    return path is not None and str(path) == "-"


def _check_folder(flag: str, path: Path) -> None:
    if not path.parent.resolve().is_dir():
        raise _UsageError(f"{flag} {path}: folder {path.parent} does not exist; create it or choose another path")


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
        raise _UsageError(f"{flag}: folder does not exist; point it at the folder that holds one sub-folder per dataset "
                          f"(pol/, elevators/, ...), or leave it out to download the data")
    folder = (root if root is not None else default_cache_dir()) / args.dataset
    if args.dataset not in SHA256 and not (folder / FILES[0]).is_file():
        where = f", nor a folder of {flag}" if flag else ""
        raise _UsageError(f"unknown UCI dataset {args.dataset!r}: not in the uci_datasets collection{where}; choose "
                          f"one of: {', '.join(SHA256)}")
    if args.n_train is not None and (folder / FILES[1]).is_file():
        try:
            available = training_points(folder, args.split)
        except (OSError, ValueError, IndexError):
            return  # a damaged file: the loader says what is wrong with it
        if args.n_train > available:
            raise _UsageError(f"--n-train {args.n_train} exceeds the {available} training points of "
                              f"{args.dataset} split {args.split}; use at most {available}, or leave it out")


def _check_options(args: argparse.Namespace) -> None:
    """Mistakes a flag combination makes, found before any data is read or anything trained."""
    if args.command == "uci":
        _check_dataset(args)
    if args.json is not None and not _json_to_stdout(args.json):
        _check_folder("--json", args.json)
    if args.max_degree is not None and args.kernel not in INTERACTION_KERNELS:
        raise _UsageError(f"--max-degree applies to --kernel {' or '.join(INTERACTION_KERNELS)} only, "
                          f"not {args.kernel!r}")
    if args.plot is not None:
        if args.kernel not in COMPONENT_KERNELS:
            raise _UsageError(f"--plot needs a kernel with additive components ({', '.join(COMPONENT_KERNELS)}), "
                              f"not {args.kernel!r}")
        if args.plot.suffix.lower() not in PLOT_FORMATS:
            raise _UsageError(f"--plot {args.plot}: unknown image format {args.plot.suffix or '(no suffix)'!r}; "
                              f"use one of {', '.join(PLOT_FORMATS)}")
        _check_folder("--plot", args.plot)
        if importlib.util.find_spec("matplotlib") is None:
            raise _UsageError("--plot needs matplotlib: pip install matplotlib (or lazykern's [dev] extra)")


def _load(args: argparse.Namespace, device, dtype):
    """The data split and a sentence saying how many training points were used and why."""
    from .data import DownloadError, load_uci, synthetic_additive

    if args.command == "demo":
        if args.n_train is not None:
            n, why = args.n_train, "--n-train"
        elif device.type == "cpu":
            n, why = DEMO_CPU_N_TRAIN, "CPU default; --n-train N to change"
        else:
            n, why = DEMO_GPU_N_TRAIN, "GPU default; --n-train N to change"
        data = synthetic_additive(n, args.n_test, args.d, seed=args.seed, dtype=dtype, device=device)
        return data, f"n_train={n} synthetic points ({why})"
    kwargs = dict(split=args.split, seed=args.seed, dtype=dtype, device=device, data_dir=args.data_dir,
                  progress=not args.quiet)
    try:
        if args.n_train is not None:
            return load_uci(args.dataset, n_train=args.n_train, **kwargs), f"n_train={args.n_train} (--n-train)"
        data = load_uci(args.dataset, **kwargs)
        if device.type == "cpu" and data.n_train > CPU_DEFAULT_N_TRAIN:
            note = (f"n_train={CPU_DEFAULT_N_TRAIN}: a random subset of the {data.n_train} training points "
                    "(CPU default; --n-train N to change)")
            return load_uci(args.dataset, n_train=CPU_DEFAULT_N_TRAIN, **kwargs), note
        return data, f"n_train={data.n_train}: all training points"
    except DownloadError as err:
        raise _UsageError(f"{err}; 'lazykern demo' needs no data") from None
    except (ValueError, TypeError, OSError) as err:
        raise _UsageError(str(err)) from None


def _format_value(value: Any) -> str:
    if isinstance(value, list):
        shown = ", ".join(f"{v:.3g}" for v in value[:8])
        return f"[{shown}{', ...' if len(value) > 8 else ''}] ({len(value)} values)"
    return f"{value:.4g}"


_OPTIMIZER_NAMES = {"lbfgs": "L-BFGS", "adam": "Adam"}
SHOWN_ORDERS = 8
SHOWN_INPUTS = 5


def _training(record: dict[str, Any]) -> str:
    """What the optimizer ran against its limit (``--iters``), and whether it converged."""
    name = _OPTIMIZER_NAMES[record["optimizer_used"]] + (" (auto)" if record["optimizer"] == "auto" else "")
    ended = "converged" if record["converged"] else "NOT converged"
    lbfgs = record["optimizer_used"] == "lbfgs"
    float64 = "" if record["float64_from"] is None else \
        f" (float64 after {'iteration' if lbfgs else 'step'} {record['float64_from']})"
    if lbfgs:
        ran = f"{record['iterations']} of at most {record['iters']} iterations{float64}, {record['evaluations']} loss evaluations"
    else:
        ran = f"{record['iterations']} steps of at most {record['iters']}{float64}"
    return f"{name}: {ran}, tolerance {record['tolerance']:.0e}; {ended} ({record['stop_reason']})"


def _training_notes(record: dict[str, Any]) -> list[str]:
    """Warnings to print after the report: the iteration limit reached, the recipe stepping in."""
    notes = [f"note: {step}" for step in record["interventions"]]
    if not record["converged"]:
        notes.append(f"warning: training of {record['kernel']} stopped ({record['stop_reason']}) before it converged; "
                     f"its results are not the optimum's: raise --iters (now {record['iters']})")
    return notes


def _shares(record: dict[str, Any]) -> list[str]:
    """The order shares and the inputs ranked by total effect, with their definitions
    (:func:`lazykern.components.report_lines`, which the examples print too)."""
    from .components import report_lines

    return report_lines(record, orders=SHOWN_ORDERS, inputs=SHOWN_INPUTS)


def _readings(record: dict[str, Any], mean_predictor: dict[str, float]) -> list[str]:
    """One line for each metric on which a model does no better than the mean predictor, saying what it means."""
    kernel, rmse, nlpd = record["kernel"], record["rmse"], record["nlpd"]
    lines = []
    if rmse >= mean_predictor["rmse"]:
        lines.append(f"reading: {kernel}'s test RMSE {rmse:.4f} is no better than the mean predictor's "
                     f"{mean_predictor['rmse']:.4f}: the model has not learned how the target depends on the inputs "
                     "(did training converge? is its signal variance near zero?)")
    if nlpd >= mean_predictor["nlpd"]:
        why = ("although its RMSE is better: its predictive variances are too small for its errors "
               "(over-confident) on part of the test set" if rmse < mean_predictor["rmse"]
               else "as its RMSE: its predictions are worse than the training mean and variance")
        lines.append(f"reading: {kernel}'s test NLPD {nlpd:.4f} is worse than the mean predictor's "
                     f"{mean_predictor['nlpd']:.4f}, {why}")
    return lines


def _report(record: dict[str, Any]) -> str:
    mean = record["mean_predictor"]
    rows = [
        ("test RMSE", f"{record['rmse']:.4f}", f"{record['rmse_original']:.5g}", f"{mean['rmse']:.4f}",
         f"{mean['rmse_original']:.5g}"),
        ("test NLPD", f"{record['nlpd']:.4f}", f"{record['nlpd_original']:.5g}", f"{mean['nlpd']:.4f}",
         f"{mean['nlpd_original']:.5g}"),
    ]
    lines = [f"{record['kernel']:<20}{'standardized':>14}{'original units':>18}   "
             f"{'mean predictor: standardized':>28}{'original units':>18}"]
    lines += [f"{name:<20}{a:>14}{b:>18}   {c:>28}{d:>18}" for name, a, b, c, d in rows]
    memory = "peak CUDA allocated" if record["memory_measure"] == "cuda_max_allocated" else "peak process RSS"
    lines += [
        f"{'train time':<20}{record['train_seconds']:>13.1f}s   ({_training(record)}, "
        f"final loss {record['final_loss']:.4f}, {record['solver']})",
        f"{'predict':<20}{record['predict_seconds']:>13.2f}s",
        f"{'memory':<20}{record['peak_memory_mb']:>11.0f} MB   ({memory})",
        *_shares(record),
        "hyperparameters:",
    ]
    lines += [f"  {name} = {_format_value(value)}" for name, value in record["hyperparameters"].items()]
    return "\n".join(lines)


def _context(record: dict[str, Any]) -> str:
    """The results next to what a user would otherwise get on the same split, as a small table."""
    names = {"gpytorch-rbf-ard": "gpytorch-rbf-ard (GPyTorch)", record["kernel"]: f"{record['kernel']} (this run)"}
    lines = [
        "same split, test metrics in standardized units (lower is better):",
        f"  {'model':<30}{'RMSE':>8}{'NLPD':>9}{'train':>9}",
        f"  {'mean predictor':<30}{record['mean_predictor']['rmse']:>8.4f}"
        f"{record['mean_predictor']['nlpd']:>9.4f}{'-':>9}",
    ]
    for r in [record, *record.get("compare", [])]:
        lines.append(f"  {names.get(r['kernel'], r['kernel']):<30}{r['rmse']:>8.4f}{r['nlpd']:>9.4f}"
                     f"{r['train_seconds']:>8.1f}s")
    lines.append("  (mean predictor: the training mean and variance, RMSE 1 by construction up to sampling)")
    for r in [record, *record.get("compare", [])]:
        lines += [f"  {line}" for line in _readings(r, record["mean_predictor"])]
    if "compare" not in record:
        lines.append(f"  (--compare also trains {' and '.join(COMPARE_KERNELS)} on this split)")
    return "\n".join(lines)


def _warm_up(kernel: str, max_degree: int | None, data, device, dtype, args: argparse.Namespace) -> None:
    """Compile ``kernel``'s reductions before training, saying so on stderr when that takes a while."""
    import gpytorch
    import torch

    from .regression import make_kernel, refines_in_float64, resolve_optimizer
    from .warmup import precompile

    announced = []

    def announce(folder: str) -> None:
        if not announced:
            announced.append(folder)
            print(f"compiling the {kernel} reductions for first use: {COMPILE_TIMES}; cached in {folder}",
                  file=sys.stderr, flush=True)

    # A float32 model that L-BFGS trains is refined in float64 (lazykern.regression.train): both dtypes run.
    with gpytorch.settings.max_cholesky_size(args.max_cholesky):
        refined = refines_in_float64(dtype, resolve_optimizer(args.optimizer, data.n_train))
    module = make_kernel(kernel, data.d, max_degree).to(device)  # precompile converts a copy of it
    reports = [precompile(module, dtype=t, dims=data.d, points=data.n_train, on_compile=None if args.quiet else announce)
               for t in ((dtype, torch.float64) if refined else (dtype,))]
    compiled, cached, seconds = (sum(getattr(r, k) for r in reports) for k in ("compiled", "cached", "seconds"))
    if args.quiet:
        return
    if compiled:
        print(f"compiled {compiled} {kernel} reductions in {seconds:.1f} s", file=sys.stderr, flush=True)
    elif args.verbose:
        print(f"{kernel}: reductions cached ({cached} loaded in {seconds:.1f} s)", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    _check_options(args)  # before torch is imported: a mistake is answered at once

    import torch

    from .components import plot_components
    from .regression import fit_evaluate, gaussian_metrics

    report = sys.stderr if _json_to_stdout(args.json) else out
    device = _device(args.device)
    dtype = getattr(torch, args.dtype)
    data, note = _load(args, device, dtype)
    if args.max_degree is not None and args.max_degree > data.d:
        raise _UsageError(f"--max-degree {args.max_degree} exceeds the {data.d} input dimensions of {data.name}; "
                          f"use at most {data.d}")
    print(f"{data.name} split {data.split}: {note}; n_test={data.n_test}, d={data.d}, "
          f"{args.dtype} on {device}", file=report, flush=True)
    kernels = [args.kernel] + ([k for k in COMPARE_KERNELS if k != args.kernel] if args.compare else [])
    results = []
    for i, kernel in enumerate(kernels):
        if len(kernels) > 1 and not args.quiet:
            print(f"[{i + 1}/{len(kernels)}] {kernel}", file=sys.stderr, flush=True)
        max_degree = args.max_degree if i == 0 else None
        if kernel not in GPYTORCH_KERNELS:
            _warm_up(kernel, max_degree, data, device, dtype, args)
        torch.manual_seed(args.seed)
        results.append(fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=kernel,
                                    max_degree=max_degree, iters=args.iters, lr=args.lr,
                                    optimizer=args.optimizer, tolerance=args.tolerance, y_scale=data.y_std,
                                    max_cholesky_size=args.max_cholesky, progress=not args.quiet))
    # The training mean and variance are 0 and 1 in standardized units, by construction.
    rmse, nlpd = gaussian_metrics(torch.zeros_like(data.test_y), torch.ones_like(data.test_y), data.test_y)
    mean_predictor = {"rmse": rmse, "nlpd": nlpd, "rmse_original": rmse * data.y_std,
                      "nlpd_original": nlpd + math.log(data.y_std)}
    record = {"dataset": data.name, "split": data.split, "seed": args.seed, **results[0].to_dict(),
              "mean_predictor": mean_predictor}
    if args.compare:
        record["compare"] = [r.to_dict() for r in results[1:]]
    print(_report(record), file=report)
    print("\n" + _context(record), file=report, flush=True)
    for note in (line for result in results for line in _training_notes(result.to_dict())):
        print(note, file=sys.stderr, flush=True)
    if args.plot is not None:
        plot_components(results[0].analysis, args.plot, x_mean=data.x_mean, x_std=data.x_std, y_mean=data.y_mean,
                        y_std=data.y_std, title=f"{data.name} split {data.split}: {args.kernel}")
        print(f"wrote {args.plot}", file=report)
    if _json_to_stdout(args.json):
        print(json.dumps(record, indent=2), file=out, flush=True)
    elif args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}", file=report)
    return 0


def _dataset_dims(name: str, data_dir: Path | None, progress: bool) -> int:
    """The number of inputs of a UCI dataset, from the first row of its data (inputs, then the target)."""
    from .data import locate_uci
    from .data.checks import first_row

    try:
        path = locate_uci(name, data_dir, progress=progress) / "data.csv.gz"
        columns = first_row(path).count(",") + 1
    except (ValueError, TypeError, OSError) as err:  # DownloadError is an OSError, DataError a ValueError
        raise _UsageError(f"--dataset {name}: {err}") from None
    if columns < 2:
        raise _UsageError(f"--dataset {name}: {path} has one column; expected inputs and a target")
    return columns - 1


def _precompile_one(kernel: str, dims: int, dtype: str, device: str, verbose: bool) -> dict[str, Any]:
    """One configuration of ``lazykern precompile`` (a function of plain values: it may run in a worker process)."""
    with _library_output(verbose):  # in a worker process too: KeOps prints when it is imported
        import torch

        from .warmup import precompile
        from .regression import make_kernel

        report = precompile(make_kernel(kernel, dims).to(device), dtype=getattr(torch, dtype), dims=dims)
    return report._asdict()


def _precompile(args: argparse.Namespace, out: TextIO) -> int:
    kernels = list(dict.fromkeys(args.kernel or LAZYKERN_KERNELS))
    dtypes = list(dict.fromkeys(args.dtype or ["float32", "float64"]))
    dims = list(args.dims or [])
    for name in args.dataset or []:
        dims.append(_dataset_dims(name, args.data_dir, progress=not args.quiet))
    dims = list(dict.fromkeys(dims or PRECOMPILE_DIMS))
    device = str(_device(args.device))
    if not args.quiet and (args.verbose or device.startswith("cuda")):  # which engine, and why (GPU: its health check)
        from .backend import engine_report

        print(engine_report(device), file=sys.stderr, flush=True)
    items = [(k, d, t) for k in kernels for d in dims for t in dtypes]
    jobs = min(args.jobs, len(items))
    if not args.quiet:
        print(f"precompiling {len(items)} kernel configurations for {device}"
              f"{f' in {jobs} processes' if jobs > 1 else ''}; a reduction not cached yet takes {COMPILE_TIMES}",
              file=sys.stderr, flush=True)
    start = time.perf_counter()
    compiled = cached = 0
    failed: list[str] = []
    folders: set[str] = set()

    def done(n: int, item: tuple[str, int, str], result: dict[str, Any] | None, error: BaseException | None) -> None:
        nonlocal compiled, cached
        what = f"{item[0]} d={item[1]} {item[2]}"
        if error is not None:
            failed.append(what)
            print(f"[{n}/{len(items)}] {what}: failed: {error}", file=sys.stderr, flush=True)
            return
        compiled += result["compiled"]
        cached += result["cached"]
        folders.add(result["folder"])
        if not args.quiet:
            print(f"[{n}/{len(items)}] {what}: {result['compiled']} compiled, {result['cached']} cached, "
                  f"{result['seconds']:.1f} s", file=sys.stderr, flush=True)

    if jobs == 1:
        for n, item in enumerate(items, start=1):
            try:
                done(n, item, _precompile_one(*item, device, args.verbose), None)
            except Exception as err:  # noqa: BLE001 - one configuration's failure is reported, the rest go on
                done(n, item, None, err)
    else:
        import concurrent.futures
        import multiprocessing

        # Separate processes compile in parallel (g++ runs one core each); the cache's file locks keep
        # two of them from compiling one program at once. "spawn": nothing of this process is copied.
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_precompile_one, *item, device, args.verbose): item for item in items}
            for n, future in enumerate(concurrent.futures.as_completed(futures), start=1):
                error = future.exception()
                done(n, futures[future], None if error else future.result(), error)
    where = os.path.commonpath(sorted(folders)) if folders else "(nothing compiled)"
    print(f"precompiled {len(items) - len(failed)} of {len(items)} kernel configurations "
          f"({', '.join(kernels)}; d = {', '.join(map(str, dims))}; {', '.join(dtypes)}; {device}) "
          f"in {time.perf_counter() - start:.1f} s: {compiled} programs compiled, {cached} found cached; "
          f"cache folder {where}", file=out, flush=True)
    if failed:
        print(f"lazykern: error: precompiling failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lazykern`` console script; returns the exit status.

    Example:
        >>> from lazykern.cli import main
        >>> main(["demo", "--n-train", "200", "--n-test", "50", "--iters", "5", "--quiet"])  # doctest: +SKIP
        0
    """
    out = sys.stdout
    try:
        args = _build_parser().parse_args(argv)
        with _library_output(args.verbose):
            return (_precompile if args.command == "precompile" else _run)(args, out)
    except _UsageError as err:
        print(f"lazykern: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except SystemExit as done:  # --help and --version, answered by argparse
        return done.code if isinstance(done.code, int) else 0
    except KeyboardInterrupt:
        print("lazykern: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
