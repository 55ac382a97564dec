r"""Matheron's update of BoTorch's pathwise posterior samples by conjugate gradients
(:func:`gaussian_update`), registered with BoTorch's ``GaussianUpdate`` dispatcher for ``ExactGP``
models when this module is imported (by :mod:`lazykern.botorch`). BoTorch's own update factors the
dense N x N matrix; this one applies the lazy kernel operator, and leaves models without a lazykern
kernel, and small ones, to BoTorch's.
"""

from __future__ import annotations

import gpytorch
import numpy as np
import torch
from botorch.sampling.pathwise.features import KernelEvaluationMap
from botorch.sampling.pathwise.paths import GeneralizedLinearPath
from botorch.sampling.pathwise.update_strategies import GaussianUpdate, _gaussian_update_ExactGP
from botorch.sampling.pathwise.utils import get_input_transform, get_train_inputs, get_train_targets
from botorch.utils.transforms import is_ensemble
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import _GaussianLikelihoodBase
from gpytorch.models import ExactGP
from linear_operator.operators import LinearOperator, ZeroLinearOperator
from torch import Tensor

from ..kernels.base import LazyKernel
from ..solvers import PivotedCholeskyPreconditioner, cg

__all__ = ["gaussian_update"]


def _contains_lazykern_kernel(kernel: Kernel) -> bool:
    return any(isinstance(module, LazyKernel) for module in kernel.modules())


def gaussian_update(
    model: ExactGP,
    likelihood: _GaussianLikelihoodBase,
    *,
    sample_values: Tensor,
    target_values: Tensor | None = None,
    points: Tensor | None = None,
    noise_covariance: Tensor | LinearOperator | None = None,
    scale_tril: Tensor | LinearOperator | None = None,
    tol: float = 1e-6,
    rank: int = 100,
) -> GeneralizedLinearPath:
    r"""Matheron's update :math:`K(\cdot, X)\, v` with :math:`v = (K + \Sigma)^{-1}(y - f(X) - \varepsilon)`,
    solved by preconditioned conjugate gradients: every sample path is one right-hand side of one
    :func:`lazykern.solvers.cg` call, whose iterations apply the lazy kernel operator to all of them
    at once, so nothing N x N is formed. Models at or below GPyTorch's ``max_cholesky_size``
    (and models whose covariance holds no lazykern kernel) get BoTorch's exact update, which
    factors :math:`K + \Sigma`.

    Registered for ``ExactGP`` models with a Gaussian likelihood when this module is imported, so
    ``botorch.sampling.pathwise.draw_matheron_paths`` and everything built on it (Thompson
    sampling, ``get_optimal_samples``) use it.

    Args:
        model: the GP, an ``ExactGP`` with a Gaussian likelihood.
        likelihood: its likelihood.
        sample_values: the prior paths at the training inputs, ``(*sample_shape, *batch, N)``.
        target_values: the training targets (default: the model's, transformed).
        points: the training inputs (default: the model's, transformed).
        noise_covariance: :math:`\Sigma` (default: the likelihood's at ``points``).
        scale_tril: a Cholesky factor of :math:`K + \Sigma`; given, BoTorch's update uses it.
        tol: CG's relative residual tolerance per path.
        rank: rank of the pivoted-Cholesky preconditioner (capped at N).

    Example:
        >>> import torch, gpytorch, lazykern, lazykern.botorch
        >>> from botorch.models import SingleTaskGP
        >>> from botorch.sampling.pathwise import draw_matheron_paths
        >>> X = torch.rand(50, 2, dtype=torch.float64)
        >>> model = SingleTaskGP(X, X.sum(-1, keepdim=True), covar_module=lazykern.AdditiveStructureKernel(
        ...     lazykern.MaternKernel(nu=2.5), num_dims=2))
        >>> with gpytorch.settings.max_cholesky_size(0):     # CG at any N
        ...     paths = draw_matheron_paths(model, sample_shape=torch.Size([4]))
        >>> paths(X[:3]).shape
        torch.Size([4, 3])
    """
    if points is None:
        (points,) = get_train_inputs(model, transformed=True)
    kernel = model.covar_module
    if (scale_tril is not None or not _contains_lazykern_kernel(kernel)
            or points.shape[-2] <= gpytorch.settings.max_cholesky_size.value()):
        return _gaussian_update_ExactGP(
            model, likelihood, sample_values=sample_values, target_values=target_values, points=points,
            noise_covariance=noise_covariance, scale_tril=scale_tril)
    if target_values is None:
        target_values = get_train_targets(model, transformed=True)
    if noise_covariance is None:
        noise_covariance = likelihood.noise_covar(shape=points.shape[:-1])
    covariance = kernel(points)
    if not isinstance(noise_covariance, ZeroLinearOperator):
        noise = noise_covariance.cholesky() @ torch.randn_like(sample_values).unsqueeze(-1)
        sample_values = sample_values + noise.squeeze(-1)
        covariance = covariance + noise_covariance
    errors = target_values - sample_values  # (*sample_shape, *batch, N)

    # One CG per batch member of the kernel, all sample paths of it as columns.
    batch, n = kernel.batch_shape, points.shape[-2]
    columns = errors.reshape(-1, batch.numel(), n)
    weight = torch.empty_like(columns)
    shift = float(likelihood.noise.detach().mean()) if not isinstance(noise_covariance, ZeroLinearOperator) else 1e-6
    for i, index in enumerate(np.ndindex(*batch)):
        K = covariance[index] if index else covariance
        precond = PivotedCholeskyPreconditioner(kernel(points)[index] if index else kernel(points),
                                                rank=min(rank, n), shift=shift)
        solution, _ = cg(K, columns[:, i, :].T.contiguous(), precond=precond, tol=tol)
        weight[:, i, :] = solution.T
    feature_map = KernelEvaluationMap(kernel=kernel, points=points, input_transform=get_input_transform(model))
    return GeneralizedLinearPath(feature_map=feature_map, weight=weight.reshape(errors.shape),
                                 is_ensemble=is_ensemble(model))


GaussianUpdate.register(ExactGP, _GaussianLikelihoodBase)(gaussian_update)
