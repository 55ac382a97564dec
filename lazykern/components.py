r"""What an additive GP learned: its first-order components and its variance by order and input.

For a trained exact GP whose covariance is additive over dimensions (possibly with interactions),
:func:`component_analysis` returns tensors:

* the posterior mean (and, where a Cholesky factor is affordable, the variance) of every
  first-order component :math:`f_d` along its own axis;
* the share of variance of each interaction order, and of each input dimension.

With :math:`\alpha = (K + \sigma^2 I)^{-1} (y - \mu)` (GPyTorch's cached mean solve) and the
first-order term of the kernel :math:`c_d\, z_d(x_d, x'_d)` (:math:`c_d = \sigma_1^2 s_d / D` for
:class:`~lazykern.kernels.NewtonGirardAdditiveKernel` and
:class:`~lazykern.kernels.OrthogonalAdditiveKernel`, times a ``ScaleKernel``'s outputscale if any;
:math:`c_d = s\, w_d` for a scaled :class:`~lazykern.kernels.AdditiveStructureKernel`):

.. math::

    \mathbb E[f_d(t)] = c_d\, z_d(t, X_d)\, \alpha, \qquad
    \operatorname{Var}[f_d(t)] = c_d\, z_d(t, t) - c_d^2\, z_d(t, X_d) (K + \sigma^2 I)^{-1} z_d(X_d, t).

**Shares for OAK: Sobol indices, exact.** Components of different subsets of dimensions are
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

**Shares for other kernels: empirical.** Without orthogonality the orders overlap (a product of
RBF terms also contains lower-order effects); the share of order r is then the variance, over the
training inputs, of the order's posterior-mean component
:math:`m_r(x_i) = \sigma_r^2 \sum_j \tilde e_r(x_i, x_j)\, \alpha_j`, over the sum of these variances
(one batched lazy reduction, R times the cost of a matvec); the share of dimension d is that of
:math:`f_d(x_{id})` on the same scale. Above :data:`SHARE_POINTS` training inputs the variances
are taken over that many evenly spaced ones (each :math:`m_r(x_i)` still sums over all
:math:`j`): with all 26 orders of pol at N = 2000 the reduction cost 26 full kernel passes, more
than a tenth of the training time of ``lazykern uci``.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

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

__all__ = ["SHARE_POINTS", "ComponentAnalysis", "component_analysis", "plot_components"]


@dataclass
class ComponentAnalysis:
    """Result of :func:`component_analysis` (standardized units of inputs and targets).

    Attributes:
        grid: ``(T, D)``: evaluation points along each input axis (column d for component d),
            from the smallest to the largest training value.
        mean: ``(T, D)``: posterior mean of each first-order component on its grid.
        variance: ``(T, D)`` posterior variance, or ``None`` where it was not computed.
        order_shares: ``(R,)``: share of variance of interaction orders 1..R (sums to 1).
        dimension_shares: ``(D,)``: share of variance of each first-order component (on the scale
            of ``order_shares``: for OAK they sum to ``order_shares[0]``).
        total_effects: ``(D,)``: OAK only (else ``None``): total Sobol index of each dimension,
            the share of variance of all components that involve it.
        kind: ``"sobol"`` (OAK: exact under the input measure) or ``"empirical"`` (variances of
            posterior-mean components over the training inputs).
        train_x: ``(N, D)`` training inputs (for rugs in plots).
    """

    grid: Tensor
    mean: Tensor
    variance: Tensor | None
    order_shares: Tensor
    dimension_shares: Tensor
    total_effects: Tensor | None
    kind: str
    train_x: Tensor


def _unwrap(covar: Kernel) -> tuple[Kernel, Tensor | float]:
    if isinstance(covar, ScaleKernel):
        return covar.base_kernel, covar.outputscale
    return covar, 1.0


def _first_order(kernel: Kernel, outer: Tensor | float, x: Tensor):
    """Per-dimension 1-D problems of the first-order terms: the formula, ``(D, N, F)`` inputs, params."""
    d = kernel.num_dims
    if isinstance(kernel, OrthogonalAdditiveKernel):
        x_ = kernel.formula_arguments(x, x)[0]  # (N, 5D): [u, g(u), a(u), log a(u), m]
        per_dim = x_.reshape(x.shape[0], 5, d).permute(2, 0, 1)  # (D, N, 5)
        formula, params = InteractionFormula(StationaryFormula("rbf"), 1, kind="orthogonal"), {}
    else:
        x_, _, params = formula_inputs(kernel.base_kernel, x, x)
        per_dim = x_.transpose(0, 1).unsqueeze(-1)  # (D, N, 1)
        formula = InteractionFormula(formula_for(kernel.base_kernel, additive=False), 1)
        # (*, 1, D) per-dimension parameters become a batch of D; shared ones broadcast.
        params = {n: p.reshape(-1, 1, 1) if p.shape[-1] == d else p.reshape(1, 1, -1) for n, p in params.items()}
    if isinstance(kernel, NewtonGirardAdditiveKernel):
        weight = kernel.outputscale[..., 0] / d * kernel.term_scales().reshape(-1)
    else:
        weight = kernel.component_scales.reshape(-1)
    weight = (outer * weight).reshape(d, 1, 1)
    params = {**params, "order_variances": weight, "scales": torch.ones_like(weight)}
    return formula, per_dim, params


#: Most training inputs the empirical shares average over (see the module docstring).
SHARE_POINTS = 500


def _mean_solve(model: gpytorch.models.ExactGP) -> Tensor:
    x = model.train_inputs[0]
    model.eval()
    with torch.no_grad():
        model(x[:1])  # fills the prediction cache: alpha = (K + noise)^-1 (y - mean)
    return model.prediction_strategy.mean_cache


def component_analysis(
    model: gpytorch.models.ExactGP, *, grid_size: int = 100, variance_max_n: int = 5000
) -> ComponentAnalysis:
    """Components and variance shares of a trained additive exact GP (see the module docstring).

    Args:
        model: an exact GP (one input tensor, no batch) whose ``covar_module`` is a
            :class:`~lazykern.kernels.NewtonGirardAdditiveKernel`,
            :class:`~lazykern.kernels.OrthogonalAdditiveKernel` or
            :class:`~lazykern.kernels.AdditiveStructureKernel`, optionally inside a ``ScaleKernel``.
        grid_size: points T along each axis.
        variance_max_n: compute component variances (one dense Cholesky factor, O(N²) memory) up
            to this many training points; above it ``variance`` is ``None``.

    Returns:
        A :class:`ComponentAnalysis`; the model is left in eval mode.

    Example:
        See the module docstring.
    """
    check_positive_int("grid_size", grid_size)
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
        formula, x_dims, params = _first_order(kernel, outer, x)
        # Every transform is per coordinate, so the rows of the grid serve as points: column d of
        # the grid becomes dimension d's one-dimensional inputs.
        t_dims = _first_order(kernel, outer, grid)[1]
        mean = backend.pairwise_matmul(formula, t_dims, x_dims, params, alpha.unsqueeze(-1)).squeeze(-1).T
        variance = _variance(model, formula, t_dims, x_dims, params) if x.shape[0] <= variance_max_n else None
        orders, dims, totals, kind = _shares(model, kernel, outer, formula, x, x_dims, params, alpha)
    return ComponentAnalysis(grid=grid, mean=mean, variance=variance, order_shares=orders, dimension_shares=dims,
                             total_effects=totals, kind=kind, train_x=x.detach())


def _variance(model, formula, t_dims: Tensor, x_dims: Tensor, params: dict[str, Tensor]) -> Tensor:
    x = model.train_inputs[0]
    noise = model.likelihood.noise.reshape(-1)[0]
    K = model.covar_module(x).to_dense()
    L = torch.linalg.cholesky(K + noise * torch.eye(x.shape[0], dtype=x.dtype, device=x.device))
    cross = backend.pairwise_dense(formula, t_dims, x_dims, params)  # (D, T, N) = c_d z_d(t, X_d)
    prior = backend.elementwise(formula, t_dims, t_dims, params)  # (D, T)
    v = torch.linalg.solve_triangular(L, cross.transpose(-1, -2), upper=False)  # (D, N, T)
    return (prior - (v * v).sum(-2)).clamp_min(0).T


def _shares(model, kernel, outer, formula, x, x_dims, params, alpha):
    d = kernel.num_dims
    if isinstance(kernel, OrthogonalAdditiveKernel):
        return _sobol(kernel, outer, x, alpha)
    # Empirical: variance over (evenly spaced) training inputs of each order's and each dimension's component.
    rows = torch.linspace(0, x.shape[0] - 1, min(x.shape[0], SHARE_POINTS), device=x.device).round().long()
    first = backend.pairwise_matmul(formula, x_dims[:, rows], x_dims, params, alpha.unsqueeze(-1)).squeeze(-1)  # (D, S)
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
    return order_var / total, first.var(-1) / total, None, "empirical"


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


def plot_components(
    analysis: ComponentAnalysis,
    path: str | Path,
    *,
    names: Sequence[str] | None = None,
    x_mean: Tensor | None = None,
    x_std: Tensor | None = None,
    y_std: float = 1.0,
    title: str | None = None,
    max_panels: int = 12,
) -> Path:
    """Plot the first-order components (mean ± 2σ bands, rug of training inputs) of the dimensions
    with the largest shares, and the order and dimension shares as bars; save to ``path``.

    Args:
        analysis: from :func:`component_analysis`.
        path: image file to write (format from its suffix, e.g. ``.png``, ``.pdf``).
        names: one name per input dimension (default ``x0, x1, ...``).
        x_mean, x_std, y_std: to draw in original units (e.g. a :class:`lazykern.data.UCISplit`'s).
        title: figure title.
        max_panels: at most this many component panels (largest ``dimension_shares`` first).

    Returns:
        The path written.

    Example:
        >>> plot_components(result, "components.png", title="pol")  # doctest: +SKIP
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
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
    x_mean = torch.zeros(d) if x_mean is None else x_mean.detach().cpu().reshape(d)
    x_std = torch.ones(d) if x_std is None else x_std.detach().cpu().reshape(d)
    order = torch.argsort(analysis.dimension_shares.detach().cpu(), descending=True)[:max_panels].tolist()
    cols = min(4, len(order) + 2)
    rows = math.ceil((len(order) + 2) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.5 * rows), squeeze=False)
    flat = list(axes.flat)
    grid, mean = analysis.grid.detach().cpu(), analysis.mean.detach().cpu() * y_std
    std = None if analysis.variance is None else analysis.variance.detach().cpu().sqrt() * y_std
    train = analysis.train_x.detach().cpu()
    for ax, k in zip(flat, order):
        t = grid[:, k] * x_std[k] + x_mean[k]
        if std is not None:
            ax.fill_between(t, mean[:, k] - 2 * std[:, k], mean[:, k] + 2 * std[:, k], alpha=0.3, color="C0", lw=0)
        ax.plot(t, mean[:, k], color="C0")
        low = float((mean[:, k] - (2 * std[:, k] if std is not None else 0)).min())
        ax.plot(train[:, k] * x_std[k] + x_mean[k], [low] * len(train), "|", color="k", alpha=0.05, ms=6)
        ax.set_title(f"{names[k]} (share {float(analysis.dimension_shares[k]):.2f})", fontsize=9)
        ax.tick_params(labelsize=7)
    bars = flat[len(order)]
    shares = analysis.order_shares.detach().cpu()
    bars.bar(range(1, len(shares) + 1), shares, color="C1")
    bars.set_title(f"variance share by order ({analysis.kind})", fontsize=9)
    bars.set_xlabel("interaction order", fontsize=8)
    dims = flat[len(order) + 1]
    values = (analysis.total_effects if analysis.total_effects is not None else analysis.dimension_shares).cpu()
    dims.bar(range(d), values.detach(), color="C2")
    dims.set_title("total effect by input" if analysis.total_effects is not None else "first-order share by input",
                   fontsize=9)
    dims.set_xticks(range(d), names, rotation=90, fontsize=6)
    for ax in flat[len(order) + 2 :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
