r"""Predictions of a trained exact GP and what they are judged by: the predictive mean and variance,
bounds on the exact variance, the check of approximate variances (LOVE's, the grid's), and the test
metrics.

For training inputs :math:`X`, targets :math:`y`, :math:`A = K(X, X) + \sigma^2 I` and test points
:math:`x_*`, the predictive distribution of :math:`y_* = f(x_*) + \varepsilon` is Gaussian with

.. math::

    \mu_* = m(x_*) + k_*^\top \alpha, \quad \alpha = A^{-1}(y - m(X)), \qquad
    v_* = k_{**} + \sigma^2 - k_*^\top A^{-1} k_*.

Example:
    >>> import torch
    >>> from lazykern.regression import gaussian_metrics
    >>> gaussian_metrics(torch.zeros(2), torch.ones(2), torch.zeros(2))[0]
    0.0
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import gpytorch
import linear_operator
import torch
from gpytorch.models.exact_prediction_strategies import prediction_strategy
from gpytorch.utils.memoize import add_to_cache
from torch import Tensor

from .. import backend
from ..operators import LazyKernelOperator
from ..solvers import CGResult, cg
from ..validation import check_floating_matrix, check_positive_number
from .training import on_conjugate_gradients

__all__ = ["MeanSolve", "VARIANCE_CHECK_POINTS", "VARIANCE_CHECK_SOLVES", "VARIANCE_CHECK_TOLERANCE",
           "gaussian_metrics", "grid_variance", "predict", "variance_bounds", "variances_off"]

VARIANCE_CHECK_POINTS = 16
"""Test points on which the evaluation checks LOVE's predictive variances on the conjugate-gradient
path (:func:`variances_off`), spread over the test set."""

VARIANCE_CHECK_TOLERANCE = 0.05
"""How far outside the exact variance's bounds, relatively, a LOVE variance may lie before the NLPD is
withheld."""

VARIANCE_CHECK_SOLVES = (1e-2, 1e-4, 1e-6)
"""The solve tolerances the check tries in turn, stopping at the first whose bounds show LOVE off or
leave it no room to be: the bounds hold at any tolerance, and where LOVE is far off a loose solve
already shows it, while a solve at 1e-6 may take up to twice as many iterations as there are
training points (``docs/uci.rst``, "The recipe's choices")."""


@dataclass(frozen=True)
class MeanSolve:
    r"""The conjugate-gradient solve of the predictive mean's weights :math:`\alpha = A^{-1}(y - m(X))`.

    Attributes:
        result: what :func:`lazykern.solvers.cg` did (iterations, per-column convergence, residuals).
        tolerance: the relative residual it was asked for (``gpytorch.settings.eval_cg_tolerance``).

    Example:
        >>> import torch
        >>> from lazykern.regression.prediction import MeanSolve
        >>> from lazykern.solvers import cg
        >>> _, result = cg(torch.eye(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), tol=0.01)
        >>> MeanSolve(result, 0.01).stalled() is None
        True
    """

    result: CGResult
    tolerance: float

    def stalled(self) -> str | None:
        """How far the solve stopped from its tolerance, in words, or ``None`` where it converged."""
        if self.result.all_converged:
            return None
        return (f"CG stopped after {self.result.iterations} iterations at a relative residual of "
                f"{float(self.result.relative_residuals.max()):.3g} (tolerance {self.tolerance:g})")


def predict(
    model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.Likelihood, x: Tensor,
    on_solve: Callable[[MeanSolve], None] | None = None, on_variances: Callable[[str], None] | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Predictive mean :math:`\mu_*` and variance :math:`v_*` of :math:`y_* = f(x_*) + \varepsilon`
    (noise included) at the rows of ``x``.

    Variances use LOVE (``gpytorch.settings.fast_pred_var``), which is exact up to the Lanczos rank
    and costs one cached decomposition instead of one solve per test point, or, on the
    conjugate-gradient path with a kernel the structured engine's grid models, the grid model's own
    posterior variance (:func:`~lazykern.regression.prediction.grid_variance`), which resolves every eigenvalue LOVE's rank cannot.
    On the Cholesky path
    (at most ``gpytorch.settings.max_cholesky_size`` training points) the prediction is GPyTorch's
    exact one. On the conjugate-gradient path the mean's weights :math:`\alpha` are solved by
    :func:`lazykern.solvers.cg` in the model's dtype to ``gpytorch.settings.eval_cg_tolerance``
    (GPyTorch's preconditioner, its iteration limit), and GPyTorch predicts from them: the solve
    says per column whether it reached its tolerance
    (:class:`~lazykern.regression.prediction.MeanSolve`), where ``linear_operator``'s only warns, and
    in float32 it can stall far from it. ``x`` is taken in the model's dtype (a model
    :func:`~lazykern.regression.train` moved to float64 predicts float32 inputs in float64).

    Args:
        model, likelihood: a trained exact GP and its Gaussian likelihood.
        x: ``(m, d)`` test inputs.
        on_solve: called with the :class:`~lazykern.regression.prediction.MeanSolve` where this call
            solved for :math:`\alpha` by conjugate gradients (once per trained model: GPyTorch keeps
            :math:`\alpha` until the model trains again or takes new data).
        on_variances: called with where the variances came from, ``"LOVE's"`` or ``"the grid's"``.

    Returns:
        ``(mean, variance)``, two ``(m,)`` tensors in the model's dtype.

    Example:
        >>> import gpytorch, torch
        >>> from lazykern.regression import build_model, predict
        >>> model, likelihood = build_model(torch.randn(50, 2), torch.randn(50), "rbf-ard")
        >>> mean, var = predict(model, likelihood, torch.randn(7, 2))
        >>> mean.shape, bool((var > 0).all())
        (torch.Size([7]), True)
        >>> solves = []
        >>> with gpytorch.settings.max_cholesky_size(10):
        ...     _ = predict(model.train(), likelihood, torch.randn(7, 2), solves.append)
        >>> len(solves), solves[0].stalled() is None
        (1, True)
    """
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        by_cg = _solves_by_cg(model)
        if model.prediction_strategy is None and by_cg:
            solve = _solve_mean(model, likelihood)
            if on_solve is not None:
                on_solve(solve)
        x = x.to(model.train_inputs[0].dtype)
        grid = grid_variance(model, likelihood, x) if by_cg else None
        if on_variances is not None:
            on_variances("LOVE's" if grid is None else "the grid's")
        if grid is None:
            out = likelihood(model(x))
            return out.mean, out.variance
        with gpytorch.settings.skip_posterior_variances():
            return likelihood(model(x)).mean, grid


