"""The report of ``lazykern uci`` and ``lazykern demo``, as text made from the JSON record: the
test metrics next to the mean predictor's, how training went, what an additive model learned,
the hyperparameters, and a table of every kernel trained on the split."""

from __future__ import annotations

from typing import Any

from ..kernel_names import COMPARE_KERNELS
from .parser import CPU_DEFAULT_N_TRAIN

__all__ = ["results_text", "comparison_text", "training_notes"]


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


def training_notes(record: dict[str, Any]) -> list[str]:
    """Warnings to print after the report: the recipe stepping in (``interventions``), the iteration
    limit reached before convergence.

    Args:
        record: a run's record (:meth:`lazykern.regression.RegressionResult.to_dict`).

    Example:
        >>> from lazykern.cli.report import training_notes
        >>> training_notes({"interventions": [], "converged": False, "stop_reason": "iteration limit",
        ...                 "kernel": "rbf-ard", "iters": 15})  # doctest: +NORMALIZE_WHITESPACE
        ["warning: training of rbf-ard stopped (iteration limit) before it converged; its results are not the
         optimum's: raise --iters (now 15)"]
    """
    notes = [f"note: {step}" for step in record["interventions"]]
    if not record["converged"]:
        notes.append(f"warning: training of {record['kernel']} stopped ({record['stop_reason']}) before it converged; "
                     f"its results are not the optimum's: raise --iters (now {record['iters']})")
    return notes


def _shares(record: dict[str, Any]) -> list[str]:
    """The order shares and the inputs ranked by total effect, with their definitions
    (:func:`lazykern.components.report_lines`, which the examples print too)."""
    from ..components import report_lines  # imports torch: loaded once there is a result to report

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


def results_text(record: dict[str, Any]) -> str:
    """The first kernel's results, one item a line: test metrics next to the mean predictor's, in
    standardized and original units; training (optimizer, iterations, convergence, loss, solver);
    prediction time; peak memory; what an additive model learned (:func:`lazykern.components.report_lines`);
    the hyperparameters.

    Args:
        record: the command's record: a run's fields (:meth:`lazykern.regression.RegressionResult.to_dict`)
            and ``mean_predictor``.
    """
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
        f"final loss {record['final_loss']:.4f}, {record['solver']}"
        + (f", from an exact fit on {record['warm_start_size']} points" if record.get("warm_start_size") else "")
        + (f", noise at least {record['noise_floor']:.3g})" if record.get("noise_floor") else ")"),
        f"{'predict':<20}{record['predict_seconds']:>13.2f}s",
        f"{'memory':<20}{record['peak_memory_mb']:>11.0f} MB   ({memory})",
        *_shares(record),
        "hyperparameters:",
    ]
    lines += [f"  {name} = {_format_value(value)}" for name, value in record["hyperparameters"].items()]
    return "\n".join(lines)


def comparison_text(record: dict[str, Any]) -> str:
    """The results next to what a user would otherwise get on the same split, as a small table: the
    mean predictor, the run, and ``--compare``'s kernels (``record["compare"]``), with a line of
    reading for each that does no better than the mean predictor.

    Args:
        record: the command's record: a run's fields, ``mean_predictor`` and optionally ``compare``.

    Example:
        >>> from lazykern.cli.report import comparison_text
        >>> mean = {"rmse": 1.0, "nlpd": 1.42}
        >>> print(comparison_text({"kernel": "oak", "rmse": 0.3, "nlpd": 0.2, "train_seconds": 4.0,
        ...                        "mean_predictor": mean}))  # doctest: +NORMALIZE_WHITESPACE
        same split, test metrics in standardized units (lower is better):
          model                             RMSE     NLPD    train
          mean predictor                  1.0000   1.4200        -
          oak (this run)                  0.3000   0.2000     4.0s
          (mean predictor: the training mean and variance, RMSE 1 by construction up to sampling)
          (--compare also trains rbf-ard and gpytorch-rbf-ard on this split)
    """
    names = {"gpytorch-rbf-ard": "gpytorch-rbf-ard (GPyTorch)", record["kernel"]: f"{record['kernel']} (this run)"}
    width = max(30, *(len(name) + 2 for name in names.values()))
    lines = [
        "same split, test metrics in standardized units (lower is better):",
        f"  {'model':<{width}}{'RMSE':>8}{'NLPD':>9}{'train':>9}",
        f"  {'mean predictor':<{width}}{record['mean_predictor']['rmse']:>8.4f}"
        f"{record['mean_predictor']['nlpd']:>9.4f}{'-':>9}",
    ]
    for r in [record, *record.get("compare", [])]:
        lines.append(f"  {names.get(r['kernel'], r['kernel']):<{width}}{r['rmse']:>8.4f}{r['nlpd']:>9.4f}"
                     f"{r['train_seconds']:>8.1f}s")
    lines.append("  (mean predictor: the training mean and variance, RMSE 1 by construction up to sampling)")
    for r in [record, *record.get("compare", [])]:
        lines += [f"  {line}" for line in _readings(r, record["mean_predictor"])]
    if "compare" not in record:
        subset = " (with --n-train N: on a subset)" if record.get("n_train", 0) > CPU_DEFAULT_N_TRAIN else ""
        lines.append(f"  (--compare also trains {' and '.join(COMPARE_KERNELS)} on this split{subset})")
    return "\n".join(lines)
