r"""Evaluating a trained model: predictions, metrics, hyperparameters, and the whole job (:func:`fit_evaluate`).

Example:
    >>> import torch
    >>> from lazykern.regression import gaussian_metrics
    >>> gaussian_metrics(torch.zeros(2), torch.ones(2), torch.zeros(2))[0]
    0.0
"""

from __future__ import annotations

import copy
import math
import re
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import gpytorch
import linear_operator
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from .. import kernels as lazy_kernels
from ..kernels.base import LazyKernel
from ..kernel_names import DEFAULT_KERNEL, LEARNED_PROJECTION_KERNELS
from ..ntk.throughput import synchronize
from ..validation import check_choice, check_floating_matrix, check_non_negative_int, check_positive_int_at_most, \
    check_positive_number
from .model import build_model
from .training import NUMERICAL_FAILURES, ard_noise_floor, resolve_optimizer, to_float64, train, warm_start

__all__ = [
    "PeakMemory", "RegressionResult", "fit_evaluate", "gaussian_metrics", "hyperparameters", "predict",
    "variance_bounds",
]

#: Test points on which :func:`fit_evaluate` checks LOVE's predictive variances on the
#: conjugate-gradient path (:func:`variance_bounds`), and how far outside the exact variance's
#: bounds (relatively) a LOVE variance may lie before the NLPD is withheld.
VARIANCE_CHECK_POINTS = 16
VARIANCE_CHECK_TOLERANCE = 0.05
#: The solve tolerances the check tries in turn, stopping at the first whose bounds show LOVE off
#: or leave it no room to be: the bounds hold at any tolerance, and where LOVE is far off a loose
#: solve shows it (UCI kin40k, 5,000 points, ``dpa-matern52``: LOVE 20.7 where the exact variance is
#: below 0.076), while the solve at 1e-6 may take up to twice as many iterations as there are
#: training points.
VARIANCE_CHECK_SOLVES = (1e-2, 1e-4, 1e-6)


def predict(
    model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.Likelihood, x: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Predictive mean and variance of :math:`y_* = f(x_*) + \varepsilon` (noise included).

    Variances use LOVE (``gpytorch.settings.fast_pred_var``), which is exact up to the Lanczos rank
    and costs one cached decomposition instead of one solve per test point. ``x`` is taken in the
    model's dtype (a model :func:`~lazykern.regression.train` moved to float64 predicts float32
    inputs in float64).

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, predict
        >>> model, likelihood = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
        >>> mean, var = predict(model, likelihood, torch.randn(7, 2))
        >>> mean.shape, bool((var > 0).all())
        (torch.Size([7]), True)
    """
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        out = likelihood(model(x.to(model.train_inputs[0].dtype)))
        return out.mean, out.variance


_CG_STALLED = re.compile(r"CG terminated in (\d+) iterations with average residual norm (\S+) which is larger than "
                         r"the tolerance of (\S+)")


def _predict_checked(model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.Likelihood,
                     x: Tensor) -> tuple[Tensor, Tensor, str | None]:
    """:func:`predict`, and how far ``linear_operator``'s conjugate gradients stopped from their
    tolerance if they did (``None`` if not). ``linear_operator`` only warns of that, and in float32
    the mean's solve can stall far from it: on all of UCI pol (N = 13,500) a first-order additive RBF
    kernel of prior variance 123 over noise 0.17 stopped at a relative residual of 1.64 after 1,000
    iterations, and predicted with test RMSE 5.49 where float64 gives 0.54. Other warnings pass on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean, variance = predict(model, likelihood, x)
    stalled = None
    for w in caught:
        found = _CG_STALLED.search(str(w.message))
        if found and stalled is None:
            stalled = (f"stopped after {found.group(1)} iterations at a relative residual of "
                       f"{float(found.group(2)):.3g} (tolerance {float(found.group(3).rstrip('.')):g})")
        elif not found:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return mean, variance, stalled


