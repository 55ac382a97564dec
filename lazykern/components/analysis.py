r"""The numbers of component analysis: each first-order component's posterior on a grid, the order
shares, the first-order shares and the total effects of a trained additive exact GP. What each
number means and how it is computed (Sobol indices for OAK, empirical variances and pick-freeze
Monte Carlo otherwise) is written in :mod:`lazykern.components`; the comments here refer to it."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch
from torch import Tensor

from .. import backend
from ..formulas.interactions import InteractionFormula, orthogonal_rbf_l2_features
from ..formulas.stationary import StationaryFormula
from ..kernels import OrthogonalAdditiveKernel, family_of
from ..kernels.base import LazyKernel
from ..validation import check_positive_int
from .vocabulary import ranking

__all__ = ["SHARE_POINTS", "EFFECT_POINTS", "ComponentAnalysis", "component_analysis", "summary"]

#: Most training inputs the empirical shares average over (see :mod:`lazykern.components`).
SHARE_POINTS = 500

#: Pick-freeze draws of the Monte-Carlo total effects (``component_analysis(effect_points=)``).
EFFECT_POINTS = 1000


@dataclass
class ComponentAnalysis:
    r"""Result of :func:`component_analysis` (standardized units of inputs and targets).

    D is the number of first-order components: the inputs, or for a
    :class:`~lazykern.kernels.ProjectedAdditiveKernel` its J projections (component j a function of
    :math:`w_j^\top x`, its axis that projection; ``axes`` says which).

    Attributes:
        grid: ``(T, D)``: evaluation points along each component's axis (column d for component d),
            from the smallest to the largest training value.
        mean: ``(T, D)``: posterior mean of each first-order component on its grid, centred on its
            average over the training inputs.
        variance: ``(T, D)`` posterior variance of each centred component, or ``None`` where it was
            not computed.
        offsets: ``(D,)``: each first-order component's average over the training inputs (what
            centring removed).
        constant: the GP's constant mean (0 without a ``ConstantMean``); ``constant + offsets.sum()``
            is the additive offset of the plotted components.
        order_shares: ``(R,)``: order share of interaction orders 1..R (sums to 1).
        dimension_shares: ``(D,)``: first-order share of each input (on the scale of
            ``order_shares``: for OAK they sum to ``order_shares[0]``).
        total_effects: ``(D,)``: total effect (total Sobol index) of each input, all orders.
        total_effects_se: ``(D,)`` Monte-Carlo standard errors of ``total_effects``, ``None`` where
            they are exact.
        kind: how ``order_shares`` were computed: ``"sobol"`` (OAK: exact under the input measure)
            or ``"empirical"`` (variances of posterior-mean terms over the training inputs).
        total_kind: how ``total_effects`` were computed: ``"sobol"``, ``"pick-freeze"`` or
            ``"first-order"`` (see :mod:`lazykern.components`).
        train_x: ``(N, D)`` training inputs along the components' axes (for rugs in plots): the
            inputs, or their projections :math:`X W`.
        axes: ``"inputs"`` or ``"projections"``: what the components are functions of.
    """

    grid: Tensor
    mean: Tensor
    variance: Tensor | None
    offsets: Tensor
    constant: float
    order_shares: Tensor
    dimension_shares: Tensor
    total_effects: Tensor
    total_effects_se: Tensor | None
    kind: str
    total_kind: str
    train_x: Tensor
    axes: str = "inputs"

    def ranking(self) -> list[int]:
        """Input indices by decreasing total effect (ties by first-order share)."""
        return ranking(self.total_effects.tolist(), self.dimension_shares.tolist())


def _first_order(kernel: LazyKernel, outer: Tensor | float, t: Tensor, x: Tensor):
    """Per-component 1-D problems of the first-order terms between points ``t`` and training inputs
    ``x`` (along the components' axes: a projected kernel's projected coordinates), the output scale
    ``outer`` multiplied in: the formula, ``(D, T, F)`` and ``(D, N, F)`` inputs, params. Both sides
    are transformed together: the stationary kernels' inputs are centred on a shift taken from both,
    so a grid transformed on its own would be shifted against the training inputs."""
    formula, t_dims, x_dims, params = kernel.first_order_terms(t, x)
    return formula, t_dims, x_dims, {**params, "order_variances": outer * params["order_variances"]}


def _mean_solve(model: gpytorch.models.ExactGP) -> Tensor:
    x = model.train_inputs[0]
    model.eval()
    with torch.no_grad():
        model(x[:1])  # fills the prediction cache: alpha = (K + noise)^-1 (y - mean)
    return model.prediction_strategy.mean_cache


def component_analysis(
    model: gpytorch.models.ExactGP,
    *,
    grid_size: int = 100,
    variance_max_n: int = 5000,
    effect_points: int = EFFECT_POINTS,
) -> ComponentAnalysis:
    r"""Components, order shares, first-order shares and total effects of a trained additive exact
    GP (:mod:`lazykern.components` defines each).

    Args:
        model: an exact GP (one input tensor, no batch) whose ``covar_module`` is a
            :class:`~lazykern.kernels.NewtonGirardAdditiveKernel`,
            :class:`~lazykern.kernels.OrthogonalAdditiveKernel`,
            :class:`~lazykern.kernels.AdditiveStructureKernel` (or GPyTorch's) or
            :class:`~lazykern.kernels.ProjectedAdditiveKernel` (one component per projection), optionally
            inside a ``ScaleKernel``: a kernel with first-order components
            (:attr:`~lazykern.kernels.base.LazyKernel.component_axes`).
        grid_size: points T along each axis.
        variance_max_n: compute component variances (one dense Cholesky factor, O(N²) memory) up
            to this many training points; above it ``variance`` is ``None``.
        effect_points: pick-freeze draws S of the Monte-Carlo total effects (Newton–Girard);
            their standard errors shrink as :math:`1/\sqrt S`, their cost is :math:`S (D + 2)` rows
            of one kernel matvec.

    Returns:
        A :class:`ComponentAnalysis`; the model is left in eval mode.

    Example:
        See :mod:`lazykern.components`.
    """
    check_positive_int("grid_size", grid_size)
    check_positive_int("effect_points", effect_points)
    kernel, scale = family_of(model.covar_module)
    if kernel is None or kernel.component_axes is None or kernel.batch_shape:
        raise TypeError("component_analysis needs a covar_module that is a (ScaleKernel of a) non-batch "
                        "NewtonGirardAdditiveKernel, OrthogonalAdditiveKernel, AdditiveStructureKernel (lazykern's "
                        f"or GPyTorch's) or ProjectedAdditiveKernel, got {type(model.covar_module).__name__}")
    outer = 1.0 if scale is None else scale.outputscale
    inputs = model.train_inputs[0]
    if inputs.dim() != 2:
        raise ValueError(f"component_analysis needs (n, d) training inputs, got shape {tuple(inputs.shape)}")
    alpha = _mean_solve(model)
    with torch.no_grad():
        # Every component is a function of one coordinate: an input, or a projection w_j^T x.
        x = kernel.component_coordinates(inputs)
        lo, hi = x.min(0).values, x.max(0).values
        steps = torch.linspace(0, 1, grid_size, dtype=x.dtype, device=x.device).unsqueeze(-1)
        grid = lo + steps * (hi - lo)  # (T, D)
        # Every transform is per coordinate, so the rows of the grid serve as points: column d of
        # the grid becomes dimension d's one-dimensional inputs.
        formula, t_dims, x_dims, params = _first_order(kernel, outer, grid, x)
        cross = backend.pairwise_matmul(formula, t_dims, x_dims, params, alpha.unsqueeze(-1)).squeeze(-1)  # (D, T)
        # One pass over training pairs, two columns: the row means of c_d z_d over the training
        # inputs (the centring of every component) and each component at the training inputs.
        columns = torch.cat([torch.full_like(x[:, :1], 1.0 / x.shape[0]), alpha.unsqueeze(-1)], -1)
        means, at_train = backend.pairwise_matmul(formula, x_dims, x_dims, params, columns).unbind(-1)  # (D, N) each
        offsets = means @ alpha
        variance = (_variance(model, formula, t_dims, x_dims, params, means)
                    if x.shape[0] <= variance_max_n else None)
        orders, dims, totals, kind = _shares(kernel, outer, x, at_train, alpha)
        totals, errors, total_kind = _total_effects(model, kernel, inputs, alpha, totals, effect_points)
    # Said, not passed on silently: NaN shares once reached the UCI table's page unremarked.
    broken = [name for name, v in (("order shares", orders), ("first-order shares", dims), ("total effects", totals))
              if not torch.isfinite(v).all()]
    if broken:
        warnings.warn(f"component_analysis: the {', '.join(broken)} are not all finite (lengthscales "
                      f"{kernel.lengthscale_kernel.lengthscale.detach().reshape(-1).tolist()}); read them as unknown",
                      RuntimeWarning, stacklevel=2)
    constant = getattr(model.mean_module, "constant", None)
    return ComponentAnalysis(grid=grid, mean=(cross - offsets.unsqueeze(-1)).T, variance=variance,
                             offsets=offsets, constant=0.0 if constant is None else float(constant.detach()),
                             order_shares=orders, dimension_shares=dims, total_effects=totals,
                             total_effects_se=errors, kind=kind, total_kind=total_kind, train_x=x.detach(),
                             axes=kernel.component_axes)


def _variance(model, formula, t_dims: Tensor, x_dims: Tensor, params: dict[str, Tensor], means: Tensor) -> Tensor:
    """Posterior variance of the centred components (:mod:`lazykern.components`): ``means`` (D, N) holds
    :math:`\\frac1N \\sum_i c_d z_d(x_{id}, x_{jd})`."""
    x = model.train_inputs[0]  # the model's inputs (x_dims: the components' coordinates)
    noise = model.likelihood.noise.reshape(-1)[0]
    K = model.covar_module(x).to_dense()
    L = torch.linalg.cholesky(K + noise * torch.eye(x.shape[0], dtype=x.dtype, device=x.device))
    cross = backend.pairwise_dense(formula, t_dims, x_dims, params)  # (D, T, N) = c_d z_d(t, X_d)
    prior = (backend.elementwise(formula, t_dims, t_dims, params)  # (D, T): c_d z̄_d(t, t)
             - 2 * cross.mean(-1) + means.mean(-1, keepdim=True))
    v = torch.linalg.solve_triangular(L, (cross - means.unsqueeze(-2)).transpose(-1, -2), upper=False)  # (D, N, T)
    return (prior - (v * v).sum(-2)).clamp_min(0).T


def _shares(kernel, outer, x, at_train, alpha):
    """``at_train`` (D, N): each first-order component at the training inputs."""
    if kernel.input_measure is not None:
        return _sobol(kernel, outer, x, alpha)
    # Empirical: variance over (evenly spaced) training inputs of each order's and each dimension's component.
    rows = torch.linspace(0, x.shape[0] - 1, min(x.shape[0], SHARE_POINTS), device=x.device).round().long()
    first = at_train[:, rows]  # (D, S)
    orders = kernel.order_variances
    if orders is not None:
        r = orders.shape[-1]
        x_, _, base_params = kernel.formula_arguments(x, x)
        # One order variance per batch member: the formula's sum over orders becomes a batch of R.
        order_params = {**base_params, "order_variances": (outer * torch.diag_embed(orders)).reshape(r, 1, r)}
        by_order = backend.pairwise_matmul(kernel.formula, x_[rows], x_, order_params, alpha.unsqueeze(-1))  # (R, S, 1)
        order_var = by_order.squeeze(-1).var(-1)
    else:
        order_var = first.sum(0).var(-1, keepdim=True)
    total = order_var.sum()
    # A first-order model has nothing but first-order terms: its total effects are its first-order shares.
    firsts = first.var(-1) / total
    return order_var / total, firsts, firsts, "empirical"


def _total_effects(model, kernel, x: Tensor, alpha: Tensor, totals: Tensor, s: int):
    """``(total_effects, standard errors or None, total_kind)``: OAK's and a first-order model's as
    :func:`_shares` computed them, Newton–Girard's by Jansen's pick-freeze estimator."""
    if kernel.input_measure is not None:
        return totals, None, "sobol"
    orders = kernel.order_variances
    if orders is None or orders.shape[-1] == 1:
        return totals, None, "first-order"
    n, d = x.shape
    # A private generator: the analysis gives the same numbers on every call and leaves the user's
    # random stream alone. Each coordinate of a and b is drawn from its own training column.
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(n, (2, s, d), generator=generator).to(x.device)
    a, b = (x.gather(0, r) for r in rows)
    hybrids = a.expand(d, s, d).clone()
    hybrids[torch.arange(d), :, torch.arange(d)] = b.T  # hybrids[i]: a with coordinate i from b
    points = torch.cat([a, b, hybrids.reshape(d * s, d)])
    m = (model.covar_module(points, x) @ alpha.unsqueeze(-1)).squeeze(-1).double()
    m_a, m_b, m_h = m[:s], m[s : 2 * s], m[2 * s :].reshape(d, s)
    variance = torch.cat([m_a, m_b]).var()
    squares = (m_a - m_h) ** 2 / (2 * variance)  # (D, S)
    return (squares.mean(-1).to(x.dtype), (squares.std(-1) / math.sqrt(s)).to(x.dtype), "pick-freeze")


def _sobol(kernel: OrthogonalAdditiveKernel, outer, x: Tensor, alpha: Tensor):
    # in float64: the L2(p) inner products hold exponentials of an input's squared distance from the
    # measure in lengthscales, which overflow float32 for an outlier (every share came out NaN on UCI
    # data, docs/interactions.rst)
    d, r, dtype = kernel.num_dims, kernel.max_degree, x.dtype
    x, alpha, outer = x.double(), alpha.double(), torch.as_tensor(outer).double()
    features = orthogonal_rbf_l2_features(x, kernel.base_kernel.lengthscale.double(), kernel.measure_mean.double(),
                                          kernel.measure_std.double())
    formula = InteractionFormula(StationaryFormula("rbf"), r, kind="orthogonal-l2")
    binom = torch.tensor([math.comb(d, k) for k in range(1, r + 1)], dtype=x.dtype, device=x.device)
    lam = ((outer * kernel.outputscale.double()) ** 2 / binom).reshape(1, r)
    squared_scales = (kernel.term_scales().double() ** 2).reshape(1, d)

    def weighted(lam_: Tensor) -> tuple[Tensor, Tensor]:
        lam_ = lam_.clone().requires_grad_(True)
        mu = torch.ones_like(squared_scales, requires_grad=True)
        with torch.enable_grad():
            q = alpha @ backend.pairwise_matmul(formula, features, features,
                                               {"order_variances": lam_, "scales": mu * squared_scales},
                                               alpha.unsqueeze(-1)).squeeze(-1)
            grad_lam, grad_mu = torch.autograd.grad(q, [lam_, mu])
        return lam_.detach() * grad_lam, grad_mu  # per order; per dimension (mu = 1)

    per_order, totals = weighted(lam)
    first_only = torch.zeros_like(lam)
    first_only[..., 0] = lam[..., 0]
    _, first = weighted(first_only)
    total = per_order.sum()
    shares = ((per_order / total).reshape(r), (first / total).reshape(d), (totals / total).reshape(d))
    return (*(t.to(dtype) for t in shares), "sobol")


def summary(analysis: ComponentAnalysis) -> dict[str, Any]:
    """The analysis' numbers as plain lists (JSON-serializable): what :func:`report_lines` reads,
    and what ``lazykern uci --json`` writes.

    Args:
        analysis: from :func:`component_analysis`.

    Returns:
        A dict with ``order_shares``, ``dimension_shares`` (first-order shares), ``total_effects``,
        ``total_effects_se`` (``None`` where exact), ``analysis_kind``, ``total_effects_kind`` and
        ``component_axes`` (``"inputs"`` or ``"projections"``: what ``dimension_shares`` and
        ``total_effects`` are listed by).

    Example:
        >>> import torch
        >>> from lazykern.components import component_analysis, summary
        >>> from lazykern.regression import build_model
        >>> x = torch.randn(60, 2, dtype=torch.float64)
        >>> model, _ = build_model(x, torch.sin(x[:, 0]), "additive-rbf")
        >>> sorted(summary(component_analysis(model)))  # doctest: +NORMALIZE_WHITESPACE
        ['analysis_kind', 'component_axes', 'dimension_shares', 'order_shares', 'total_effects',
         'total_effects_kind', 'total_effects_se']
    """
    errors = analysis.total_effects_se
    return {"order_shares": analysis.order_shares.tolist(), "dimension_shares": analysis.dimension_shares.tolist(),
            "total_effects": analysis.total_effects.tolist(),
            "total_effects_se": None if errors is None else errors.tolist(),
            "analysis_kind": analysis.kind, "total_effects_kind": analysis.total_kind, "component_axes": analysis.axes}
