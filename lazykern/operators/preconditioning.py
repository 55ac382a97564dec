r"""The grid preconditioner on ``linear_operator``'s path: what ``K + D`` carries into CG and SLQ.

GPyTorch builds :math:`K + D` (a kernel matrix plus the likelihood's noise) as an
``AddedDiagLinearOperator``; its ``_preconditioner`` returns ``(closure, precond_lt, logdet)``,
which ``linear_operator`` uses for every conjugate-gradient solve and for stochastic Lanczos
quadrature: the closure applies :math:`P^{-1}` in CG, ``precond_lt`` draws the probe vectors
:math:`z \sim \mathcal N(0, P)`, and the log-determinant is
:math:`\log|P| + \widehat{\log|P^{-1} K|}`. Its default is a rank-15 pivoted Cholesky factor.

For the sums of one-dimensional terms the structured engine takes (first-order additive Matérn
and RBF kernels, :func:`lazykern.structured.grid.additive_terms`), on ``K(X, X)`` without batch
dimensions, :func:`attach_grid_preconditioner` gives the operator the engine's preconditioner
(:func:`lazykern.backend.preconditioner`: :class:`lazykern.structured.grid.AdditiveGrid`) instead
(``preconditioner_override``), which is
exact for its :math:`P` in all three. :math:`P` is built from detached hyperparameters: the
log-determinant's value is still :math:`\log|P| + \log|P^{-1} K|` and its gradient,
:math:`\operatorname{tr}(K^{-1} \partial K)` estimated with the preconditioned probes, needs no
derivative of :math:`P`. Everything else keeps ``linear_operator``'s default, and its switches
still apply: ``max_preconditioner_size(0)`` turns preconditioning off, and operators smaller than
``min_preconditioning_size`` get none.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from linear_operator import settings
from linear_operator.operators import AddedDiagLinearOperator, LinearOperator
from torch import Tensor

from .. import backend
from .. import settings as lazykern_settings
from ..backend import PRECONDITIONER_MAX_RANK as MAX_RANK
from ..engine import Preconditioner

__all__ = ["PATH_MAX_TERMS", "GridPreconditionerOperator", "attach_grid_preconditioner", "expire_reused", "grid_preconditioner"]

#: The most terms of a sum that gets the grid on linear_operator's path. Its build costs about 8 J
#: products of one column (J^2 / 2 blocks of 16 entries a point, against a product's few dozen
#: operations per point and term), and a step that builds it saves at most the products of
#: unpreconditioned CG, a few hundred iterations of a dozen columns (docs/structured.rst).
PATH_MAX_TERMS = 256


def _path_rank(n: int, dims: int) -> int:
    r"""The most directions the grid keeps on linear_operator's path: with :math:`r^2 \le 16 N d` an
    application (two triangular solves with :math:`C`, :math:`2 r^2` a column) costs about one kernel
    product of the structured engine (a few dozen operations per point and term); at most
    :math:`N`, so that :math:`C` is never larger than the system it preconditions; 256 at least, a
    factor that costs little whatever N.

    Example:
        >>> _path_rank(36_000, 64), _path_rank(2_000, 200)
        (4096, 2000)
    """
    return min(MAX_RANK, max(256, min(n, 4 * math.isqrt(n * dims))))


class GridPreconditionerOperator(LinearOperator):
    r"""An engine's preconditioner :math:`P` (:class:`lazykern.engine.Preconditioner`, the grid's
    :class:`~lazykern.structured.grid.AdditiveGrid`) as a
    ``LinearOperator`` (``precond_lt``): products, and draws from :math:`\mathcal N(0, P)` for
    stochastic Lanczos quadrature's probes. Its one tensor is the (detached) noise diagonal, so
    that ``linear_operator`` passes no gradient into it.

    Args:
        noise: ``(N,)`` the noise diagonal (gives the dtype and size).
        grid: the preconditioner (:func:`lazykern.backend.preconditioner` builds it).

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x, noise = torch.rand(300, 2, dtype=torch.float64), torch.full((300,), 0.1, dtype=torch.float64)
        >>> build = backend.preconditioner(StationaryFormula("rbf", additive=True), x, {"scales": torch.ones(1, 2)})
        >>> P = GridPreconditionerOperator(noise, grid=build(noise))
        >>> P.shape, P.zero_mean_mvn_samples(5).shape
        (torch.Size([300, 300]), torch.Size([5, 300]))
    """

    def __init__(self, noise: Tensor, *, grid: Preconditioner) -> None:
        super().__init__(noise, grid=grid)
        self.noise = noise
        self.grid = grid

    def _size(self) -> torch.Size:
        return torch.Size([self.noise.shape[-1], self.noise.shape[-1]])

    def _transpose_nonbatch(self) -> LinearOperator:
        return self

    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.dim() == 1
        out = self.grid.matmul(rhs.to(torch.float64).reshape(rhs.shape[0], -1)).to(rhs.dtype)
        return out.squeeze(-1) if vector else out

    def _diagonal(self) -> Tensor:
        return self.grid.diagonal().to(self.dtype)

    def zero_mean_mvn_samples(self, num_samples: int) -> Tensor:
        """``(num_samples, N)`` draws from :math:`\\mathcal N(0, P)`."""
        return self.grid.sample(num_samples).mT.to(self.dtype)


#: The grid last built under :class:`lazykern.settings.preconditioner_reuse`, by (formula, points,
#: dtype): ``[uses left, (preconditioner operator, log-determinant)]``.
_REUSED: dict[tuple, list] = {}


def _reused_or_built(operator: AddedDiagLinearOperator) -> tuple[LinearOperator, Tensor]:
    """The grid of a recent operator of the same formula, size and dtype while
    :class:`lazykern.settings.preconditioner_reuse` allows it, else a new one."""
    kernel = operator._linear_op
    key = (kernel.covar_func, tuple(kernel.x1.shape), operator.dtype)
    uses = lazykern_settings.preconditioner_reuse.value()
    entry = _REUSED.get(key) if uses > 1 else None
    if entry is not None and entry[0] > 0:
        entry[0] -= 1
        return entry[1]
    build = backend.preconditioner(kernel.covar_func, kernel.x1, kernel.tensor_params)
    assert build is not None  # attach_grid_preconditioner attaches only where an engine has one
    noise = operator._diag_tensor.diagonal(dim1=-2, dim2=-1).detach().expand(operator.size(-1))
    with torch.no_grad():
        grid = build(noise, max_rank=_path_rank(*kernel.x1.shape))
    built = (GridPreconditionerOperator(noise.contiguous(), grid=grid), torch.tensor(grid.logdet, dtype=operator.dtype))
    _REUSED.clear()
    if uses > 1:
        _REUSED[key] = [uses - 1, built]
    return built


def expire_reused() -> None:
    """Build the next grid anew, within :class:`lazykern.settings.preconditioner_reuse` too: for a
    solver that found the kept one no longer fits (conjugate gradients needing many iterations
    after the hyperparameters moved).

    Example:
        >>> expire_reused()
    """
    _REUSED.clear()


def grid_preconditioner(operator: AddedDiagLinearOperator) -> tuple[Callable | None, LinearOperator | None, Tensor | None]:
    r"""``linear_operator``'s preconditioner triple for :math:`K + D` with an additive lazykern
    kernel :math:`K`: :math:`v \mapsto P^{-1} v`, :math:`P` as a ``LinearOperator``, and
    :math:`\log|P|`; ``(None, None, None)`` where ``linear_operator``'s switches turn
    preconditioning off. Built once per operator and kept on it.

    Example:
        >>> import torch, gpytorch, lazykern
        >>> x = torch.rand(2500, 3, dtype=torch.float64)
        >>> kernel = lazykern.AdditiveStructureKernel(lazykern.MaternKernel(nu=2.5), num_dims=3).double()
        >>> A = kernel(x).evaluate_kernel().add_diagonal(torch.tensor(0.01, dtype=torch.float64))
        >>> closure, P, logdet = A._preconditioner()
        >>> type(P).__name__
        'GridPreconditionerOperator'
        >>> b = torch.randn(2500, 1, dtype=torch.float64)
        >>> with torch.no_grad():   # 6 iterations against 105 when this was written
        ...     lazykern.solvers.cg(A, b, precond=closure)[1].iterations < lazykern.solvers.cg(A, b)[1].iterations / 5
        True
    """
    if settings.max_preconditioner_size.value() == 0 or operator.size(-1) < settings.min_preconditioning_size.value():
        return None, None, None
    cached = operator.__dict__.get("_lazykern_grid")
    if cached is None:
        cached = operator.__dict__["_lazykern_grid"] = _reused_or_built(operator)
    lt, logdet = cached

    def closure(rhs: Tensor) -> Tensor:
        flat = rhs.to(torch.float64).reshape(rhs.shape[-2], -1) if rhs.dim() > 1 else rhs.to(torch.float64)[:, None]
        return lt.grid.solve(flat).to(rhs.dtype).reshape(rhs.shape)

    return closure, lt, logdet


def attach_grid_preconditioner(added: LinearOperator) -> LinearOperator:
    """``added`` with :func:`grid_preconditioner` as its preconditioner when it is
    :math:`K + D` for a lazykern ``K(X, X)`` of a kernel the structured engine takes, of at most
    :data:`PATH_MAX_TERMS` terms, without batch dimensions and with a positive noise diagonal;
    otherwise ``added`` unchanged.

    Example:
        >>> import torch, lazykern
        >>> x = torch.rand(200, 3, dtype=torch.float64)
        >>> additive = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=3).double()
        >>> additive(x).evaluate_kernel().add_diagonal(torch.tensor(0.1)).preconditioner_override.__name__
        'grid_preconditioner'
        >>> lazykern.RBFKernel().double()(x).evaluate_kernel().add_diagonal(torch.tensor(0.1)).preconditioner_override is None
        True
    """
    if not isinstance(added, AddedDiagLinearOperator) or added.preconditioner_override is not None:
        return added
    kernel = added._linear_op
    if not (hasattr(kernel, "covar_func") and kernel.dim() == 2 and kernel._same_points()):
        return added
    if kernel.x1.shape[-1] > PATH_MAX_TERMS or backend.preconditioner(kernel.covar_func, kernel.x1,
                                                                       kernel.tensor_params) is None:
        return added
    if any(p.shape[:-2].numel() != 1 for p in kernel.tensor_params.values()):
        return added
    noise = added._diag_tensor.diagonal(dim1=-2, dim2=-1)
    if noise.dim() != 1 or not bool((noise.detach() > 0).all()):
        return added
    return AddedDiagLinearOperator(kernel, added._diag_tensor, preconditioner_override=grid_preconditioner)
