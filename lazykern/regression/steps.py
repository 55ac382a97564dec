r"""The training job as four steps over one :class:`~lazykern.regression.Recipe`, each returning a
frozen record of what it did:

1. :func:`~lazykern.regression.prepare`: resolve the recipe and its noise floor, build the model
   (:class:`~lazykern.regression.Prepared`);
2. :func:`~lazykern.regression.fit`: the warm start, then training (:class:`~lazykern.regression.Fitted`);
3. :func:`~lazykern.regression.evaluate`: predict, in float64 where float32 fails, check LOVE's
   variances on the conjugate-gradient path, score (:class:`~lazykern.regression.Evaluated`);
4. :func:`~lazykern.regression.analyze`: the component analysis of an additive model
   (:class:`~lazykern.regression.Analyzed`).

:func:`~lazykern.regression.fit_evaluate` runs the four in turn; a caller who wants to look at the
model between them, or to skip one, runs them itself. The records hold numbers and words only
(what ``lazykern uci --json`` writes); the model, its likelihood and the analysis travel beside them.

Example:
    >>> import torch
    >>> from lazykern.regression import Recipe, analyze, evaluate, fit, prepare
    >>> x = torch.rand(120, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
    >>> model, likelihood, prepared = prepare(x[:100], y[:100], "additive-rbf", Recipe(iters=10))
    >>> fitted = fit(model, likelihood, prepared, progress=False)
    >>> evaluated = evaluate(model, likelihood, prepared, x[100:], y[100:])
    >>> analyzed, analysis = analyze(model, prepared)
    >>> prepared.solver, fitted.iterations <= 10, evaluated.rmse < 1, analyzed.order_shares
    ('cholesky', True, True, [1.0])
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import gpytorch
import linear_operator
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from .. import kernels as lazy_kernels
from ..components import ComponentAnalysis, component_analysis, summary
from ..kernel_names import DEFAULT_KERNEL
from ..timing import PeakMemory, Stopwatch
from ..validation import check_floating_matrix, check_positive_number
from . import prediction
from .model import ExactGPRegressor, build_model, hyperparameters
from .recipe import Recipe, learns_projections
from .selection import fit_ard, scale_learned_directions, warm_start
from .progress import JobProgress, in_phase
from .training import NUMERICAL_FAILURES, TrainingLog, resolve_optimizer, to_float64, train

__all__ = ["Analyzed", "Evaluated", "Fitted", "Prepared", "analyze", "evaluate", "fit", "prepare"]


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` decided before training.

    Attributes:
        kernel: the kernel's name (or its class name, for a module).
        n_train, d: training points and input dimensions.
        dtype, device: the training inputs' dtype and device.
        max_degree: highest interaction order of the kernel built (``None`` for kernels without orders).
        num_projections: number of projections J of a projected kernel (``None`` for the others).
        noise_floor: the lower bound of the noise variance the model was built with, or ``None``.
        floor_seconds: wall-clock time of resolving the floor and the recipe's ``ard_start`` (an ARD
            fit, where they took one).
        solver: ``"cholesky"`` or ``"cg"`` (conjugate gradients and Lanczos on lazy matvecs): how
            training and prediction solve with the kernel matrix.
        recipe: the recipe as it runs (``max_cholesky_size`` resolved).

    Example:
        >>> import gpytorch, torch
        >>> from lazykern.regression import prepare
        >>> x = torch.rand(40, 3)
        >>> with gpytorch.settings.max_cholesky_size(30):
        ...     _, _, prepared = prepare(x, x.sum(-1), "additive-ng", max_degree=2)
        >>> prepared.n_train, prepared.d, prepared.dtype, prepared.max_degree, prepared.solver
        (40, 3, 'float32', 2, 'cg')
        >>> prepared.recipe.max_cholesky_size
        30
    """

    kernel: str
    n_train: int
    d: int
    dtype: str
    device: str
    max_degree: int | None
    num_projections: int | None
    noise_floor: float | None
    floor_seconds: float
    solver: str
    recipe: Recipe


