r"""What an additive GP learned: its first-order components, its variance by order, each input's effect.

For a trained exact GP whose covariance is additive over dimensions (possibly with interactions),
:func:`component_analysis` returns tensors:

* the posterior mean and, where a Cholesky factor is affordable, the variance of every first-order
  component :math:`f_d` along its own axis, **centred** on its average over the training inputs
  (the averages, with the GP's constant mean, form the additive offset, returned separately: a
  component's level is not identifiable from the data, only its shape is);
* the **order shares**, **first-order shares** and **total effects** defined below.

**Vocabulary** (the command ``lazykern``, the plots, the examples and the docs use these terms with
these meanings). Write :math:`m(x)` for the posterior mean and :math:`\operatorname{Var} m` for its
variance over the inputs:

* *order share* of order r: the share of :math:`\operatorname{Var} m` in the terms of exactly r inputs;
* *first-order share* of input i (``dimension_shares``): the share in input i's first-order
  component :math:`f_i(x_i)` alone;
* *total effect* of input i (``total_effects``): the share in every term that involves input i, of
  every order: the total Sobol index

  .. math::

      T_i = \frac{\mathbb E_{x_{\sim i}}\big[\operatorname{Var}_{x_i} \big(m(x) \mid x_{\sim i}\big)\big]}
                 {\operatorname{Var} m}.

  Total effects rank the inputs. They sum to at least 1 (an interaction counts once for each of
  its inputs); an input whose effect is all in interactions has a first-order share of 0 and a
  large total effect.

**Components.** With :math:`\alpha = (K + \sigma^2 I)^{-1} (y - \mu)` (GPyTorch's cached mean solve) and the
first-order term of the kernel :math:`c_d\, z_d(x_d, x'_d)` (:math:`c_d = \sigma_1^2 s_d / D` for
:class:`~lazykern.kernels.NewtonGirardAdditiveKernel` and
:class:`~lazykern.kernels.OrthogonalAdditiveKernel`, times a ``ScaleKernel``'s outputscale if any;
:math:`c_d = s\, w_d` for a scaled :class:`~lazykern.kernels.AdditiveStructureKernel`), the
centred component :math:`g_d(t) = f_d(t) - \frac1N \sum_i f_d(x_{id})` is Gaussian under the posterior with

.. math::

    \mathbb E[g_d(t)] = c_d\, \tilde z_d(t, X_d)\, \alpha, \qquad
    \operatorname{Var}[g_d(t)] = c_d\, \bar z_d(t, t) - c_d^2\, \tilde z_d(t, X_d) (K + \sigma^2 I)^{-1} \tilde z_d(X_d, t),

with :math:`\tilde z_d(t, x_{jd}) = z_d(t, x_{jd}) - \frac1N \sum_i z_d(x_{id}, x_{jd})` (the
covariance of :math:`g_d(t)` with the training targets: centred on the side of :math:`t` only; the
row means are one lazy reduction) and :math:`\bar z_d(t, t) = z_d(t, t) - \frac2N \sum_i z_d(t, x_{id})
+ \frac1{N^2} \sum_{ij} z_d(x_{id}, x_{jd})` (the prior variance of the centred component). The
offset of component d is :math:`\frac1N \sum_{ij} c_d z_d(x_{id}, x_{jd}) \alpha_j`.

**Order shares and total effects for OAK: Sobol indices, exact.** Components of different subsets of dimensions are
orthogonal under the input measure :math:`p`, so the variance of the posterior mean splits into
:math:`\sum_S \lVert m_S \rVert^2`. Order r contributes
:math:`\lVert m_r \rVert^2 = \frac{\sigma_r^4}{\binom Dr}\, \alpha^\top \tilde E_r(s^2 \odot C)\, \alpha`,
with :math:`C_d(x_i, x_j) = \int \tilde k_d(t, x_{id})\, \tilde k_d(t, x_{jd})\, p_d(t)\, dt` in closed
form (:func:`lazykern.formulas.interactions.orthogonal_rbf_l2_features`) and :math:`\tilde E_r` the
normalized elementary symmetric polynomial of these N x N x D values: one lazy reduction
:math:`Q(\lambda, \mu) = \alpha^\top [\sum_r \lambda_r \tilde E_r(\mu \odot s^2 \odot C)]\, \alpha` and its
gradient give every order (:math:`\lambda_r\, \partial Q / \partial \lambda_r`) and every
dimension's total effect (:math:`\mu_d\, \partial Q / \partial \mu_d` at :math:`\mu = 1`: the sum of
:math:`\lVert m_S \rVert^2` over the subsets S that contain d). Nothing N x N is stored.

**Order shares for other kernels: empirical.** Without orthogonality the orders overlap (a product of
RBF terms also contains lower-order effects); the order share of order r is then the variance, over the
training inputs, of the order's posterior-mean term
:math:`m_r(x_i) = \sigma_r^2 \sum_j \tilde e_r(x_i, x_j)\, \alpha_j`, over the sum of these variances
(one batched lazy reduction, R times the cost of a matvec): not a Sobol index. The first-order share of
dimension d is that of :math:`f_d(x_{id})` on the same scale. Above :data:`SHARE_POINTS` training inputs the variances
are taken over that many evenly spaced ones (each :math:`m_r(x_i)` still sums over all
:math:`j`): with all 26 orders of pol at N = 2000 the reduction cost 26 full kernel passes, more
than a tenth of the training time of ``lazykern uci``.

**Total effects for Newton–Girard: Monte Carlo (pick-freeze).** The terms of the kernel that contain
input i (:math:`s_i\, \partial k / \partial s_i`, the elementary symmetric polynomials being linear in
each :math:`s_i z_i`) are not orthogonal to the others, so the variance of their posterior mean
is not the part of :math:`\operatorname{Var} m` that input i explains. :math:`T_i` is estimated from
its definition instead, by Jansen's estimator on the posterior mean: with
:math:`a_1..a_S, b_1..b_S` drawn independently from :math:`P = \prod_d \hat P_d`, the product of the
training inputs' marginal distributions (:data:`EFFECT_POINTS` of each), and :math:`a_s^{(i)}` the point
:math:`a_s` with coordinate i taken from :math:`b_s`,

.. math::

    \hat T_i = \frac{1}{2 S\, \hat V} \sum_{s=1}^S \big(m(a_s) - m(a_s^{(i)})\big)^2,

:math:`\hat V` the variance of :math:`m` over the :math:`a_s` and :math:`b_s`; ``total_effects_se``
holds each estimate's standard error. The draws come from a private generator (the same for every
call; the user's random stream is not touched), and cost :math:`S (D + 2)` rows of one kernel
matvec. Assumptions: the inputs are treated as independent (P is a product measure), and where
they are not, the hybrid points :math:`a_s^{(i)}` can leave the region of the data, where
:math:`m` is the prior's extrapolation; the estimate is of the posterior *mean*'s sensitivity, not of the
uncertainty about it. A first-order model (:class:`~lazykern.kernels.AdditiveStructureKernel`,
or ``max_degree=1``) has no other terms: its total effects are its first-order shares, exactly
(no Monte Carlo).

:func:`report_lines` prints these numbers with their definitions (the command and the examples call
it); :func:`plot_components` draws them.

Example:
    >>> import torch, lazykern
    >>> from lazykern.regression import build_model, train
    >>> x = torch.randn(300, 3, dtype=torch.float64)
    >>> y = torch.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2]
    >>> model, likelihood = build_model(x, y, "oak")
    >>> _ = train(model, likelihood, iters=30, progress=False)
    >>> result = lazykern.components.component_analysis(model)
    >>> result.mean.shape, result.order_shares.shape   # 100 grid points x 3 dims; orders 1..3
    (torch.Size([100, 3]), torch.Size([3]))
    >>> sorted(result.ranking()[:2])   # by total effect: x1 and x2 (their product: 2/3 of the variance)
    [1, 2]
    >>> float(result.dimension_shares[1]) < 0.05 < 0.5 < float(result.total_effects[1])   # all in order 2
    True
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import gpytorch
import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from . import backend
from .formulas.interactions import InteractionFormula, orthogonal_rbf_l2_features
from .formulas.stationary import StationaryFormula
from .kernels import AdditiveStructureKernel, NewtonGirardAdditiveKernel, OrthogonalAdditiveKernel
from .kernels.stationary import formula_for, formula_inputs
from .validation import check_positive_int

__all__ = ["SHARE_POINTS", "EFFECT_POINTS", "ComponentAnalysis", "component_analysis", "summary", "report_lines",
           "plot_components"]

#: Most training inputs the empirical shares average over (see the module docstring).
SHARE_POINTS = 500

#: Pick-freeze draws of the Monte-Carlo total effects (``component_analysis(effect_points=)``).
EFFECT_POINTS = 1000

#: What each ``kind`` of order shares is, and how each ``total_kind`` of total effects was computed:
#: the one place these definitions are written for the report and the plots.
ORDER_SHARE_MEANING = {
    "sobol": "Sobol indices of the posterior mean under the input measure: the share of its variance in "
             "interactions of exactly r inputs",
    "empirical": "variance over the training inputs of each order's posterior-mean term, over their sum; "
                 "the orders' terms overlap, so these are not Sobol indices",
}
TOTAL_EFFECT_MEANING = {
    "sobol": "closed form under the input measure",
    "pick-freeze": "Monte Carlo (pick-freeze) under independent training marginals",
    "first-order": "exact: a first-order model, total effect = first-order share",
}


@dataclass
class ComponentAnalysis:
    """Result of :func:`component_analysis` (standardized units of inputs and targets).

    Attributes:
        grid: ``(T, D)``: evaluation points along each input axis (column d for component d),
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
            ``"first-order"`` (see the module docstring).
        train_x: ``(N, D)`` training inputs (for rugs in plots).
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

    def ranking(self) -> list[int]:
        """Input indices by decreasing total effect (ties by first-order share)."""
        return _ranking(self.total_effects.tolist(), self.dimension_shares.tolist())


