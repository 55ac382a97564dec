r"""Preconditioners for :math:`K + \sigma I` built from entry access, never from the full matrix.

A preconditioner is any callable that applies :math:`M^{-1} \approx (K + \sigma I)^{-1}` to an
``(N, C)`` block (the :class:`Preconditioner` protocol); :func:`lazykern.solvers.cg` calls it once
per iteration. Both classes here read only the diagonal (``K.diagonal()``) and, for the low-rank
one, ``rank`` rows (``K[..., rows, :]``) of the operator: O(N D) kernel evaluations each, so a
lazy kernel operator stays lazy. :class:`GridPreconditioner`, for the additive kernels of the
structured engine, reads the operator's inputs and hyperparameters instead (the engine's
preconditioner, :func:`lazykern.backend.preconditioner`: :mod:`lazykern.structured.grid`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import torch
from linear_operator import to_dense
from linear_operator.operators import LinearOperator
from torch import Tensor

from .. import backend
from ..operators import LazyKernelOperator
from ..validation import check_positive_int

__all__ = ["GridPreconditioner", "JacobiPreconditioner", "PivotedCholeskyPreconditioner", "Preconditioner"]


@runtime_checkable
class Preconditioner(Protocol):
    r"""Applies :math:`M^{-1}` to an ``(N, C)`` block; :math:`M` symmetric positive definite."""

    def __call__(self, R: Tensor) -> Tensor: ...


def _square_size(K: Any) -> int:
    shape = getattr(K, "shape", None)
    if shape is None:
        raise TypeError(f"K must be a torch.Tensor or LinearOperator, got {type(K).__name__}")
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"K must be a square (N, N) operator without batch dimensions, got shape {tuple(shape)}")
    if not isinstance(K, (Tensor, LinearOperator)):
        raise TypeError(f"K must be a torch.Tensor or LinearOperator, got {type(K).__name__}")
    if K.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"K must be float32 or float64, got {K.dtype}")
    return int(shape[0])


def _check_shift(shift: Any, *, positive: bool) -> float:
    ok = not isinstance(shift, bool) and isinstance(shift, (int, float)) and math.isfinite(shift)
    if not ok or (shift <= 0 if positive else shift < 0):
        expected = "a positive finite number" if positive else "a non-negative finite number"
        raise ValueError(f"shift must be {expected}, got {shift!r}")
    return float(shift)


def _diagonal(K: Tensor | LinearOperator) -> Tensor:
    return K.diagonal(dim1=-2, dim2=-1) if isinstance(K, LinearOperator) else torch.diagonal(K)


def _row(K: Tensor | LinearOperator, i: int) -> Tensor:
    # Indexing a LinearOperator keeps it lazy (a 1 x N kernel operator); to_dense then evaluates
    # just that row, O(N D).
    return to_dense(K[..., i : i + 1, :]).reshape(-1)


class JacobiPreconditioner:
    r"""Diagonal (Jacobi) preconditioner :math:`M = \operatorname{diag}(K) + \sigma I`.

    Costs one O(N D) diagonal evaluation to build and O(N C) per application. Helps when the
    diagonal varies (e.g. heteroscedastic noise); for stationary kernels, whose diagonal is
    constant, it only rescales and leaves CG's iteration count unchanged.

    Args:
        K: ``(N, N)`` kernel operator or tensor (only its diagonal is read).
        shift: :math:`\sigma \ge 0` added to the diagonal (the ridge / noise of the system).

    Example:
        >>> import torch
        >>> from lazykern.solvers import JacobiPreconditioner, cg
        >>> A = torch.diag(torch.arange(1.0, 101.0, dtype=torch.float64))
        >>> X, result = cg(A, torch.ones(100, dtype=torch.float64), precond=JacobiPreconditioner(A))
        >>> result.iterations
        1
    """

    def __init__(self, K: Tensor | LinearOperator, shift: float = 0.0) -> None:
        _square_size(K)
        shift = _check_shift(shift, positive=False)
        with torch.no_grad():
            diag = _diagonal(K) + shift
        if not bool((torch.isfinite(diag) & (diag > 0)).all()):
            raise ValueError(
                f"diag(K) + shift must be positive and finite for a Jacobi preconditioner, got minimum "
                f"{float(diag.min()):.3g}"
            )
        self.inverse_diagonal = diag.reciprocal()

    def __call__(self, R: Tensor) -> Tensor:
        """:math:`M^{-1} R` for an ``(N,)`` or ``(N, C)`` block."""
        return R * (self.inverse_diagonal if R.dim() == 1 else self.inverse_diagonal.unsqueeze(-1))


class PivotedCholeskyPreconditioner:
    r"""Rank-:math:`r` Nyström preconditioner from a greedy pivoted Cholesky factor, applied by Woodbury.

    The pivoted Cholesky factorization picks, :math:`r` times, the row :math:`i` with the largest
    remaining diagonal :math:`d_i = K_{ii} - \sum_{m} L_{im}^2` and appends the column

    .. math::

        L_{:, m} = \big(K_{:, i} - L_{:, :m} L_{i, :m}^\top\big) / \sqrt{d_i},

    so :math:`L L^\top = K_{:, S} K_{S, S}^{-1} K_{S, :}` is the Nyström approximation of
    :math:`K` on the pivots :math:`S`. It reads ``rank`` rows and the diagonal of :math:`K` (never
    the full matrix) and costs O(N r^2) flops. With the thin SVD :math:`L = U \Sigma V^\top` the
    preconditioner :math:`M = L L^\top + \sigma I` is inverted by the Woodbury identity,

    .. math::

        M^{-1} R = U \operatorname{diag}\Big(\frac{1}{s_m + \sigma}\Big) U^\top R
                   + \frac{1}{\sigma}\big(R - U U^\top R\big), \qquad s_m = \Sigma_{mm}^2,

    in O(N r C) per application. The factorization stops early when the remaining diagonal is
    below :math:`10^{-10} \max_i K_{ii}` (:math:`K` numerically of lower rank); ``self.rank`` is
    the rank reached. The factor and its SVD are computed in float64 whatever the operator's dtype
    (cheap next to a kernel pass), so float32 solves get a well-conditioned preconditioner.

    Args:
        K: ``(N, N)`` positive semi-definite kernel operator or tensor, *without* the shift.
        rank: maximum rank :math:`r \ge 1` (capped at N).
        shift: :math:`\sigma > 0`, the ridge of the system :math:`K + \sigma I`.

    Example:
        >>> import torch, lazykern
        >>> from lazykern.solvers import PivotedCholeskyPreconditioner, cg
        >>> x = torch.randn(500, 3, dtype=torch.float64)
        >>> K = lazykern.kernels.RBFKernel().double()(x).evaluate_kernel()
        >>> P = PivotedCholeskyPreconditioner(K, rank=50, shift=1e-2)
        >>> X, result = cg(K.add_diagonal(torch.tensor(1e-2, dtype=torch.float64)),
        ...                torch.randn(500, 2, dtype=torch.float64), precond=P)
        >>> result.all_converged
        True
    """

    def __init__(self, K: Tensor | LinearOperator, rank: int, shift: float) -> None:
        n = _square_size(K)
        check_positive_int("rank", rank)
        self.shift = _check_shift(shift, positive=True)
        with torch.no_grad():
            L = self._factor(K, min(rank, n))
            U, S, _ = torch.linalg.svd(L, full_matrices=False)
        self.rank = L.shape[-1]
        self.dtype = K.dtype
        self.basis = U.to(K.dtype)
        # M^{-1} = U diag(1/(s + sigma) - 1/sigma) U^T + I / sigma: one projection per application.
        self.correction = (1.0 / (S.square() + self.shift) - 1.0 / self.shift).to(K.dtype)

    @staticmethod
    def _factor(K: Tensor | LinearOperator, rank: int) -> Tensor:
        remaining = _diagonal(K).to(torch.float64).clone()
        if not bool(torch.isfinite(remaining).all()) or bool((remaining < 0).any()):
            raise ValueError("K must have a finite, non-negative diagonal (a positive semi-definite kernel)")
        stop = 1e-10 * float(remaining.max())
        L = remaining.new_zeros(remaining.shape[0], rank)
        for m in range(rank):
            i = int(torch.argmax(remaining))
            pivot = float(remaining[i])
            if pivot <= stop:
                return L[:, :m]
            row = _row(K, i).to(torch.float64)
            L[:, m] = (row - L[:, :m] @ L[i, :m]) / math.sqrt(pivot)
            remaining -= L[:, m].square()
            remaining[i] = 0.0  # exact in exact arithmetic; rounding could re-select the pivot
            remaining.clamp_(min=0.0)
        return L

    def __call__(self, R: Tensor) -> Tensor:
        """:math:`M^{-1} R` for an ``(N,)`` or ``(N, C)`` block."""
        if R.dim() == 1:
            return self(R.unsqueeze(-1)).squeeze(-1)
        coeffs = self.basis.mT @ R
        return R / self.shift + self.basis @ (self.correction.unsqueeze(-1) * coeffs)


class GridPreconditioner:
    r"""The grid preconditioner of a first-order additive kernel:
    :math:`M = \sigma I + \sum_d W_d R_d R_d^\top W_d^\top`, each one-dimensional term interpolated
    from a grid over its column (:class:`lazykern.structured.grid.AdditiveGrid`), applied exactly
    by Woodbury's identity.

    What GPyTorch's ``K + noise`` gets as its preconditioner (:mod:`lazykern.operators.preconditioning`),
    for :func:`lazykern.solvers.cg`. Memory O(N d) plus the square of the grids' kept rank;
    computed in float64 whatever the operator's dtype.

    Args:
        K: ``(N, N)`` lazykern kernel operator ``K(X, X)`` of a kernel the structured engine takes
            (``ScaleKernel(AdditiveStructureKernel(MaternKernel(nu) or RBFKernel(), d))``, with or
            without component scales), *without* the shift and without batch dimensions.
        shift: :math:`\sigma > 0`, the ridge of the system :math:`K + \sigma I`.

    Example:
        >>> import torch, lazykern
        >>> from lazykern.solvers import GridPreconditioner, cg
        >>> x = torch.rand(2000, 4, dtype=torch.float64)
        >>> K = lazykern.AdditiveStructureKernel(lazykern.MaternKernel(nu=2.5), num_dims=4).double()(x).evaluate_kernel()
        >>> A, b = K.add_diagonal(torch.tensor(1e-2, dtype=torch.float64)), torch.randn(2000, dtype=torch.float64)
        >>> cg(A, b, precond=GridPreconditioner(K, shift=1e-2))[1].iterations < cg(A, b)[1].iterations / 10
        True
    """

    def __init__(self, K: LazyKernelOperator, shift: float) -> None:
        n = _square_size(K)
        shift = _check_shift(shift, positive=True)
        build = backend.preconditioner(K.covar_func, K.x1, K.tensor_params) if isinstance(K, LazyKernelOperator) else None
        if build is None or not K._same_points():
            raise ValueError("K must be a lazykern K(X, X) of a first-order additive Matérn or RBF kernel on CPU tensors "
                             f"(what the structured engine takes), got {type(K).__name__}")
        self.dtype = K.dtype
        self.grid = build(torch.full((n,), shift, dtype=torch.float64))

    def __call__(self, R: Tensor) -> Tensor:
        """:math:`M^{-1} R` for an ``(N,)`` or ``(N, C)`` block."""
        if R.dim() == 1:
            return self(R.unsqueeze(-1)).squeeze(-1)
        return self.grid.solve(R.to(torch.float64)).to(R.dtype)