@dataclass(frozen=True)
class Fitted:
    """How :func:`fit` trained the model.

    Attributes:
        optimizer_used: the optimizer that ran, ``"lbfgs"`` or ``"adam"`` (``"auto"`` resolved).
        tolerance: the convergence threshold training used.
        warm_start_size: points of the exact fit training started from, or ``None`` without one.
        warm_start_iterations: L-BFGS iterations of that fit (its own budget,
            :attr:`~lazykern.regression.Recipe.warm_start_budget`), or ``None``.
        final_loss: last training loss (negative marginal log likelihood per point).
        evaluations: loss evaluations (Adam: its steps; L-BFGS: every evaluation, line search included).
        iterations: optimizer iterations (see :class:`~lazykern.regression.TrainingLog`).
        converged: whether training stopped by its convergence rule, not by ``iters`` running out.
        stop_reason: why training stopped (:attr:`~lazykern.regression.TrainingLog.stop_reason`).
        interventions: what the recipe did when an evaluation failed, the warm start's first.
        float64_from: the iteration after which a float32 model went on in float64, or ``None``.
        seconds: wall-clock time of the warm start and training.
        peak_memory_mb, memory_measure: peak memory during them (:class:`~lazykern.timing.PeakMemory`).

    Example:
        >>> import torch
        >>> from lazykern.regression import Recipe, fit, prepare
        >>> x = torch.rand(40, 2, dtype=torch.float64)
        >>> model, likelihood, prepared = prepare(x, x.sum(-1), "rbf-ard", Recipe(iters=3))
        >>> fitted = fit(model, likelihood, prepared, progress=False)
        >>> fitted.optimizer_used, fitted.iterations <= 3, fitted.interventions
        ('lbfgs', True, ())
    """

    optimizer_used: str
    tolerance: float
    warm_start_size: int | None
    warm_start_iterations: int | None
    final_loss: float
    evaluations: int
    iterations: int
    converged: bool
    stop_reason: str
    interventions: tuple[str, ...]
    float64_from: int | None
    seconds: float
    peak_memory_mb: float
    memory_measure: str


@dataclass(frozen=True)
class Evaluated:
    """How the trained model predicted the test data (:func:`evaluate`).

    Attributes:
        n_test: test points.
        rmse, nlpd: test RMSE and mean NLPD in the units of the targets given; the NLPD is NaN
            where LOVE's variances failed the check of the conjugate-gradient path.
        rmse_original, nlpd_original: the same in original units (``y_scale`` applied).
        interventions: what the recipe did when prediction failed or its conjugate gradients
            stopped short of their tolerance, and why an NLPD was withheld.
        computed_dtype: the dtype the model predicted in (``"float64"`` where the recipe moved a
            float32 model there).
        hyperparameters: the model's hyperparameters (:func:`~lazykern.regression.hyperparameters`).
        seconds: wall-clock time of prediction and the variance check.
        peak_memory_mb, memory_measure: peak memory during them (:class:`~lazykern.timing.PeakMemory`).

    Example:
        >>> import torch
        >>> from lazykern.regression import evaluate, prepare
        >>> x = torch.rand(50, 2, dtype=torch.float64)
        >>> model, likelihood, prepared = prepare(x[:40], x[:40].sum(-1), "rbf-ard")
        >>> evaluated = evaluate(model, likelihood, prepared, x[40:], x[40:].sum(-1))
        >>> evaluated.n_test, evaluated.computed_dtype, sorted(evaluated.hyperparameters)[0]
        (10, 'float64', 'covar_module.base_kernel.lengthscale')
    """

    n_test: int
    rmse: float
    nlpd: float
    rmse_original: float
    nlpd_original: float
    interventions: tuple[str, ...]
    computed_dtype: str
    hyperparameters: dict[str, Any]
    seconds: float
    peak_memory_mb: float
    memory_measure: str


@dataclass(frozen=True)
class Analyzed:
    """What an additive model learned (:func:`analyze`, :func:`lazykern.components.summary`'s fields);
    all ``None`` for kernels without additive components.

    Attributes:
        order_shares: each interaction order's share of the posterior mean's variance.
        dimension_shares: each input's (or projection's) first-order share.
        total_effects, total_effects_se: each input's total effect and its standard error (``None``
            where exact).
        analysis_kind, total_effects_kind: how the shares and the effects were computed.
        component_axes: ``"inputs"`` or ``"projections"``: what the shares are listed by.

    Example:
        >>> import torch
        >>> from lazykern.regression import analyze, prepare
        >>> x = torch.rand(40, 3, dtype=torch.float64)
        >>> model, _, prepared = prepare(x, x.sum(-1), "additive-rbf")
        >>> analyzed, _ = analyze(model, prepared)
        >>> len(analyzed.dimension_shares), analyzed.analysis_kind, analyzed.component_axes
        (3, 'empirical', 'inputs')
    """

    order_shares: list[float] | None = None
    dimension_shares: list[float] | None = None
    total_effects: list[float] | None = None
    total_effects_se: list[float] | None = None
    analysis_kind: str | None = None
    total_effects_kind: str | None = None
    component_axes: str | None = None


