r"""The exact marginal log likelihood, with the gradient of its Cholesky path taken from one inverse.

For :math:`K = K_\theta(X, X) + \sigma^2 I` and :math:`r = y - \mu`, GPyTorch's
:class:`~gpytorch.mlls.ExactMarginalLogLikelihood` computes
:math:`\log p(y) = -\tfrac12\,(r^\top K^{-1} r + \log\lvert K\rvert + n \log 2\pi)` by Cholesky up to
``gpytorch.settings.max_cholesky_size`` points, and autograd differentiates through the factor:
PyTorch's Cholesky backward, :math:`\bar K = L^{-\top} \Phi(L^\top \bar L) L^{-1}`, costs two
triangular solves with :math:`n` right-hand sides and a product, about :math:`3n^3` flops against
the factorization's :math:`n^3/3`. The gradient has a closed form,

.. math::

    \frac{\partial}{\partial K}\,\bigl(r^\top K^{-1} r\bigr) = -\alpha\alpha^\top, \qquad
    \frac{\partial}{\partial K}\,\log\lvert K\rvert = K^{-1}, \qquad \alpha = K^{-1} r,

and :math:`K^{-1}` from the factor (``torch.cholesky_inverse``) costs :math:`2n^3/3`: for projected
kernels with many terms the Cholesky backward costs as much as the kernel's own gradient pass
(``benchmarks/results/exact-mll.md`` has the step times of both likelihoods, measured in one run).
"""

from __future__ import annotations

import math

import gpytorch
import linear_operator
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import LinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ..operators import GridPreconditionerOperator, expire_reused
from ..solvers import cg, lanczos_logdet

__all__ = ["ExactMLL", "REBUILD_AFTER_ITERATIONS"]

#: On the conjugate-gradient path with a grid kept from an earlier step
#: (:class:`lazykern.settings.preconditioner_reuse`), a solve that needs more iterations than this
#: has the next step build the grid anew: a fresh grid solves in two to four, and building it costs
#: about as many products as this many iterations do.
REBUILD_AFTER_ITERATIONS = 8


def _inv_quad_logdet(covariance: Tensor, residual: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r""":math:`r^\top K^{-1} r`, :math:`\log\lvert K\rvert`, the factor :math:`L` and :math:`K^{-1} r`, by
    GPyTorch's factorization (its jitter retries, ``NotPSDError``, ``NanError``); differentiable
    through the factor where autograd records it."""
    chol = psd_safe_cholesky(covariance)
    alpha = torch.cholesky_solve(residual.unsqueeze(-1), chol)
    inv_quad = (residual.unsqueeze(-1) * alpha).sum((-2, -1))
    return inv_quad, 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1), chol, alpha