def _ranking(totals: Sequence[float], firsts: Sequence[float]) -> list[int]:
    return sorted(range(len(totals)), key=lambda k: (-totals[k], -firsts[k]))


def _unwrap(covar: Kernel) -> tuple[Kernel, Tensor | float]:
    if isinstance(covar, ScaleKernel):
        return covar.base_kernel, covar.outputscale
    return covar, 1.0


def _first_order(kernel: Kernel, outer: Tensor | float, t: Tensor, x: Tensor):
    """Per-dimension 1-D problems of the first-order terms between points ``t`` and training inputs
    ``x``: the formula, ``(D, T, F)`` and ``(D, N, F)`` inputs, params. Both sides are transformed
    together: the stationary kernels' inputs are centred on a shift taken from both, so a grid
    transformed on its own would be shifted against the training inputs."""
    d = kernel.num_dims
    if isinstance(kernel, OrthogonalAdditiveKernel):
        sides = kernel.formula_arguments(t, x)[:2]  # (*, 5D): [u, g(u), a(u), log a(u), m]
        sides = [side.reshape(side.shape[0], 5, d).permute(2, 0, 1) for side in sides]  # (D, *, 5)
        formula, params = InteractionFormula(StationaryFormula("rbf"), 1, kind="orthogonal"), {}
    else:
        t_, x_, params = formula_inputs(kernel.base_kernel, t, x)
        sides = [side.transpose(0, 1).unsqueeze(-1) for side in (t_, x_)]  # (D, *, 1)
        formula = InteractionFormula(formula_for(kernel.base_kernel, additive=False), 1)
        # (*, 1, D) per-dimension parameters become a batch of D; shared ones broadcast.
        params = {n: p.reshape(-1, 1, 1) if p.shape[-1] == d else p.reshape(1, 1, -1) for n, p in params.items()}
    if isinstance(kernel, NewtonGirardAdditiveKernel):
        weight = kernel.outputscale[..., 0] / d * kernel.term_scales().reshape(-1)
    else:
        weight = kernel.component_scales.reshape(-1)
    weight = (outer * weight).reshape(d, 1, 1)
    params = {**params, "order_variances": weight, "scales": torch.ones_like(weight)}
    return formula, *sides, params


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
    GP (see the module docstring for each definition).

    Args:
        model: an exact GP (one input tensor, no batch) whose ``covar_module`` is a
            :class:`~lazykern.kernels.NewtonGirardAdditiveKernel`,
            :class:`~lazykern.kernels.OrthogonalAdditiveKernel` or
            :class:`~lazykern.kernels.AdditiveStructureKernel`, optionally inside a ``ScaleKernel``.
        grid_size: points T along each axis.
        variance_max_n: compute component variances (one dense Cholesky factor, O(N²) memory) up
            to this many training points; above it ``variance`` is ``None``.
        effect_points: pick-freeze draws S of the Monte-Carlo total effects (Newton–Girard);
            their standard errors shrink as :math:`1/\sqrt S`, their cost is :math:`S (D + 2)` rows
            of one kernel matvec.

    Returns:
        A :class:`ComponentAnalysis`; the model is left in eval mode.

    Example:
        See the module docstring.
    """
    check_positive_int("grid_size", grid_size)
    check_positive_int("effect_points", effect_points)
    kernel, outer = _unwrap(model.covar_module)
    if not isinstance(kernel, AdditiveStructureKernel) or kernel.batch_shape:
        raise TypeError("component_analysis needs a covar_module that is a (ScaleKernel of a) non-batch "
                        "NewtonGirardAdditiveKernel, OrthogonalAdditiveKernel or AdditiveStructureKernel, "
                        f"got {type(model.covar_module).__name__}")
    x = model.train_inputs[0]
    if x.dim() != 2:
        raise ValueError(f"component_analysis needs (n, d) training inputs, got shape {tuple(x.shape)}")
    alpha = _mean_solve(model)
    with torch.no_grad():
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
        totals, errors, total_kind = _total_effects(model, kernel, x, alpha, totals, effect_points)
    # Said, not passed on silently: NaN shares once reached the UCI table's page unremarked.
    broken = [name for name, v in (("order shares", orders), ("first-order shares", dims), ("total effects", totals))
              if not torch.isfinite(v).all()]
    if broken:
        warnings.warn(f"component_analysis: the {', '.join(broken)} are not all finite (lengthscales "
                      f"{kernel.base_kernel.lengthscale.detach().reshape(-1).tolist()}); read them as unknown",
                      RuntimeWarning, stacklevel=2)
    constant = getattr(model.mean_module, "constant", None)
    return ComponentAnalysis(grid=grid, mean=(cross - offsets.unsqueeze(-1)).T, variance=variance,
                             offsets=offsets, constant=0.0 if constant is None else float(constant.detach()),
                             order_shares=orders, dimension_shares=dims, total_effects=totals,
                             total_effects_se=errors, kind=kind, total_kind=total_kind, train_x=x.detach())


def _variance(model, formula, t_dims: Tensor, x_dims: Tensor, params: dict[str, Tensor], means: Tensor) -> Tensor:
    """Posterior variance of the centred components (module docstring): ``means`` (D, N) holds
    :math:`\\frac1N \\sum_i c_d z_d(x_{id}, x_{jd})`."""
    x = model.train_inputs[0]
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
    if isinstance(kernel, OrthogonalAdditiveKernel):
        return _sobol(kernel, outer, x, alpha)
    # Empirical: variance over (evenly spaced) training inputs of each order's and each dimension's component.
    rows = torch.linspace(0, x.shape[0] - 1, min(x.shape[0], SHARE_POINTS), device=x.device).round().long()
    first = at_train[:, rows]  # (D, S)
    if isinstance(kernel, NewtonGirardAdditiveKernel):
        r = kernel.max_degree
        x_, _, base_params = kernel.formula_arguments(x, x)
        order_params = {**base_params, "scales": kernel.term_scales(),
                        "order_variances": (outer * torch.diag_embed(kernel.outputscale)).reshape(r, 1, r)}
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
    if isinstance(kernel, OrthogonalAdditiveKernel):
        return totals, None, "sobol"
    if getattr(kernel, "max_degree", 1) == 1:
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
    # measure in lengthscales, which overflow float32 for an outlier (pol has inputs 14 standard
    # deviations out: every share came out NaN)
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
        ``total_effects_se`` (``None`` where exact), ``analysis_kind`` and ``total_effects_kind``.

    Example:
        >>> sorted(summary(result))  # doctest: +SKIP
        ['analysis_kind', 'dimension_shares', 'order_shares', 'total_effects', 'total_effects_kind', 'total_effects_se']
    """
    errors = analysis.total_effects_se
    return {"order_shares": analysis.order_shares.tolist(), "dimension_shares": analysis.dimension_shares.tolist(),
            "total_effects": analysis.total_effects.tolist(),
            "total_effects_se": None if errors is None else errors.tolist(),
            "analysis_kind": analysis.kind, "total_effects_kind": analysis.total_kind}