def prepare(
    train_x: Tensor, train_y: Tensor, kernel: str | Kernel = DEFAULT_KERNEL, recipe: Recipe | None = None, *,
    max_degree: int | None = None, num_projections: int | None = None, progress: bool | JobProgress = True,
) -> tuple[ExactGPRegressor, gpytorch.likelihoods.GaussianLikelihood, Prepared]:
    """Resolve the recipe (``max_cholesky_size``) and its noise floor on the training data, and build
    the model (:func:`~lazykern.regression.build_model`): everything the later steps read.

    Args:
        train_x, train_y: ``(n, d)`` and ``(n,)`` training data (standardized targets).
        kernel: a name from :data:`~lazykern.kernel_names.KERNELS` or a kernel module.
        recipe: the :class:`~lazykern.regression.Recipe` (default: ``Recipe()``).
        max_degree: highest interaction order of a named ``additive-ng`` or ``oak`` kernel.
        num_projections: number of projections of a named projected kernel (``dpa-...``, ``rpa-...``).
        progress: show the progress bar of the ARD fit, where there is one; a
            :class:`~lazykern.regression.progress.JobProgress` counts it as its ``"ARD fit"`` phase.

    Returns:
        ``(model, likelihood, prepared)``.

    Example:
        >>> import torch
        >>> from lazykern.regression import NoiseFloor, Recipe, prepare
        >>> x = torch.rand(50, 2, dtype=torch.float64)
        >>> _, likelihood, prepared = prepare(x, x.sum(-1), "rbf-ard", Recipe(noise_floor=NoiseFloor(0.1)))
        >>> prepared.noise_floor, prepared.solver, likelihood.noise.item() > 0.1
        (0.1, 'cholesky', True)
    """
    recipe = (Recipe() if recipe is None else recipe).resolved()
    with Stopwatch(train_x.device) as clock, in_phase(progress, "ARD fit"):
        ard = (fit_ard(train_x, train_y, recipe.ard_start, recipe.warm_start_budget, progress)
               if recipe.ard_start and learns_projections(kernel) else None)
        floor = recipe.noise_floor.resolve(kernel, train_x, train_y, iters=recipe.iters, progress=progress,
                                           ard_noise=ard.noise if ard else None)
    model, likelihood = build_model(train_x, train_y, kernel, max_degree, num_projections, floor)
    if ard:
        scale_learned_directions(model.covar_module, ard.lengthscales)
    inner, _ = lazy_kernels.family_of(model.covar_module)
    return model, likelihood, Prepared(
        kernel=kernel if isinstance(kernel, str) else type(kernel).__name__,
        n_train=train_x.shape[0],
        d=train_x.shape[1],
        dtype=str(train_x.dtype).removeprefix("torch."),
        device=str(train_x.device),
        max_degree=getattr(inner, "max_degree", None),
        num_projections=getattr(inner, "num_projections", None),
        noise_floor=floor,
        floor_seconds=clock.seconds,
        solver="cg" if train_x.shape[0] > recipe.max_cholesky_size else "cholesky",
        recipe=recipe,
    )


def fit(model: ExactGPRegressor, likelihood: gpytorch.likelihoods.Likelihood, prepared: Prepared, *,
        progress: bool | JobProgress = True) -> Fitted:
    """Train the model by the prepared recipe: from a subset's exact fit where the recipe asks for one
    (:func:`~lazykern.regression.warm_start`, at most ``warm_start_budget`` iterations), then on all
    points (:func:`~lazykern.regression.train`, which steps into float64 where float32 fails).

    A warm start pays on the exact path too: a fit whose every step costs :math:`J N^2` (a projected
    kernel with hundreds of directions) reaches the optimum in fewer full-size steps from a
    subset's hyperparameters.

    Args:
        model, likelihood: from :func:`prepare`.
        prepared: :func:`prepare`'s record.
        progress: show the progress bars of the warm start and of training; a
            :class:`~lazykern.regression.progress.JobProgress` counts them as its ``"subset fit"`` and
            ``"training"`` phases.

    Example:
        >>> import torch
        >>> from lazykern.regression import Recipe, fit, prepare
        >>> x = torch.rand(80, 2, dtype=torch.float64)
        >>> model, likelihood, prepared = prepare(x, x.sum(-1), "rbf-ard", Recipe(iters=5, warm_start_size=40))
        >>> fit(model, likelihood, prepared, progress=False).warm_start_size
        40
    """
    recipe, device = prepared.recipe, model.train_inputs[0].device
    warmed = recipe.warms_start(prepared.n_train)
    with PeakMemory(device) as peak, _solves(recipe):
        optimizer_used = resolve_optimizer(recipe.optimizer, prepared.n_train)
        with Stopwatch(device) as clock:
            with in_phase(progress, "subset fit"):
                warm_log = _warm_start(model, likelihood, recipe, progress) if warmed else None
            with in_phase(progress, "training"):
                log = train(model, likelihood, iters=recipe.iters, lr=recipe.lr, progress=progress,
                            optimizer=recipe.optimizer, tolerance=recipe.tolerance)
    return Fitted(
        optimizer_used=optimizer_used,
        tolerance=log.tolerance,
        warm_start_size=recipe.warm_start_size if warmed else None,
        warm_start_iterations=warm_log.iterations if warm_log else None,
        final_loss=log[-1],
        evaluations=log.evaluations,
        iterations=log.iterations,
        converged=log.converged,
        stop_reason=log.stop_reason,
        interventions=(*(f"warm start ({recipe.warm_start_size} points): {note}" for note in
                         (warm_log.interventions if warm_log else ())), *log.interventions),
        float64_from=log.float64_from,
        seconds=clock.seconds,
        peak_memory_mb=peak.mb,
        memory_measure=peak.measure,
    )


