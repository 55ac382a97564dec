r"""The whole job: :func:`fit_evaluate` runs the four steps of :mod:`lazykern.regression.steps` over
one :class:`~lazykern.regression.Recipe` and returns their records together (:class:`RegressionResult`).

Example:
    >>> import torch
    >>> from lazykern.regression import Recipe, fit_evaluate
    >>> x = torch.rand(120, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
    >>> result = fit_evaluate(x[:100], y[:100], x[100:], y[100:], kernel="rbf-ard", recipe=Recipe(iters=10),
    ...                       progress=False)
    >>> result.fitted.iterations == result.iterations <= 10
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import gpytorch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..components import ComponentAnalysis
from ..kernel_names import DEFAULT_KERNEL
from ..validation import check_positive_number
from . import steps
from .progress import JobProgress
from .recipe import NoiseFloor, Recipe
from .steps import Analyzed, Evaluated, Fitted, Prepared

__all__ = ["RegressionResult", "fit_evaluate"]


@dataclass(frozen=True)
class RegressionResult:
    """What :func:`fit_evaluate` did: the four steps' records, the trained modules and the analysis.

    Every field of ``to_dict()`` is also an attribute (``result.rmse``, ``result.order_shares``, ...),
    read from the record that holds it; ``to_dict()`` gives them all, JSON-ready, in one order (what
    ``lazykern uci --json`` writes and its report reads):

    * ``kernel``, ``n_train``, ``d``, ``dtype``, ``device``, ``max_degree``, ``num_projections``,
      ``noise_floor``, ``solver`` (:class:`~lazykern.regression.Prepared`); ``iters``, ``lr``,
      ``optimizer`` (its recipe);
    * ``optimizer_used``, ``tolerance``, ``warm_start_size``, ``warm_start_iterations``, ``final_loss``,
      ``evaluations``,
      ``iterations``, ``converged``, ``stop_reason``, ``float64_from``, ``memory_measure``
      (:class:`~lazykern.regression.Fitted`);
    * ``n_test``, ``rmse``, ``nlpd``, ``rmse_original``, ``nlpd_original``, ``computed_dtype``,
      ``hyperparameters`` (:class:`~lazykern.regression.Evaluated`);
    * the component analysis' ``order_shares``, ``dimension_shares``, ``total_effects``,
      ``total_effects_se``, ``analysis_kind``, ``total_effects_kind``, ``component_axes``
      (:class:`~lazykern.regression.Analyzed`);
    * and, over the steps: ``train_seconds`` (the noise floor's fit, the warm start and training),
      ``predict_seconds``, ``peak_memory_mb`` (the larger of training's and prediction's peaks),
      ``interventions`` (training's, then prediction's).

    Attributes:
        prepared, fitted, evaluated, analyzed: the steps' records.
        model, likelihood: the trained modules (not part of ``to_dict``).
        analysis: the :class:`lazykern.components.ComponentAnalysis` (not part of ``to_dict``), for
            :func:`lazykern.components.plot_components`, or ``None``.

    Example:
        >>> import torch
        >>> from lazykern.regression import fit_evaluate
        >>> x = torch.rand(60, 2, dtype=torch.float64)
        >>> result = fit_evaluate(x[:50], x[:50].sum(-1), x[50:], x[50:].sum(-1), kernel="rbf-ard", iters=5,
        ...                       progress=False)
        >>> list(result.to_dict())[:6], result.rmse == result.evaluated.rmse
        (['kernel', 'n_train', 'n_test', 'd', 'dtype', 'device'], True)
    """

    prepared: Prepared
    fitted: Fitted
    evaluated: Evaluated
    analyzed: Analyzed
    model: gpytorch.models.ExactGP = field(repr=False)
    likelihood: gpytorch.likelihoods.Likelihood = field(repr=False)
    analysis: ComponentAnalysis | None = field(repr=False, default=None)

    def to_dict(self) -> dict[str, Any]:
        """Every measured field (everything but the modules and the analysis), JSON-serializable."""
        p, f, e, a = self.prepared, self.fitted, self.evaluated, self.analyzed
        return {
            "kernel": p.kernel, "n_train": p.n_train, "n_test": e.n_test, "d": p.d, "dtype": p.dtype,
            "device": p.device, "iters": p.recipe.iters, "lr": p.recipe.lr, "optimizer": p.recipe.optimizer,
            "optimizer_used": f.optimizer_used, "tolerance": f.tolerance, "max_degree": p.max_degree,
            "num_projections": p.num_projections, "warm_start_size": f.warm_start_size,
            "warm_start_iterations": f.warm_start_iterations, "noise_floor": p.noise_floor, "solver": p.solver, "rmse": e.rmse, "nlpd": e.nlpd,
            "rmse_original": e.rmse_original, "nlpd_original": e.nlpd_original,
            "train_seconds": f.seconds + p.floor_seconds, "predict_seconds": e.seconds,
            "peak_memory_mb": max(f.peak_memory_mb, e.peak_memory_mb), "memory_measure": f.memory_measure,
            "final_loss": f.final_loss, "evaluations": f.evaluations, "iterations": f.iterations,
            "converged": f.converged, "stop_reason": f.stop_reason,
            "interventions": [*f.interventions, *e.interventions], "float64_from": f.float64_from,
            "computed_dtype": e.computed_dtype, "hyperparameters": e.hyperparameters,
            "order_shares": a.order_shares, "dimension_shares": a.dimension_shares,
            "total_effects": a.total_effects, "total_effects_se": a.total_effects_se,
            "analysis_kind": a.analysis_kind, "total_effects_kind": a.total_effects_kind,
            "component_axes": a.component_axes,
        }

    def __getattr__(self, name: str) -> Any:
        # Only names that are not fields reach here: the flat view of the records (read-only, the class
        # is frozen). Fields and private names are refused at once, as copy and pickle probe them
        # before the fields exist.
        if not name.startswith("_") and name not in _RECORDS:
            values = self.to_dict()
            if name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_RECORDS = frozenset(f.name for f in fields(RegressionResult))


def fit_evaluate(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    kernel: str | Kernel = DEFAULT_KERNEL,
    max_degree: int | None = None,
    num_projections: int | None = None,
    recipe: Recipe | None = None,
    y_scale: float = 1.0,
    analyze: bool = True,
    progress: bool | JobProgress = True,
    iters: int = Recipe.iters,
    lr: float | None = Recipe.lr,
    optimizer: str = Recipe.optimizer,
    tolerance: float | None = Recipe.tolerance,
    max_cholesky_size: int | None = Recipe.max_cholesky_size,
    warm_start_size: int | None = Recipe.warm_start_size,
    noise_floor: NoiseFloor | float | str | None = "auto",
) -> RegressionResult:
    r"""Build, train and evaluate an exact GP; the whole ``lazykern uci`` job on given tensors:
    :func:`~lazykern.regression.prepare`, :func:`~lazykern.regression.fit`,
    :func:`~lazykern.regression.evaluate` and :func:`~lazykern.regression.analyze` in turn.

    Targets are expected standardized; ``y_scale`` (:math:`\sigma_y`) converts the metrics to
    original units: :math:`\text{RMSE} \cdot \sigma_y` and :math:`\text{NLPD} + \log \sigma_y`.

    Args:
        train_x, train_y: ``(n, d)`` and ``(n,)`` training data.
        test_x, test_y: ``(m, d)`` and ``(m,)`` test data.
        kernel: a name from :data:`~lazykern.kernel_names.KERNELS` or a kernel module.
        max_degree: highest interaction order of a named ``additive-ng`` or ``oak`` kernel.
        num_projections: number of projections of a named projected kernel (``dpa-...``, ``rpa-...``).
        recipe: how to train and evaluate (:class:`~lazykern.regression.Recipe`).
        y_scale: standard deviation used to standardize the targets.
        analyze: for additive and interaction kernels, run the component analysis after training.
        progress: show progress bars during training; or a
            :class:`~lazykern.regression.progress.JobProgress`, one line for the whole job.
        iters, lr, optimizer, tolerance, max_cholesky_size, warm_start_size, noise_floor: the
            recipe's fields given one by one (``noise_floor`` also as the policy of a
            :class:`~lazykern.regression.NoiseFloor`), the older form of ``recipe``; beside a
            ``recipe`` they must keep their defaults (:meth:`~lazykern.regression.Recipe.of`).

    Example:
        >>> import torch
        >>> from lazykern.regression import fit_evaluate
        >>> x = torch.rand(120, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
        >>> r = fit_evaluate(x[:100], y[:100], x[100:], y[100:], kernel="additive-rbf", iters=10,
        ...                  progress=False)
        >>> r.order_shares, len(r.dimension_shares)   # first-order additive: one order, two inputs
        ([1.0], 2)
    """
    recipe = Recipe.of(recipe, iters=iters, lr=lr, optimizer=optimizer, tolerance=tolerance,
                       max_cholesky_size=max_cholesky_size, warm_start_size=warm_start_size, noise_floor=noise_floor)
    steps.check_test_data(train_x, test_x, test_y)  # before training, which a mistake here would waste
    check_positive_number("y_scale", y_scale)
    model, likelihood, prepared = steps.prepare(train_x, train_y, kernel, recipe, max_degree=max_degree,
                                                num_projections=num_projections, progress=progress)
    fitted = steps.fit(model, likelihood, prepared, progress=progress)
    evaluated = steps.evaluate(model, likelihood, prepared, test_x, test_y, y_scale=y_scale, progress=progress)
    analyzed, analysis = steps.analyze(model, prepared) if analyze else (Analyzed(), None)
    return RegressionResult(prepared, fitted, evaluated, analyzed, model, likelihood, analysis)
