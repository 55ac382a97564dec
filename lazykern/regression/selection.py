r"""Model selection on a subset: exact fits of a few points that choose where training starts and
how low the noise may go.

Each fit is :func:`~lazykern.regression.train` with L-BFGS on the exact (Cholesky) likelihood of a
random subset: :func:`~lazykern.regression.warm_start` hands a model its subset's hyperparameters,
:func:`~lazykern.regression.ard_scaled_directions` scales diverse directions by the lengthscales
ARD RBF fits, and :func:`~lazykern.regression.ard_noise_floor` takes the noise ARD RBF fits as a
lower bound for a kernel that can explain the noise. An exact fit of :math:`M` points costs
:math:`O(M^3)` per step whatever the full size, so a subset's answer is cheap where a full-size
search is not (the measurements: ``docs/projected.rst``).

Example:
    >>> import torch
    >>> from lazykern.regression import ard_noise_floor
    >>> x = torch.rand(80, 2, dtype=torch.float64); y = torch.sin(4 * x[:, 0])
    >>> ard_noise_floor(x, y, size=40, iters=20, progress=False) > 0
    True
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import gpytorch
import torch
from torch import Tensor

from ..kernels.base import LazyKernel
from ..kernels.projected import diverse_directions
from ..validation import check_positive_int
from .model import build_model
from .training import TrainingLog, train

__all__ = ["ARD_FIT_POINTS", "ArdFit", "ard_noise_floor", "ard_scaled_directions", "fit_ard", "scale_learned_directions",
           "warm_start"]

ARD_FIT_POINTS = 1000
"""Points of the exact ARD RBF fit of :func:`~lazykern.regression.ard_scaled_directions`,
:func:`~lazykern.regression.ard_noise_floor` and :class:`~lazykern.regression.NoiseFloor` unless told
otherwise: few enough for a Cholesky factor of the subset to be cheap at every step, the size the
measurements of ``docs/projected.rst`` used."""


def warm_start(
    model: gpytorch.models.ExactGP,
    likelihood: gpytorch.likelihoods.Likelihood,
    size: int,
    iters: int = 200,
    progress: bool = True,
    *,
    seed: int = 0,
) -> TrainingLog:
    r"""Fit the hyperparameters exactly on a random subset of ``size`` training points; ``model`` takes them.

    A copy of the model on the subset (rows :math:`S`, :math:`|S| = M`) is trained by
    :func:`~lazykern.regression.train` with L-BFGS on the exact likelihood
    :math:`\log p(y_S \mid X_S, \theta)`, refined in float64 as ``train`` does; the model and its
    likelihood then take its :math:`\theta` and keep their own training data and dtype. Training on
    all points (conjugate gradients and Adam, or exactly) goes on from there, as large exact GPs are
    trained from a subset's hyperparameters (Wang et al., "Exact Gaussian processes on a million data
    points", NeurIPS 2019): Adam from the recipe's start can end far from where L-BFGS on the exact
    likelihood does (``docs/projected.rst`` has the runs).

    Args:
        model: an exact GP holding its training data (more than ``size`` points).
        likelihood: its likelihood (``model.likelihood``).
        size: number of training points of the subset, drawn without replacement.
        iters: most L-BFGS iterations (see :func:`~lazykern.regression.train`).
        progress: show ``train``'s progress bar.
        seed: seed of the subset's draw.

    Returns:
        the subset's :class:`~lazykern.regression.TrainingLog`.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, warm_start
        >>> x = torch.randn(300, 2, dtype=torch.float64); y = torch.sin(2 * x).sum(-1)
        >>> model, likelihood = build_model(x, y, "rbf-ard")
        >>> log = warm_start(model, likelihood, 100, iters=50, progress=False)
        >>> log.converged, model.train_inputs[0].shape[0], likelihood.noise.item() < 0.01
        (True, 300, True)
    """
    check_positive_int("size", size)
    n = model.train_inputs[0].shape[-2]
    if size >= n:
        raise ValueError(f"size must be below the number of training points ({n}); got {size}")
    if likelihood is not model.likelihood:
        raise ValueError("likelihood must be the model's own (model.likelihood)")
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(n, generator=generator)[:size].to(model.train_targets.device)
    subset = copy.deepcopy(model)
    subset.set_train_data(tuple(x[..., rows, :] for x in model.train_inputs), model.train_targets[..., rows],
                          strict=False)
    with gpytorch.settings.max_cholesky_size(size):
        log = train(subset, subset.likelihood, iters=iters, progress=progress, optimizer="lbfgs")
    model.load_state_dict(subset.state_dict())  # copy_ casts float64 refinements back to the model's dtype
    return log


def ard_scaled_directions(
    train_x: Tensor,
    train_y: Tensor,
    num_projections: int,
    size: int = ARD_FIT_POINTS,
    iters: int = 200,
    progress: bool = True,
    *,
    seed: int = 0,
    return_noise: bool = False,
) -> Tensor | tuple[Tensor, float]:
    r"""Diverse directions divided by the lengthscales ARD RBF fits exactly: :math:`w_j = \Lambda^{-1}
    u_j`, :math:`\Lambda = \operatorname{diag}(\ell)`, a ``(d, num_projections)`` tensor to start
    learned directions from (``ProjectedAdditiveKernel(..., projections=W, learn_projections=True)``).

    :math:`u_j` are :func:`~lazykern.kernels.projected.diverse_directions` (``seed``) and
    :math:`\ell` the lengthscales of the named ``rbf-ard`` kernel trained by
    :func:`~lazykern.regression.train` (L-BFGS, Cholesky) on a random subset of ``size`` points
    (:func:`warm_start`, ``seed``), or on all of them where there are no more. Each projection then
    starts as :math:`u_j^\top \Lambda^{-1} x`, the recipe's input lengthscales at ARD's values, so
    that directions along inputs the data ignore start short; where DPA's start stays far from ARD,
    this one closes much of the gap (``docs/projected.rst``, "Fixed or learned directions").

    Args:
        train_x: ``(n, d)`` training inputs.
        train_y: ``(n,)`` training targets.
        num_projections: number of directions J.
        size: points of ARD's exact fit.
        iters: most L-BFGS iterations of that fit.
        progress: show ``train``'s progress bar.
        seed: seed of the subset's draw and of the directions.
        return_noise: also return the noise variance of ARD's fit, a floor for the learned directions'
            (:func:`~lazykern.regression.build_model`'s ``noise_floor``), which otherwise can explain the noise.

    Returns:
        a ``(d, num_projections)`` tensor in ``train_x``'s dtype and on its device; with ``return_noise``,
        that tensor and the noise variance (a float).

    Example:
        >>> import torch
        >>> from lazykern import ProjectedAdditiveKernel, MaternKernel
        >>> from lazykern.regression import ard_scaled_directions, build_model
        >>> x = torch.randn(300, 3, dtype=torch.float64); y = torch.sin(3 * x[:, 0]) + 0.1 * x[:, 1]
        >>> W = ard_scaled_directions(x, y, 6, size=100, iters=50, progress=False)
        >>> kernel = ProjectedAdditiveKernel(MaternKernel(nu=2.5), 3, 6, projections=W, learn_projections=True)
        >>> W.shape, bool(W[0].norm() > W[2].norm())   # y does not depend on x_2: a long lengthscale
        (torch.Size([3, 6]), True)
        >>> W, noise = ard_scaled_directions(x, y, 6, size=100, iters=50, progress=False, return_noise=True)
        >>> model, likelihood = build_model(x, y, kernel, noise_floor=noise)   # noise at least ARD's
    """
    check_positive_int("num_projections", num_projections)
    model, likelihood = _fit_ard(train_x, train_y, size, iters, progress, seed)
    lengthscales = model.covar_module.base_kernel.lengthscale.detach().reshape(-1, 1)
    directions = (diverse_directions(train_x.shape[1], num_projections, seed) / lengthscales).to(train_x)
    return (directions, likelihood.noise.item()) if return_noise else directions


def ard_noise_floor(
    train_x: Tensor, train_y: Tensor, size: int = ARD_FIT_POINTS, iters: int = 200, progress: bool = True, *,
    seed: int = 0,
) -> float:
    r"""The noise variance :math:`\hat\sigma^2_{\text{ARD}}` ARD RBF fits exactly on ``size`` of the
    points: a lower bound for the noise of a kernel that can explain the noise
    (:func:`~lazykern.regression.build_model`'s ``noise_floor``), such as learned projections.

    A flexible kernel raises the marginal likelihood by absorbing the noise into its function and
    then predicts overconfidently; a simpler model's noise on the same data is a floor it cannot
    argue with (``docs/projected.rst``, "Bounding the noise"). The fit is that of
    :func:`ard_scaled_directions` (the named ``rbf-ard`` kernel, L-BFGS, Cholesky, on a random
    subset of ``size`` points drawn with ``seed``, or on all of them where there are no more);
    :class:`~lazykern.regression.NoiseFloor` ``("ard")`` and ``lazykern uci --noise-floor ard`` use it.

    Args:
        train_x: ``(n, d)`` training inputs.
        train_y: ``(n,)`` training targets.
        size: points of ARD's exact fit.
        iters: most L-BFGS iterations of that fit.
        progress: show ``train``'s progress bar.
        seed: seed of the subset's draw.

    Returns:
        the noise variance, a float in the units of ``train_y`` squared.

    Example:
        >>> import torch
        >>> from lazykern.regression import ard_noise_floor
        >>> _ = torch.manual_seed(0)
        >>> x = torch.rand(200, 2, dtype=torch.float64); y = torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(200)
        >>> floor = ard_noise_floor(x, y, size=100, iters=50, progress=False)
        >>> 0.001 < floor < 0.1   # the noise's variance is 0.01
        True
    """
    return _fit_ard(train_x, train_y, size, iters, progress, seed)[1].noise.item()


class ArdFit(NamedTuple):
    """What an exact ARD RBF fit found: its ``(d,)`` lengthscales and its noise variance."""

    lengthscales: Tensor
    noise: float


def fit_ard(train_x: Tensor, train_y: Tensor, size: int = ARD_FIT_POINTS, iters: int = 200, progress: bool = True, *,
            seed: int = 0) -> ArdFit:
    r"""The named ``rbf-ard`` kernel fitted exactly (Cholesky, L-BFGS) on a random subset of ``size``
    points (all of them where there are no more): its lengthscales and noise, what
    :func:`~lazykern.regression.ard_scaled_directions`, :func:`~lazykern.regression.ard_noise_floor` and
    the recipe's ``ard_start`` take from it.

    Args:
        train_x, train_y: ``(n, d)`` and ``(n,)`` training data.
        size: points of the fit.
        iters: most L-BFGS iterations.
        progress: show the fit's progress bar.
        seed: seed of the subset's draw.

    Example:
        >>> import torch
        >>> from lazykern.regression.selection import fit_ard
        >>> x = torch.rand(150, 2, dtype=torch.float64); y = torch.sin(6 * x[:, 0])
        >>> fit = fit_ard(x, y, size=100, iters=30, progress=False)
        >>> fit.lengthscales.shape, bool(fit.lengthscales[0] < fit.lengthscales[1])   # y varies along x_0
        (torch.Size([2]), True)
    """
    model, likelihood = _fit_ard(train_x, train_y, size, iters, progress, seed)
    return ArdFit(model.covar_module.base_kernel.lengthscale.detach().reshape(-1), likelihood.noise.item())


def scale_learned_directions(kernel: torch.nn.Module, lengthscales: Tensor) -> None:
    r"""Divide the directions of every projected kernel in ``kernel`` that learns them by per-input
    ``lengthscales``: :math:`w_j \leftarrow \Lambda^{-1} w_j`, so that each projection starts at the
    input scales an ARD kernel found (:func:`~lazykern.regression.ard_scaled_directions` for a kernel
    already built).

    Args:
        kernel: a kernel module (``ScaleKernel`` or not).
        lengthscales: ``(d,)`` positive lengthscales of the inputs.

    Example:
        >>> import torch, lazykern
        >>> kernel = lazykern.ProjectedAdditiveKernel(lazykern.MaternKernel(nu=2.5), 2, 4, learn_projections=True)
        >>> before = kernel.projections.detach().clone()
        >>> scale_learned_directions(kernel, torch.tensor([2.0, 0.5]))
        >>> torch.allclose(kernel.projections, before / torch.tensor([[2.0], [0.5]]))
        True
    """
    with torch.no_grad():
        for module in kernel.modules():
            if isinstance(module, LazyKernel) and module.learns_projections:
                module.projections.div_(lengthscales.reshape(-1, 1).to(module.projections))


def _fit_ard(train_x: Tensor, train_y: Tensor, size: int, iters: int, progress: bool, seed: int):
    """The named ``rbf-ard`` model and likelihood trained exactly on ``size`` of the points (all, if no more)."""
    check_positive_int("size", size)
    model, likelihood = build_model(train_x, train_y, "rbf-ard")
    if size < train_x.shape[0]:
        warm_start(model, likelihood, size, iters, progress, seed=seed)
    else:
        with gpytorch.settings.max_cholesky_size(train_x.shape[0]):
            train(model, likelihood, iters, progress=progress, optimizer="lbfgs")
    return model, likelihood