def grid_variance(model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood,
                  x: Tensor) -> Tensor | None:
    r"""The predictive variances at the rows of ``x`` under the structured engine's grid model of the
    kernel, :math:`\phi_*^\top C^{-1} \phi_* + \sigma^2`
    (:meth:`lazykern.structured.grid.AdditiveGrid.posterior_variance`, the grids spanning ``x`` too);
    ``None`` for a kernel the grid does not model (or a batch of models).

    The grid replaces each one-dimensional term by its interpolant from a fine grid, keeping the
    :data:`~lazykern.structured.grid.MAX_RANK` directions that matter most against the noise, so its
    model's variance is the exact one wherever the interpolation resolves the kernel; the
    evaluation checks that (:func:`variances_off`). It costs :math:`r^2` operations a test point.

    Args:
        model, likelihood: a trained exact GP and its Gaussian likelihood.
        x: ``(m, d)`` test inputs.

    Example:
        >>> import torch, lazykern
        >>> from lazykern.regression import build_model
        >>> from lazykern.regression.prediction import grid_variance, variance_bounds
        >>> x = torch.rand(300, 2, dtype=torch.float64)
        >>> model, likelihood = build_model(x, torch.sin(6 * x).sum(-1), "additive-matern52")
        >>> variance = grid_variance(model, likelihood, x[:5])
        >>> lower, upper = variance_bounds(model, likelihood, x[:5], tolerance=1e-10)
        >>> bool(torch.allclose(variance, upper, rtol=1e-3))
        True
        >>> grid_variance(*build_model(x, x.sum(-1), "rbf-ard"), x[:5]) is None
        True
    """
    train_x = model.train_inputs[0]
    if train_x.dim() != 2:
        return None
    with torch.no_grad():
        # One call's inputs: a kernel may shift its inputs by a mean of its own per call (stationary
        # kernels do, for rounding), so the training and test coordinates must come from the same one.
        cross = model.covar_module(x, train_x).evaluate_kernel()
        if not isinstance(cross, LazyKernelOperator):
            return None
        build = backend.preconditioner(cross.covar_func, cross.x2, cross.tensor_params)
        if build is None:
            return None
        noise = likelihood.noise.detach().reshape(-1)
        grid = build(noise.expand(train_x.shape[-2]).to(torch.float64), max_rank=backend.PRECONDITIONER_MAX_RANK,
                     extent=cross.x1)
        return (grid.posterior_variance(cross.x1) + noise.to(torch.float64)).to(x.dtype)