def variance_bounds(
    model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood, x: Tensor,
    tolerance: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    r"""Bounds :math:`l \le v \le u` on the exact predictive variances
    :math:`v = k_{**} + \sigma^2 - k_*^\top A^{-1} k_*` (:math:`A = K + \sigma^2 I`) at the rows of ``x``,
    by conjugate gradients in float64 on a copy of the model (the model is left as it is).

    For any approximate solution :math:`x` of :math:`A x = k_*`, with residual :math:`r = k_* - A x`,
    :math:`k_*^\top A^{-1} k_* = 2 k_*^\top x - x^\top A x + r^\top A^{-1} r`, and
    :math:`0 \le r^\top A^{-1} r \le \lVert r \rVert^2 / \sigma^2` (every eigenvalue of :math:`A` is
    at least the noise :math:`\sigma^2`): :math:`u = k_{**} + \sigma^2 - 2 k_*^\top x + x^\top A x` and
    :math:`l = u - \lVert r \rVert^2 / \sigma^2`, whatever the solve's accuracy (CG's iterates lose
    the orthogonality that would make :math:`k_*^\top x = x^\top A x` once it stalls in floating point).

    The check that needs it: LOVE (:func:`predict`) projects :math:`A^{-1}` on a Krylov space of
    ``gpytorch.settings.max_root_decomposition_size`` (100) vectors, which overestimates the
    variance when more of :math:`K`'s eigenvalues than that exceed the noise. On all of UCI elevators
    (N = 14,940) a first-order additive RBF kernel with lengthscales 0.09-0.24 got LOVE variances of
    about 60 where the exact ones are 0.11 (a dense float64 Cholesky; rank 300 gave 10): test NLPD
    2.97 against 0.63.

    Args:
        model, likelihood: a trained exact GP and its Gaussian likelihood.
        x: ``(m, d)`` test inputs.
        tolerance: the solve's relative residual (``linear_operator.settings.cg_tolerance``).

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, predict, variance_bounds
        >>> x = torch.randn(60, 2, dtype=torch.float64)
        >>> model, likelihood = build_model(x, torch.sin(x).sum(-1), "rbf-ard")
        >>> lower, upper = variance_bounds(model, likelihood, x[:5])
        >>> _, variance = predict(model, likelihood, x[:5])
        >>> bool(((lower - 1e-9 <= variance) & (variance <= upper + 1e-9)).all())
        True
    """
    check_floating_matrix("x", x)
    check_positive_number("tolerance", tolerance)
    model, likelihood = copy.deepcopy(model).double().train(), copy.deepcopy(likelihood).double().train()
    train_x, x = model.train_inputs[0], x.to(torch.float64)
    noise = likelihood.noise.detach().squeeze(-1)
    # CG that stops short of the tolerance only widens the bounds: its warning says nothing here.
    with torch.no_grad(), warnings.catch_warnings(), linear_operator.settings.cg_tolerance(tolerance), \
            linear_operator.settings.max_cg_iterations(max(1000, 2 * train_x.shape[-2])):
        warnings.simplefilter("ignore", linear_operator.utils.warnings.NumericalWarning)
        system = likelihood(model(train_x)).lazy_covariance_matrix
        cross = model.covar_module(train_x, x).to_dense()
        solution = system.solve(cross)
        product = system @ solution
        residual = cross - product
        upper = model.covar_module(x, diag=True) + noise - (solution * (2 * cross - product)).sum(-2)
        return upper - (residual * residual).sum(-2) / noise, upper


def _love_variances_off(model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.Likelihood, x: Tensor,
                        variance: Tensor) -> str | None:
    """Why LOVE's ``variance`` at ``x`` cannot be reported (see :func:`variance_bounds`), checked on
    :data:`VARIANCE_CHECK_POINTS` test points spread over ``x``; ``None`` where they agree."""
    rows = torch.linspace(0, x.shape[0] - 1, min(VARIANCE_CHECK_POINTS, x.shape[0])).long()
    for tolerance in VARIANCE_CHECK_SOLVES:
        lower, upper = variance_bounds(model, likelihood, x[rows], tolerance)
        love = variance[rows].to(upper)
        off = (love > upper * (1 + VARIANCE_CHECK_TOLERANCE)) | (love < lower * (1 - VARIANCE_CHECK_TOLERANCE))
        if off.any():
            break
        # Every bound a tighter solve can give holds the exact variance, so lies above ``lower`` (an
        # upper bound) or below ``upper`` (a lower one): within these, LOVE cannot be found off.
        if bool(((love <= lower * (1 + VARIANCE_CHECK_TOLERANCE)) &
                 (love >= upper * (1 - VARIANCE_CHECK_TOLERANCE))).all()):
            return None
    else:
        return None
    worst = int(((love - upper).abs() / upper).argmax())
    return (f"LOVE's predictive variances off at {int(off.sum())} of {rows.numel()} test points checked "
            f"(e.g. {float(love[worst]):.3g} where the exact one is in [{float(lower[worst]):.3g}, "
            f"{float(upper[worst]):.3g}], by float64 conjugate gradients): NLPD not reported")


def gaussian_metrics(mean: Tensor, variance: Tensor, y: Tensor) -> tuple[float, float]:
    r"""Root mean squared error and mean negative log predictive density of Gaussian predictions.

    .. math::

        \text{RMSE} = \sqrt{\tfrac1m \textstyle\sum_i (y_i - \mu_i)^2}, \qquad
        \text{NLPD} = \tfrac1m \textstyle\sum_i \Big[\tfrac12 \log(2\pi v_i) + \frac{(y_i - \mu_i)^2}{2 v_i}\Big]

    Example:
        >>> import torch
        >>> from lazykern.regression import gaussian_metrics
        >>> rmse, nlpd = gaussian_metrics(torch.zeros(4), torch.ones(4), torch.ones(4))
        >>> rmse, round(nlpd, 4)
        (1.0, 1.4189)
    """
    err2 = (y - mean) ** 2
    rmse = err2.mean().sqrt().item()
    nlpd = (0.5 * torch.log(2 * math.pi * variance) + 0.5 * err2 / variance).mean().item()
    return rmse, nlpd


def hyperparameters(model: torch.nn.Module) -> dict[str, float | list[float]]:
    """The model's constrained hyperparameters by name (lengthscales, scales, noise, mean), as floats.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, hyperparameters
        >>> model, _ = build_model(torch.randn(10, 2), torch.randn(10), "rbf-ard")
        >>> sorted(hyperparameters(model))  # doctest: +NORMALIZE_WHITESPACE
        ['covar_module.base_kernel.lengthscale', 'covar_module.outputscale',
         'likelihood.noise_covar.noise', 'mean_module.constant']
    """
    out: dict[str, float | list[float]] = {}
    for name, raw, constraint in model.named_parameters_and_constraints():
        value = raw if constraint is None else constraint.transform(raw)
        prefix, _, leaf = name.rpartition(".")
        values = value.detach().cpu().reshape(-1).tolist()
        out[f"{prefix}.{leaf.removeprefix('raw_')}".lstrip(".")] = values[0] if len(values) == 1 else values
    return out



class PeakMemory:
    """Peak memory of a block of code, in MiB: CUDA allocations on a GPU, resident set size on a CPU.

    On CPU a background thread samples the process's resident set size (``psutil``, every
    millisecond, on every platform) while the block runs; the peak is the largest sample, so an
    allocation that lives less than a millisecond may be missed. Nothing of the process is reset.
    On CUDA the device's allocation peak is reset on entry and read on exit.

    Attributes:
        mb: the peak, in MiB (set on exit).

    Example:
        >>> import torch
        >>> from lazykern.regression import PeakMemory
        >>> with PeakMemory(torch.device("cpu")) as peak:
        ...     _ = torch.ones(10**6)
        >>> peak.mb > 0
        True
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.mb = float("nan")

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            process = psutil.Process()
            self._peak, self._stop = process.memory_info().rss, threading.Event()

            def sample() -> None:
                while not self._stop.wait(0.001):
                    self._peak = max(self._peak, process.memory_info().rss)

            self._sampler = threading.Thread(target=sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            import psutil

            self._stop.set()
            self._sampler.join()
            self.mb = max(self._peak, psutil.Process().memory_info().rss) / 2**20


@dataclass
class RegressionResult:
    """What :func:`fit_evaluate` measured. ``to_dict()`` gives the JSON-ready fields.

    Attributes:
        kernel: kernel name (or class name).
        n_train, n_test, d: data sizes.
        dtype, device: the training inputs' dtype and device (a float32 model may end in float64:
            ``computed_dtype``).
        iters, lr, optimizer: training settings (``lr`` ``None``: the optimizer's default).
        optimizer_used: the optimizer that ran, ``"lbfgs"`` or ``"adam"`` (``"auto"`` resolved).
        tolerance: the convergence threshold training used (the optimizer's default unless given).
        max_degree: highest interaction order of the kernel (``None`` for kernels without orders).
        num_projections: number of projections J of a projected kernel (``None`` for the others).
        warm_start_size: points of the exact fit training started from (:func:`warm_start`), or
            ``None`` when it started from the recipe's initialization.
        noise_floor: lower bound of the noise variance (``fit_evaluate(noise_floor=...)``; the value
            measured where that was ``"ard"``, or ``"auto"`` for a kernel that trains its directions),
            or ``None``.
        solver: ``"cholesky"`` or ``"cg"`` (conjugate gradients and Lanczos on lazy matvecs).
        rmse, nlpd: test RMSE and mean NLPD in the units of the targets given; the NLPD is NaN where
            LOVE's variances failed the check of the conjugate-gradient path (``interventions`` say so).
        rmse_original, nlpd_original: the same in original units (``y_scale`` applied).
        train_seconds, predict_seconds: wall-clock time of training and of prediction.
        peak_memory_mb: peak memory during training and prediction (see :class:`PeakMemory`).
        memory_measure: ``"cuda_max_allocated"`` or ``"sampled_peak_rss"``.
        final_loss: last training loss (negative marginal log likelihood per point).
        evaluations: number of loss evaluations during training (Adam: its steps; L-BFGS: every
            evaluation, line search included).
        iterations: optimizer iterations (see :class:`~lazykern.regression.TrainingLog`).
        converged: whether training stopped by its convergence rule, not by ``iters`` running out.
        stop_reason: why training stopped (:attr:`~lazykern.regression.TrainingLog.stop_reason`).
        interventions: what the recipe did when a factorization failed or the prediction's
            conjugate gradients stopped short of their tolerance, one sentence each (training and
            prediction); empty when it never had to.
        float64_from: the iteration after which a float32 model's training went on in float64
            (:attr:`~lazykern.regression.TrainingLog.float64_from`), ``None`` if it never did.
        computed_dtype: the dtype the model ended in (``"float64"`` when the recipe moved a float32
            model there: to refine converged L-BFGS, or after a failed factorization).
        hyperparameters: final hyperparameters (see :func:`hyperparameters`).
        order_shares, dimension_shares, total_effects, total_effects_se, analysis_kind,
            total_effects_kind, component_axes: what the model learned, from
            :func:`lazykern.components.component_analysis` (:func:`lazykern.components.summary`'s
            fields: each interaction order's share, each input's first-order share and total
            effect, or for a projected kernel each projection's share); ``None`` for kernels without
            additive components.
        model, likelihood: the trained modules (not part of ``to_dict``).
        analysis: the :class:`lazykern.components.ComponentAnalysis` (not part of ``to_dict``),
            for :func:`lazykern.components.plot_components`.
    """

    kernel: str
    n_train: int
    n_test: int
    d: int
    dtype: str
    device: str
    iters: int
    lr: float | None
    optimizer: str
    optimizer_used: str
    tolerance: float
    max_degree: int | None
    num_projections: int | None
    warm_start_size: int | None
    noise_floor: float | None
    solver: str
    rmse: float
    nlpd: float
    rmse_original: float
    nlpd_original: float
    train_seconds: float
    predict_seconds: float
    peak_memory_mb: float
    memory_measure: str
    final_loss: float
    evaluations: int
    iterations: int
    converged: bool
    stop_reason: str
    interventions: list[str]
    float64_from: int | None
    computed_dtype: str
    hyperparameters: dict[str, Any]
    order_shares: list[float] | None
    dimension_shares: list[float] | None
    total_effects: list[float] | None
    total_effects_se: list[float] | None
    analysis_kind: str | None
    total_effects_kind: str | None
    component_axes: str | None
    model: gpytorch.models.ExactGP = field(repr=False)
    likelihood: gpytorch.likelihoods.Likelihood = field(repr=False)
    analysis: Any = field(repr=False, default=None)

    def to_dict(self) -> dict[str, Any]:
        """Every measured field (everything but the modules and the analysis), JSON-serializable."""
        return {k: v for k, v in vars(self).items() if k not in ("model", "likelihood", "analysis")}



#: The fields of :func:`lazykern.components.summary` a result carries.
_LEARNED = ("order_shares", "dimension_shares", "total_effects", "total_effects_se", "analysis_kind",
            "total_effects_kind", "component_axes")


def fit_evaluate(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    kernel: str | Kernel = DEFAULT_KERNEL,
    max_degree: int | None = None,
    num_projections: int | None = None,
    iters: int = 200,
    lr: float | None = None,
    optimizer: str = "auto",
    tolerance: float | None = None,
    y_scale: float = 1.0,
    max_cholesky_size: int | None = None,
    warm_start_size: int | None = None,
    noise_floor: float | str | None = "auto",
    analyze: bool = True,
    progress: bool = True,
) -> RegressionResult:
    r"""Build, train and evaluate an exact GP; the whole ``lazykern uci`` job on given tensors.

    Targets are expected standardized; ``y_scale`` (:math:`\sigma_y`) converts the metrics to
    original units: :math:`\text{RMSE} \cdot \sigma_y` and :math:`\text{NLPD} + \log \sigma_y`.

    On the conjugate-gradient path (more than ``max_cholesky_size`` training points) the LOVE
    variances are checked at ``VARIANCE_CHECK_POINTS`` (16) test points against the exact ones'
    bounds (:func:`variance_bounds`); where they are off, the NLPD is NaN and ``interventions`` say
    why, rather than an NLPD of variances LOVE's rank could not resolve.

    Args:
        train_x, train_y: ``(n, d)`` and ``(n,)`` training data.
        test_x, test_y: ``(m, d)`` and ``(m,)`` test data.
        kernel: a name from :data:`~lazykern.kernel_names.KERNELS` or a kernel module.
        max_degree: highest interaction order of a named ``additive-ng`` or ``oak`` kernel.
        num_projections: number of projections of a named projected kernel (``dpa-...``, ``rpa-...``).
        iters, lr, optimizer, tolerance: the training recipe (see :func:`train`).
        y_scale: standard deviation used to standardize the targets.
        max_cholesky_size: solve exactly by Cholesky up to this many training points, by
            conjugate gradients (lazy matvecs) above; ``None`` keeps
            ``gpytorch.settings.max_cholesky_size`` as it is (GPyTorch's default: 800).
        warm_start_size: first fit the hyperparameters exactly on a random subset of this many
            training points (:func:`warm_start`, counted in the training time), then train on all of
            them, by conjugate gradients or exactly; at most ``max_cholesky_size``, and ignored when
            it is not below the number of training points. ``None``: train from the recipe's start.
        noise_floor: lower bound of the noise variance (see :func:`build_model`); ``"ard"``: the noise
            ARD RBF fits exactly on 1,000 of the training points (:func:`ard_noise_floor`, ``iters`` at
            most, counted in the training time); ``None``: GPyTorch's bound of 1e-4; ``"auto"``
            (default): ``"ard"`` for a kernel that trains projection directions (a name in
            :data:`~lazykern.kernel_names.LEARNED_PROJECTION_KERNELS`, or a module holding a
            :class:`~lazykern.kernels.ProjectedAdditiveKernel` with ``learn_projections=True``), whose
            directions can otherwise explain the noise, else ``None``.
        analyze: for additive and interaction kernels, run
            :func:`lazykern.components.component_analysis` after training (order and dimension
            shares and total effects in the result, the analysis for
            :func:`lazykern.components.plot_components`).
        progress: show a progress bar during training.

    Example:
        >>> import torch
        >>> from lazykern.regression import fit_evaluate
        >>> x = torch.rand(120, 2, dtype=torch.float64); y = torch.sin(4 * x).sum(-1)
        >>> r = fit_evaluate(x[:100], y[:100], x[100:], y[100:], kernel="additive-rbf", iters=10,
        ...                  progress=False)
        >>> r.order_shares, len(r.dimension_shares)   # first-order additive: one order, two inputs
        ([1.0], 2)
    """
    check_floating_matrix("test_x", test_x)
    if test_x.shape[-1] != train_x.shape[-1]:
        raise ValueError(f"test_x has {test_x.shape[-1]} features but train_x has {train_x.shape[-1]}")
    if not isinstance(test_y, Tensor) or test_y.shape != test_x.shape[:1]:
        raise ValueError(f"test_y must be a tensor of shape ({test_x.shape[0]},)")
    check_positive_number("y_scale", y_scale)
    check_non_negative_int("max_cholesky_size", max_cholesky_size, optional=True)
    if max_cholesky_size is None:
        max_cholesky_size = gpytorch.settings.max_cholesky_size.value()
    if warm_start_size is not None:  # the subset's fit is exact
        check_positive_int_at_most("warm_start_size", warm_start_size, max_cholesky_size,
                                   f"max_cholesky_size ({max_cholesky_size})")
    floor_seconds = 0.0
    if isinstance(noise_floor, str):  # the noise a simpler model fits on the same data, or none
        check_choice("noise_floor", noise_floor, ("ard", "auto"))
        if noise_floor == "ard" or _learns_projections(kernel):
            started = time.perf_counter()
            noise_floor = ard_noise_floor(train_x, train_y, iters=iters, progress=progress)
            floor_seconds = time.perf_counter() - started
        else:
            noise_floor = None
    on_cg = train_x.shape[0] > max_cholesky_size
    model, likelihood = build_model(train_x, train_y, kernel, max_degree, num_projections, noise_floor)
    device = train_x.device
    with PeakMemory(device) as peak, gpytorch.settings.max_cholesky_size(max_cholesky_size):
        optimizer_used = resolve_optimizer(optimizer, train_x.shape[0])
        start = time.perf_counter()
        # Also on the exact path: a fit whose every step costs J N^2 (a projected kernel with hundreds
        # of directions) reaches the optimum in fewer full-size steps from a subset's hyperparameters.
        warmed = warm_start_size is not None and warm_start_size < train_x.shape[0]
        if warmed:
            warm_log = warm_start(model, likelihood, warm_start_size, iters=iters, progress=progress)
        log = train(model, likelihood, iters=iters, lr=lr, progress=progress, optimizer=optimizer,
                    tolerance=tolerance)
        if warmed:
            log.interventions[:0] = [f"warm start ({warm_start_size} points): {note}" for note in warm_log.interventions]
        synchronize(device)
        train_seconds = time.perf_counter() - start + floor_seconds
        start = time.perf_counter()
        single = model.train_inputs[0].dtype == torch.float32
        try:
            mean, variance, stalled = _predict_checked(model, likelihood, test_x)
        except NUMERICAL_FAILURES as err:
            # The same cause and the same step as in training (see `train`): float32 rounding.
            if not single:
                raise
            failure = f"{type(err).__name__} in prediction (float32)"
        else:
            failure = f"CG {stalled} in prediction (float32)" if stalled and single else None
        if failure:
            to_float64(model)
            log.interventions.append(f"{failure}: predicted in float64")
            mean, variance, stalled = _predict_checked(model, likelihood, test_x)
        if stalled:
            log.interventions.append(f"CG {stalled} in prediction")
        # LOVE is exact on the Cholesky path; on the CG path its rank may be far too small.
        off = _love_variances_off(model, likelihood, test_x, variance) if on_cg else None
        synchronize(device)
        predict_seconds = time.perf_counter() - start
    rmse, nlpd = gaussian_metrics(mean, variance, test_y.to(mean))
    if off:
        log.interventions.append(off)
        nlpd = math.nan
    analysis, learned = None, dict.fromkeys(_LEARNED)
    if analyze and _analyzable(model.covar_module):
        from ..components import component_analysis, summary

        with gpytorch.settings.max_cholesky_size(max_cholesky_size):
            analysis = component_analysis(model)
        learned = summary(analysis)
    inner, _ = lazy_kernels.family_of(model.covar_module)
    return RegressionResult(
        kernel=kernel if isinstance(kernel, str) else type(kernel).__name__,
        n_train=train_x.shape[0],
        n_test=test_x.shape[0],
        d=train_x.shape[1],
        dtype=str(train_x.dtype).removeprefix("torch."),
        device=str(device),
        iters=iters,
        lr=lr,
        optimizer=optimizer,
        optimizer_used=optimizer_used,
        tolerance=log.tolerance,
        max_degree=getattr(inner, "max_degree", None),
        num_projections=getattr(inner, "num_projections", None),
        warm_start_size=warm_start_size if warmed else None,
        noise_floor=noise_floor,
        solver="cg" if on_cg else "cholesky",
        rmse=rmse,
        nlpd=nlpd,
        rmse_original=rmse * y_scale,
        nlpd_original=nlpd + math.log(y_scale),
        train_seconds=train_seconds,
        predict_seconds=predict_seconds,
        peak_memory_mb=peak.mb,
        memory_measure="cuda_max_allocated" if device.type == "cuda" else "sampled_peak_rss",
        final_loss=log[-1],
        evaluations=log.evaluations,
        iterations=log.iterations,
        converged=log.converged,
        stop_reason=log.stop_reason,
        interventions=log.interventions,
        float64_from=log.float64_from,
        computed_dtype=str(model.train_inputs[0].dtype).removeprefix("torch."),
        hyperparameters=hyperparameters(model),
        **learned,
        model=model,
        likelihood=likelihood,
        analysis=analysis,
    )


def _analyzable(covar: Kernel) -> bool:
    inner, _ = lazy_kernels.family_of(covar)
    return inner is not None and inner.component_axes is not None and not inner.batch_shape


def _learns_projections(kernel: str | Kernel) -> bool:
    """Whether ``kernel`` (a name or a module) trains the directions of a projected kernel."""
    if isinstance(kernel, str):
        return kernel in LEARNED_PROJECTION_KERNELS
    return isinstance(kernel, torch.nn.Module) and any(
        isinstance(m, LazyKernel) and m.learns_projections for m in kernel.modules())