def report_lines(
    record: Mapping[str, Any], *, names: Sequence[str] | None = None, orders: int = 8, inputs: int = 5
) -> list[str]:
    """The order shares and the inputs ranked by total effect, each with its definition, as text lines.

    Args:
        record: :func:`summary`'s dict (or any mapping with its keys, such as ``lazykern uci``'s
            JSON record); without ``order_shares`` (a kernel without components) no lines.
        names: one name per input (default ``x0, x1, ...``).
        orders: orders shown one by one; the rest are summed into one entry.
        inputs: inputs shown, by decreasing total effect.

    Example:
        >>> record = {"order_shares": [0.7, 0.3], "dimension_shares": [0.5, 0.2, 0.0],
        ...           "total_effects": [0.5, 0.5, 0.3], "total_effects_se": None,
        ...           "analysis_kind": "sobol", "total_effects_kind": "sobol"}
        >>> print("\\n".join(report_lines(record)))  # doctest: +NORMALIZE_WHITESPACE
        order shares        1: 0.700  2: 0.300
                            (Sobol indices of the posterior mean under the input measure: the share of its
                            variance in interactions of exactly r inputs)
        top inputs          x0: 0.500  x1: 0.500  x2: 0.300
        first-order shares  x0: 0.500  x1: 0.200  x2: 0.000
                            (total effect: the share of the posterior mean's variance in every term that involves
                            the input, of every order, i.e. its total Sobol index; closed form under the input
                            measure. First-order share: the share in its first-order component alone)
    """
    shares, firsts, totals = (record.get(k) for k in ("order_shares", "dimension_shares", "total_effects"))
    if shares is None or firsts is None or totals is None:
        return []
    names = list(names) if names is not None else [f"x{k}" for k in range(len(totals))]
    shown = "  ".join(f"{r}: {share:.3f}" for r, share in enumerate(shares[:orders], start=1))
    if len(shares) > orders:
        shown += f"  {orders + 1}-{len(shares)}: {sum(shares[orders:]):.3f}"
    top = _ranking(totals, firsts)[:inputs]
    how = TOTAL_EFFECT_MEANING[record["total_effects_kind"]]
    errors = record.get("total_effects_se")
    if errors is not None:
        how += f", standard error at most {max(errors):.3f}"
    return [
        f"order shares        {shown}",
        f"                    ({ORDER_SHARE_MEANING[record['analysis_kind']]})",
        f"top inputs          {'  '.join(f'{names[k]}: {totals[k]:.3f}' for k in top)}",
        f"first-order shares  {'  '.join(f'{names[k]}: {firsts[k]:.3f}' for k in top)}",
        "                    (total effect: the share of the posterior mean's variance in every term that involves "
        f"the input, of every order, i.e. its total Sobol index; {how}. First-order share: the share in its "
        "first-order component alone)",
    ]