def _solves_by_cg(model: gpytorch.models.ExactGP) -> bool:
    """Whether GPyTorch would solve for the mean's weights by conjugate gradients, for a model that
    :func:`lazykern.solvers.cg` can solve for (no batch, every target observed)."""
    x = model.train_inputs[0]
    return (x.dim() == 2 and on_conjugate_gradients(x.shape[-2]) and gpytorch.settings.fast_computations.solves.on()
            and gpytorch.settings.observation_nan_policy.value() == "ignore")


def _solve_mean(model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.Likelihood) -> MeanSolve:
    r""":math:`\alpha = A^{-1}(y - m(X))` by :func:`lazykern.solvers.cg`, handed to the prediction
    strategy GPyTorch would build on its first prediction, as its cached mean weights."""
    train_inputs = list(model.train_inputs)
    prior = model.forward(*train_inputs)
    system = likelihood(prior, train_inputs)
    operator = system.lazy_covariance_matrix.evaluate_kernel()
    precondition = operator._preconditioner()[0]  # what linear_operator's own solve would use
    tolerance = gpytorch.settings.eval_cg_tolerance.value()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a solve short of its tolerance is said by its MeanSolve
        weights, result = cg(operator, model.train_targets - system.loc, precond=precondition, tol=tolerance,
                             max_iter=linear_operator.settings.max_cg_iterations.value())
    strategy = prediction_strategy(train_inputs=train_inputs, train_prior_dist=prior,
                                   train_labels=model.train_targets, likelihood=likelihood)
    add_to_cache(strategy, "mean_cache", weights, gpytorch.settings.observation_nan_policy.value())
    model.prediction_strategy = strategy
    return MeanSolve(result, tolerance)