def _solves(recipe: Recipe) -> contextlib.ExitStack:
    """GPyTorch's and ``linear_operator``'s settings for the recipe's solves: exact up to
    ``max_cholesky_size``, and the conjugate-gradient tolerances the recipe names."""
    stack = contextlib.ExitStack()
    stack.enter_context(gpytorch.settings.max_cholesky_size(recipe.max_cholesky_size))
    if recipe.cg_tolerance is not None:
        stack.enter_context(linear_operator.settings.cg_tolerance(recipe.cg_tolerance))
    if recipe.solve_tolerance is not None:
        stack.enter_context(gpytorch.settings.eval_cg_tolerance(recipe.solve_tolerance))
    return stack


def _warm_start(model: ExactGPRegressor, likelihood: gpytorch.likelihoods.Likelihood, recipe: Recipe,
                progress: bool | JobProgress) -> TrainingLog:
    """The recipe's warm start: the subset's fit, at most its own budget of iterations."""
    return warm_start(model, likelihood, recipe.warm_start_size, iters=recipe.warm_start_budget, progress=progress)


def check_test_data(train_x: Tensor, test_x: Tensor, test_y: Tensor) -> None:
    """``test_x`` must be a finite ``(m, d)`` float tensor with ``train_x``'s ``d``, ``test_y`` an ``(m,)`` tensor."""
    check_floating_matrix("test_x", test_x)
    if test_x.shape[-1] != train_x.shape[-1]:
        raise ValueError(f"test_x has {test_x.shape[-1]} features but train_x has {train_x.shape[-1]}")
    if not isinstance(test_y, Tensor) or test_y.shape != test_x.shape[:1]:
        raise ValueError(f"test_y must be a tensor of shape ({test_x.shape[0]},)")


def evaluate(model: ExactGPRegressor, likelihood: gpytorch.likelihoods.Likelihood, prepared: Prepared,
             test_x: Tensor, test_y: Tensor, *, y_scale: float = 1.0,
             progress: bool | JobProgress = False) -> Evaluated:
    r"""Predict the test data (:func:`~lazykern.regression.predict`; a float32 model whose prediction
    fails or whose mean's conjugate gradients stall predicts again in float64), check LOVE's variances
    on the conjugate-gradient path (LOVE's, or the grid's where the structured engine's grid models
    the kernel: :func:`~lazykern.regression.prediction.variances_off`), and
    score the predictions.

    Targets are expected standardized; ``y_scale`` (:math:`\sigma_y`) converts the metrics to
    original units: :math:`\text{RMSE} \cdot \sigma_y` and :math:`\text{NLPD} + \log \sigma_y`. Where
    LOVE's variances are off, the NLPD is NaN and ``interventions`` say why, rather than an NLPD of
    variances LOVE's rank could not resolve; on the Cholesky path LOVE is exact.

    Args:
        model, likelihood: a trained model and its likelihood (:func:`fit`).
        prepared: :func:`prepare`'s record.
        test_x, test_y: ``(m, d)`` and ``(m,)`` test data.
        y_scale: standard deviation used to standardize the targets.
        progress: the :class:`~lazykern.regression.progress.JobProgress` whose ``"prediction"`` and
            ``"variance check"`` phases these are, or a bool (nothing to show).

    Example:
        >>> import torch
        >>> from lazykern.regression import evaluate, prepare
        >>> x = torch.rand(60, 2, dtype=torch.float64)
        >>> model, likelihood, prepared = prepare(x[:50], x[:50].sum(-1), "rbf-ard")
        >>> evaluated = evaluate(model, likelihood, prepared, x[50:], x[50:].sum(-1), y_scale=2.0)
        >>> evaluated.n_test, evaluated.rmse_original == 2 * evaluated.rmse
        (10, True)
    """
    check_test_data(model.train_inputs[0], test_x, test_y)
    check_positive_number("y_scale", y_scale)
    device = model.train_inputs[0].device
    with PeakMemory(device) as peak, _solves(prepared.recipe):
        with Stopwatch(device) as clock:
            with in_phase(progress, "prediction"):
                mean, variance, source, notes = _predict_in_float64_if_needed(model, likelihood, test_x)
            with in_phase(progress, "variance check"):
                off = prediction.variances_off(model, likelihood, test_x, variance, source) \
                    if prepared.solver == "cg" else None
    rmse, nlpd = prediction.gaussian_metrics(mean, variance, test_y.to(mean))
    if off:
        notes.append(off)
        nlpd = math.nan
    return Evaluated(
        n_test=test_x.shape[0],
        rmse=rmse,
        nlpd=nlpd,
        rmse_original=rmse * y_scale,
        nlpd_original=nlpd + math.log(y_scale),
        interventions=tuple(notes),
        computed_dtype=str(model.train_inputs[0].dtype).removeprefix("torch."),
        hyperparameters=hyperparameters(model),
        seconds=clock.seconds,
        peak_memory_mb=peak.mb,
        memory_measure=peak.measure,
    )


