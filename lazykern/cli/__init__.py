"""The ``lazykern`` command: exact GP regression with lazy kernels on UCI data or a synthetic problem.

Usage::

    lazykern demo                                      # synthetic additive problem, no data needed
    lazykern demo --compare                            # ... next to ARD RBF kernels on the same split
    lazykern uci pol                                   # on a CPU: every training point, the large-N recipe
    lazykern uci pol --n-train 2000                    # additive GP over all interaction orders, 2,000 points
    lazykern uci kin40k --kernel oak --max-degree 3 --plot kin40k.png
    lazykern uci kin40k --kernel rbf-ard --json out.json
    lazykern uci pol --kernel dpa-matern52 --projections 52   # 52 diverse projections (default: 2 per input)
    lazykern precompile --jobs 2                       # compile the kernels' reductions ahead of the first run
    lazykern --version

The default kernel is :data:`~lazykern.kernel_names.DEFAULT_KERNEL` (``additive-ng``) up to 2,000
training points, and on a CPU above that :data:`~lazykern.kernel_names.LARGE_N_KERNEL` on all of them
by :data:`lazykern.regression.recipe.LARGE_N` (``docs/large_n.rst``), trained by
:func:`lazykern.regression.fit_evaluate` with the :class:`~lazykern.regression.Recipe` the flags
describe (``--optimizer``, ``--iters``, ``--lr``, ``--tolerance``, ``--max-cholesky``,
``--warm-start``, ``--warm-start-iters``, ``--noise-floor``). The report goes to stdout: test RMSE and NLPD next to the mean predictor's (RMSE
1.0 in standardized units) and a line of reading where a model does no better than it, the
optimizer that ran and its loss evaluations, for additive kernels the order shares and the inputs
with the largest total effects (:func:`lazykern.components.report_lines`; ``--plot FILE`` saves the
component plot), with ``--compare`` next to lazykern's and GPyTorch's ARD RBF kernels trained on the
same split. Progress bars, warnings and, with ``--verbose``, KeOps' own messages go to
stderr, as does a note when a kernel's reductions are compiled before training (the first time only;
``docs/performance.rst`` says how long that takes). ``lazykern precompile`` compiles them ahead of
time for the command's kernels, several at once with ``--jobs``. ``--help``,
``--version`` and mistakes in the command are answered before torch, GPyTorch or KeOps is imported;
a mistake (unknown dataset, missing data folder, split out of range, bad option) prints one line on
stderr saying what is wrong and how to fix it, and exits with status 2.

One job per module: ``parser`` (the options, standard library only), ``checks`` (mistakes found
before anything heavy is imported), ``train`` (``uci`` and ``demo``), ``precompile``, ``report``
(the text of the results) and ``runtime`` (the device, and where library output goes).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator, Sequence

from . import precompile, train
from .parser import CPU_DEFAULT_N_TRAIN, DEMO_CPU_N_TRAIN, PRECOMPILE_DIMS, UsageError, build_parser
from .runtime import library_output

__all__ = ["main", "CPU_DEFAULT_N_TRAIN", "DEMO_CPU_N_TRAIN", "PRECOMPILE_DIMS"]

USAGE_ERROR = 2
"""The exit status of a mistake in the command line."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lazykern`` console script; returns the exit status.

    Args:
        argv: the command line without the program's name (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 1 where ``lazykern precompile`` failed for a configuration, 2 for a mistake in
        the command line (said in one line on stderr), 130 when interrupted.

    Example:
        >>> from lazykern.cli import main
        >>> main(["demo", "--n-train", "0"])   # a mistake: one line on stderr, status 2
        2
    """
    out = sys.stdout
    with _interrupts() as interrupted:
        try:
            args = build_parser().parse_args(argv)
            with library_output(args.verbose):
                return (precompile.run if args.command == "precompile" else train.run)(args, out)
        except UsageError as err:
            print(f"lazykern: error: {err}", file=sys.stderr)
            return USAGE_ERROR
        except SystemExit as done:  # --help and --version, answered by argparse
            return done.code if isinstance(done.code, int) else 0
        except Exception:
            if not interrupted:
                raise
            print("lazykern: interrupted", file=sys.stderr)  # a Ctrl-C that landed inside an import
            return 130
        except KeyboardInterrupt:
            print("lazykern: interrupted", file=sys.stderr)
            return 130


@contextlib.contextmanager
def _interrupts() -> Iterator[list[bool]]:
    """A list that holds ``True`` once Ctrl-C was pressed: a KeyboardInterrupt raised inside an
    import (torch, scikit-learn and NumPy import lazily) can surface as another exception from the
    half-imported module, and the command still ends with one line."""
    seen: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def note(signum: int, frame: object) -> None:
        seen.append(True)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)