def variance_bounds(
    model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.GaussianLikelihood, x: Tensor,
    tolerance: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    r"""Bounds :math:`l \le v \le u` on the exact predictive variances
    :math:`v = k_{**} + \sigma^2 - k_*^\top A^{-1} k_*` (:math:`A = K + \sigma^2 I`) at the rows of ``x``,
    by conjugate gradients in float64 (:func:`lazykern.solvers.cg`, preconditioned as training's
    solves are) on a copy of the model (the model is left as it is).

    For any approximate solution :math:`x` of :math:`A x = k_*`, with residual :math:`r = k_* - A x`,
    :math:`k_*^\top A^{-1} k_* = 2 k_*^\top x - x^\top A x + r^\top A^{-1} r`, and
    :math:`0 \le r^\top A^{-1} r \le \lVert r \rVert^2 / \sigma^2` (every eigenvalue of :math:`A` is
    at least the noise :math:`\sigma^2`): :math:`u = k_{**} + \sigma^2 - 2 k_*^\top x + x^\top A x` and
    :math:`l = u - \lVert r \rVert^2 / \sigma^2`, whatever the solve's accuracy (CG's iterates lose
    the orthogonality that would make :math:`k_*^\top x = x^\top A x` once it stalls in floating point).

    The check that needs it: LOVE (:func:`predict`) projects :math:`A^{-1}` on a Krylov space of
    ``gpytorch.settings.max_root_decomposition_size`` (100) vectors, which overestimates the
    variance when more of :math:`K`'s eigenvalues than that exceed the noise (``docs/uci.rst``,
    "Reading the tables", has a case where it did so 500-fold).

    Args:
        model, likelihood: a trained exact GP and its Gaussian likelihood.
        x: ``(m, d)`` test inputs.
        tolerance: the solve's relative residual.

    Returns:
        ``(lower, upper)``, two ``(m,)`` float64 tensors.

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
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        system = likelihood(model(train_x)).lazy_covariance_matrix.evaluate_kernel()
        cross = model.covar_module(train_x, x).to_dense()
        precondition = system._preconditioner()[0] if train_x.dim() == 2 else None
        solution, _ = cg(system, cross, precond=precondition, tol=tolerance, max_iter=max(1000, 2 * train_x.shape[-2]))
        product = system @ solution
        residual = cross - product
        upper = model.covar_module(x, diag=True) + noise - (solution * (2 * cross - product)).sum(-2)
        return upper - (residual * residual).sum(-2) / noise, upper


def variances_off(model: gpytorch.models.ExactGP, likelihood: gpytorch.likelihoods.Likelihood, x: Tensor,
                  variance: Tensor, source: str = "LOVE's") -> str | None:
    r"""Why the approximate ``variance`` at ``x`` (LOVE's or the grid's, as ``source`` says) cannot be
    reported, or ``None`` where it can: the check of the conjugate-gradient path, on
    :data:`VARIANCE_CHECK_POINTS` test points spread over ``x``.

    A variance is off where it lies outside :math:`[l (1 - \tau), u (1 + \tau)]`
    (:func:`~lazykern.regression.variance_bounds`, :math:`\tau` = :data:`VARIANCE_CHECK_TOLERANCE`);
    the bounds are tried at each of :data:`VARIANCE_CHECK_SOLVES`, stopping as soon as they show LOVE
    off or leave it no room to be, so that a tight (costly) solve runs only where a loose one cannot
    tell.

    Args:
        model, likelihood: a trained exact GP and its Gaussian likelihood.
        x: ``(m, d)`` test inputs.
        variance: ``(m,)`` approximate predictive variances at ``x`` (:func:`~lazykern.regression.predict`).
        source: whose variances they are, as the message names them.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, predict
        >>> from lazykern.regression.prediction import variances_off
        >>> x = torch.randn(60, 2, dtype=torch.float64)
        >>> model, likelihood = build_model(x, torch.sin(x).sum(-1), "rbf-ard")
        >>> _, variance = predict(model, likelihood, x[:20])
        >>> variances_off(model, likelihood, x[:20], variance) is None
        True
        >>> variances_off(model, likelihood, x[:20], 10 * variance).startswith("LOVE's predictive variances off")
        True
    """
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
    return (f"{source} predictive variances off at {int(off.sum())} of {rows.numel()} test points checked "
            f"(e.g. {float(love[worst]):.3g} where the exact one is in [{float(lower[worst]):.3g}, "
            f"{float(upper[worst]):.3g}], by float64 conjugate gradients): NLPD not reported")


def gaussian_metrics(mean: Tensor, variance: Tensor, y: Tensor) -> tuple[float, float]:
    r"""Root mean squared error and mean negative log predictive density of Gaussian predictions.

    .. math::

        \text{RMSE} = \sqrt{\tfrac1m \textstyle\sum_i (y_i - \mu_i)^2}, \qquad
        \text{NLPD} = \tfrac1m \textstyle\sum_i \Big[\tfrac12 \log(2\pi v_i) + \frac{(y_i - \mu_i)^2}{2 v_i}\Big]

    Args:
        mean, variance: ``(m,)`` predictive means :math:`\mu_i` and variances :math:`v_i`.
        y: ``(m,)`` targets.

    Returns:
        ``(rmse, nlpd)``, two floats.

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