class _CholeskyInvQuadLogdet(torch.autograd.Function):
    r""":math:`(r^\top K^{-1} r, \log\lvert K\rvert)` of a batch of dense ``K`` and vectors ``r``,
    differentiated by the closed form; second derivatives (``create_graph=True``) through the factor."""

    @staticmethod
    def forward(ctx, covariance: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:  # noqa: D102 - autograd protocol
        inv_quad, logdet, chol, alpha = _inv_quad_logdet(covariance, residual)
        ctx.save_for_backward(chol, alpha, covariance, residual)
        return inv_quad, logdet

    @staticmethod
    def backward(ctx, grad_inv_quad: Tensor, grad_logdet: Tensor):  # noqa: D102 - autograd protocol
        chol, alpha, covariance, residual = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the closed form's own derivative needs the factor's
            wanted = [t for t, need in zip((covariance, residual), ctx.needs_input_grad) if need]
            grads = iter(torch.autograd.grad(_inv_quad_logdet(covariance, residual)[:2], wanted,
                                             (grad_inv_quad, grad_logdet), create_graph=True))
            return tuple(next(grads) if need else None for need in ctx.needs_input_grad)
        grad_covariance = grad_residual = None
        if ctx.needs_input_grad[0]:
            grad_covariance = torch.cholesky_inverse(chol).mul_(grad_logdet[..., None, None])
            grad_covariance -= (alpha * grad_inv_quad[..., None, None]) @ alpha.mT
        if ctx.needs_input_grad[1]:
            grad_residual = 2 * grad_inv_quad[..., None] * alpha.squeeze(-1)
        return grad_covariance, grad_residual


def _preconditioned_inv_quad_logdet(covariance: LinearOperator, residual: Tensor) -> tuple[Tensor, Tensor] | None:
    r""":math:`(r^\top A^{-1} r, \log|A|)` of a lazy :math:`A` that carries lazykern's grid
    preconditioner :math:`P`, by :func:`lazykern.solvers.cg` to GPyTorch's ``cg_tolerance`` on
    :math:`[r, z_1, \dots, z_p]`, :math:`z_j \sim \mathcal N(0, P)` (``num_trace_samples``
    probes); ``None`` for any other operator.

    The values: :math:`r^\top \alpha` and :math:`\log|P| + ` the Lanczos quadrature of the probes'
    CG runs (:func:`lazykern.solvers.lanczos_logdet`). The gradients, by autograd through one product
    :math:`A [\alpha, w]` with the solves held fixed: :math:`-\alpha^\top \partial A\, \alpha` and
    :math:`\frac1p \sum_j u_j^\top \partial A\, w_j`, :math:`u_j = A^{-1} z_j`, :math:`w_j = P^{-1} z_j`,
    an unbiased estimate of :math:`\operatorname{tr}(A^{-1} \partial A)` (:math:`\mathbb E[w_j z_j^\top] = I`).
    Unlike ``linear_operator``'s conjugate gradients, which run at least ten iterations whatever
    the preconditioner, these stop at the tolerance: two to four iterations where the grid fits.
    """
    operator = covariance.evaluate_kernel()
    closure, preconditioner, logdet_p = operator._preconditioner()
    if not isinstance(preconditioner, GridPreconditionerOperator) or residual.dim() != 1:
        return None
    probes = gpytorch.settings.num_trace_samples.value()
    with torch.no_grad():
        rhs = torch.cat([residual.detach()[:, None], preconditioner.zero_mean_mvn_samples(probes).mT], dim=1)
        solved, result = cg(operator, rhs, precond=closure, tol=linear_operator.settings.cg_tolerance.value(),
                            max_iter=linear_operator.settings.max_cg_iterations.value())
        if result.iterations > REBUILD_AFTER_ITERATIONS:  # the kept grid no longer fits: the next step builds one
            expire_reused()
        alpha, solved_probes = solved[:, :1], solved[:, 1:]
        weighted = closure(rhs[:, 1:])
        logdet_value = logdet_p + lanczos_logdet(result, slice(1, None))
    product = operator @ torch.cat([alpha, weighted], dim=1)          # differentiable in the hyperparameters
    inv_quad = 2 * (alpha.squeeze(-1) * residual).sum() - (alpha * product[:, :1]).sum()
    trace = (solved_probes * product[:, 1:]).sum() / probes
    return inv_quad, logdet_value + trace - trace.detach()


class ExactMLL(gpytorch.mlls.ExactMarginalLogLikelihood):
    r"""GPyTorch's :class:`~gpytorch.mlls.ExactMarginalLogLikelihood`, the same value, with a cheaper
    gradient where it is computed by Cholesky.

    .. math::

        \frac1n \log p(y \mid X, \theta) = -\frac1{2n}\bigl(r^\top K^{-1} r + \log\lvert K\rvert
        + n \log 2\pi\bigr) + \frac1n \sum \log p(\theta), \qquad r = y - \mu,

    with :math:`K` the likelihood's covariance (the kernel matrix plus the noise). Up to
    ``gpytorch.settings.max_cholesky_size`` points the matrix is formed and factored once, and the
    gradient of :math:`-\log p(y)` in it is :math:`\tfrac12(K^{-1} - \alpha\alpha^\top)`
    (:math:`\alpha = K^{-1} r`, :math:`K^{-1}` from the factor): about a quarter of the flops of
    autograd through the factor, which :class:`~gpytorch.mlls.ExactMarginalLogLikelihood` uses. Above
    that size, for
    multitask distributions, under ``gpytorch.settings.fast_computations(log_prob=False)`` and
    under an observation-NaN policy other than ``"ignore"``, it is GPyTorch's likelihood unchanged
    (conjugate gradients and stochastic Lanczos quadrature on lazy products). Second derivatives
    (``create_graph=True``) go through the factor, as GPyTorch's do. :func:`train` uses it.

    Args:
        likelihood: the model's likelihood (Gaussian).
        model: the exact GP.

    Example:
        >>> import torch, gpytorch
        >>> from lazykern.regression import ExactMLL, build_model
        >>> x = torch.randn(100, 2, dtype=torch.float64); y = torch.sin(x).sum(-1)
        >>> model, likelihood = build_model(x, y, "rbf-ard")
        >>> loss = -ExactMLL(likelihood, model)(model(x), y)
        >>> reference = -gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
        >>> bool(torch.isclose(loss, reference, rtol=1e-12))
        True
        >>> loss.backward()
    """

    def forward(self, function_dist: MultivariateNormal, target: Tensor, *params, **kwargs) -> Tensor:
        n = function_dist.event_shape.numel()
        if (type(function_dist) is not MultivariateNormal or gpytorch.settings.fast_computations.log_prob.off()
                or gpytorch.settings.observation_nan_policy.value() != "ignore"):
            return super().forward(function_dist, target, *params, **kwargs)
        output = self.likelihood(function_dist, *params, **kwargs)
        residual = target - output.loc
        if n > gpytorch.settings.max_cholesky_size.value():
            terms = _preconditioned_inv_quad_logdet(output.lazy_covariance_matrix, residual)
            if terms is None:
                return super().forward(function_dist, target, *params, **kwargs)
            inv_quad, logdet = terms
        else:
            covariance = output.lazy_covariance_matrix.to_dense()
            batch = torch.broadcast_shapes(residual.shape[:-1], covariance.shape[:-2])
            inv_quad, logdet = _CholeskyInvQuadLogdet.apply(
                covariance.expand(*batch, n, n), residual.expand(*batch, n))
        log_prob = -0.5 * (inv_quad + logdet + n * math.log(2 * math.pi))
        return self._add_other_terms(log_prob, params).div_(n)