def _predict_in_float64_if_needed(model: ExactGPRegressor, likelihood: gpytorch.likelihoods.Likelihood,
                                  x: Tensor) -> tuple[Tensor, Tensor, str, list[str]]:
    """Mean and variance at ``x``, and what the recipe did on the way: a float32 model whose
    prediction fails (no Cholesky factor) or whose mean's conjugate gradients stall moves to float64
    and predicts again, the cause being float32 rounding as in training; a solve that stalls even so
    is said too. Also says whose variances they are (:func:`~lazykern.regression.predict`)."""
    single = model.train_inputs[0].dtype == torch.float32
    try:
        mean, variance, source, solve = _predict(model, likelihood, x)
    except NUMERICAL_FAILURES as err:
        if not single:
            raise
        failure = f"{type(err).__name__} in prediction (float32)"
    else:
        stalled = solve.stalled() if solve else None
        failure = f"{stalled} in prediction (float32)" if stalled and single else None
    notes = []
    if failure:
        to_float64(model)
        notes.append(f"{failure}: predicted in float64")
        mean, variance, source, solve = _predict(model, likelihood, x)
    stalled = solve.stalled() if solve else None
    if stalled:
        notes.append(f"{stalled} in prediction")
    return mean, variance, source, notes


def _predict(model: ExactGPRegressor, likelihood: gpytorch.likelihoods.Likelihood,
             x: Tensor) -> tuple[Tensor, Tensor, str, prediction.MeanSolve | None]:
    """:func:`~lazykern.regression.predict`, whose variances they are, and the mean's
    conjugate-gradient solve where it made one."""
    solves, sources = [], []
    mean, variance = prediction.predict(model, likelihood, x, solves.append, sources.append)
    return mean, variance, sources[-1], solves[-1] if solves else None


def analyze(model: ExactGPRegressor, prepared: Prepared) -> tuple[Analyzed, ComponentAnalysis | None]:
    """The component analysis of a trained additive model (:func:`lazykern.components.component_analysis`:
    order and dimension shares, total effects), and its record; an empty record and ``None`` for a
    kernel without additive components (or with a batch shape).

    Args:
        model: a trained model (:func:`fit`).
        prepared: :func:`prepare`'s record (the analysis solves as training did).

    Returns:
        ``(analyzed, analysis)``: the record and the :class:`~lazykern.components.ComponentAnalysis`
        (for :func:`lazykern.components.plot_components`).

    Example:
        >>> import torch
        >>> from lazykern.regression import Analyzed, analyze, prepare
        >>> x = torch.rand(40, 3, dtype=torch.float64)
        >>> model, _, prepared = prepare(x, x.sum(-1), "rbf-ard")
        >>> analyzed, analysis = analyze(model, prepared)   # ARD: no additive components
        >>> analyzed == Analyzed(), analysis is None
        (True, True)
    """
    inner, _ = lazy_kernels.family_of(model.covar_module)
    if inner is None or inner.component_axes is None or inner.batch_shape:
        return Analyzed(), None
    with gpytorch.settings.max_cholesky_size(prepared.recipe.max_cholesky_size):
        analysis = component_analysis(model)
    return Analyzed(**summary(analysis)), analysis