def plot_components(
    analysis: ComponentAnalysis,
    path: str | Path,
    *,
    names: Sequence[str] | None = None,
    x_mean: Tensor | None = None,
    x_std: Tensor | None = None,
    y_mean: float = 0.0,
    y_std: float = 1.0,
    x_units: str | Sequence[str] | None = None,
    y_units: str | None = None,
    title: str | None = None,
    max_panels: int = 12,
) -> Path:
    """Save a figure of what the model learned: one panel per input (the largest total effects
    first), then the order shares and every input's total effect and first-order share.

    Each input's panel shows its centred first-order component (posterior mean, and a band of
    ± 2 posterior standard deviations of the centred component where ``analysis.variance`` is
    known) against the input, with a rug of the training inputs; the additive offset the centring
    removed (the GP's constant mean plus the components' training averages) is given in the title.
    OAK's components are identifiable and their bands show shape uncertainty alone; a
    Newton–Girard kernel's first-order term also trades off against its higher orders, which its
    (wider) bands include.

    Args:
        analysis: from :func:`component_analysis`.
        path: image file to write (format from its suffix, e.g. ``.png``, ``.pdf``).
        names: one name per input dimension (default ``x0, x1, ...``).
        x_mean, x_std, y_mean, y_std: to draw in original units (a :class:`lazykern.data.UCISplit`'s
            statistics): inputs ``x * x_std + x_mean``, components ``f * y_std``, offset ``y_mean + offset * y_std``.
        x_units: the inputs' unit, one for all or one per input (default: "original units" when
            ``x_std`` is given, else "standardized").
        y_units: the target's unit (default: "original units" when ``y_std != 1``, else "standardized").
        title: first line of the figure's title (e.g. dataset and kernel).
        max_panels: at most this many component panels.

    Returns:
        The path written.

    Example:
        >>> plot_components(result, "components.png", title="pol")  # doctest: +SKIP
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.lines
        import matplotlib.ticker
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - matplotlib ships with the dev extra
        raise ImportError("plot_components needs matplotlib: pip install matplotlib") from err
    path = Path(path)
    if not path.parent.resolve().is_dir():
        raise ValueError(f"path {path}: folder {path.parent} does not exist")
    check_positive_int("max_panels", max_panels)
    d = analysis.grid.shape[1]
    names = list(names) if names is not None else [f"x{k}" for k in range(d)]
    if len(names) != d:
        raise ValueError(f"names has {len(names)} entries for {d} dimensions")
    if x_units is None or isinstance(x_units, str):
        x_units = [x_units or ("original units" if x_std is not None else "standardized")] * d
    if len(x_units) != d:
        raise ValueError(f"x_units has {len(x_units)} entries for {d} dimensions")
    y_units = y_units or ("original units" if y_std != 1.0 or y_mean != 0.0 else "standardized")
    x_mean = torch.zeros(d) if x_mean is None else x_mean.detach().cpu().reshape(d)
    x_std = torch.ones(d) if x_std is None else x_std.detach().cpu().reshape(d)
    order = analysis.ranking()[:max_panels]
    cols = max(2, min(4, len(order)))
    rows = math.ceil(len(order) / cols)
    fig = plt.figure(figsize=(3.4 * cols, 2.8 * rows + 3.2))
    layout = fig.add_gridspec(rows + 1, 2 * cols, height_ratios=[2.8] * rows + [3.0])
    grid, mean = analysis.grid.detach().cpu(), analysis.mean.detach().cpu() * y_std
    std = None if analysis.variance is None else analysis.variance.detach().cpu().sqrt() * y_std
    train = analysis.train_x.detach().cpu()
    totals, firsts = analysis.total_effects.detach().cpu(), analysis.dimension_shares.detach().cpu()
    for n, k in enumerate(order):
        ax = fig.add_subplot(layout[n // cols, 2 * (n % cols) : 2 * (n % cols) + 2])
        t = grid[:, k] * x_std[k] + x_mean[k]
        if std is not None:
            ax.fill_between(t, mean[:, k] - 2 * std[:, k], mean[:, k] + 2 * std[:, k], alpha=0.3, color="C0", lw=0,
                            label="± 2 s.d. of the centred component (posterior)")
        ax.plot(t, mean[:, k], color="C0", label="posterior mean of the centred component")
        ax.axhline(0.0, color="0.6", lw=0.6)
        ax.plot(train[:, k] * x_std[k] + x_mean[k], torch.full((len(train),), 0.03), "|", color="k", alpha=0.1,
                ms=5, transform=ax.get_xaxis_transform())
        ax.set_title(f"{names[k]}: total effect {float(totals[k]):.2f}, first-order {float(firsts[k]):.2f}",
                     fontsize=9)
        ax.set_xlabel(f"{names[k]} ({x_units[k]})", fontsize=8)
        ax.set_ylabel(f"component ({y_units})", fontsize=8)
        ax.tick_params(labelsize=7)
        if n == 0:
            handles, labels = ax.get_legend_handles_labels()
    # the rug's own marks are faint (thousands overlap): the legend gets an opaque one
    handles.append(matplotlib.lines.Line2D([], [], color="k", marker="|", ls="", ms=8))
    labels.append("training inputs")
    bars = fig.add_subplot(layout[rows, :cols])
    shares = analysis.order_shares.detach().cpu()
    bars.bar(range(1, len(shares) + 1), shares, color="C1")
    bars.set_title("order shares (" + ("Sobol indices" if analysis.kind == "sobol"
                                       else "variance of each order's term; not Sobol indices") + ")", fontsize=9)
    bars.set_xlabel("interaction order r", fontsize=8)
    bars.set_xlim(0.0, len(shares) + 1.0)  # one order: a bar, not the whole panel
    bars.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    bars.set_ylabel("share of Var[posterior mean]", fontsize=8)
    bars.tick_params(labelsize=7)
    effects = fig.add_subplot(layout[rows, cols:])
    ranked = analysis.ranking()
    at = torch.arange(d, dtype=torch.float64).numpy()  # numpy throughout: matplotlib's own arithmetic on them
    errors = None if analysis.total_effects_se is None else 2 * analysis.total_effects_se.detach().cpu()[ranked].numpy()
    effects.bar(at - 0.2, totals[ranked].numpy(), width=0.4, color="C0", yerr=errors, capsize=2,
                label="total effect" + (" (± 2 s.e.)" if errors is not None else ""))
    effects.bar(at + 0.2, firsts[ranked].numpy(), width=0.4, color="C2", label="first-order share")
    effects.set_title("inputs by total effect", fontsize=9)
    effects.set_ylabel("share of Var[posterior mean]", fontsize=8)
    effects.set_xticks(at, [names[k] for k in ranked], rotation=90 if d > 8 else 0, fontsize=7)
    effects.tick_params(axis="y", labelsize=7)
    effects.legend(fontsize=7)
    offset = y_mean + (analysis.constant + float(analysis.offsets.sum())) * y_std
    heading = f"{title}\n" if title else ""
    fig.suptitle(f"{heading}first-order components, centred on their training-input average "
                 f"(offset removed: {offset:.4g} {y_units})", fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
