"""Batched preconditioned conjugate gradients: many right-hand sides, one operator pass per iteration."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from ..operators import operator_matmul
from ..validation import check_floating_matrix, check_positive_int

__all__ = ["CGResult", "cg", "lanczos_logdet"]

# CG updates the residual by recurrence (r <- r - alpha A p), which drifts from b - A x by rounding
# (noticeably in float32). Every this many iterations the recurrence is replaced by the true residual
# (one extra operator pass, ~2% of the work), and a claimed convergence is always re-checked on it.
_TRUE_RESIDUAL_EVERY = 50


@dataclass
class CGResult:
    """What a :func:`cg` run did, per right-hand side.

    Attributes:
        iterations: CG iterations run (each is one operator application to all columns at once).
        matvecs: operator applications, including the true-residual recomputations.
        residual_norms: :math:`\\|b_j - A x_j\\|` per column, from the last true residual.
        relative_residuals: :math:`\\|b_j - A x_j\\| / \\|b_j\\|` per column (0 for a zero column).
        converged: per column, whether ``relative_residuals <= tol`` on the **true** residual.
        breakdown: per column, whether CG stopped because :math:`p^\\top A p \\le 0` or a non-finite
            value appeared (the operator or preconditioner is not symmetric positive definite).
        steps, betas: ``(iterations, C)`` CG's step sizes :math:`\\alpha_k` and :math:`\\beta_k` per
            column (0 once a column stopped), from which :func:`lanczos_logdet` rebuilds Lanczos'
            tridiagonal matrices.
        initial_rz: ``(C,)`` :math:`b_j^\\top M^{-1} b_j` (:math:`\\lVert b_j \\rVert^2` without a
            preconditioner).
    """

    iterations: int
    matvecs: int
    residual_norms: Tensor
    relative_residuals: Tensor
    converged: Tensor
    breakdown: Tensor
    steps: Tensor
    betas: Tensor
    initial_rz: Tensor

    @property
    def all_converged(self) -> bool:
        """Whether every column converged."""
        return bool(self.converged.all())


def _matrix_shape(A: Any) -> tuple[int, int]:
    shape = getattr(A, "shape", None)
    if shape is None or not hasattr(A, "__matmul__"):
        kind = type(A).__name__
        raise TypeError(f"A must support `A @ X` and have a .shape (a Tensor or LinearOperator), got {kind}")
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(f"A must be a square (N, N) operator without batch dimensions, got shape {tuple(shape)}")
    return int(shape[0]), int(shape[1])


def _check_inputs(A: Any, B: Any, tol: Any, max_iter: Any, precond: Any, callback: Any) -> int:
    n, _ = _matrix_shape(A)
    check_floating_matrix("B", B, min_dim=1)
    if B.dim() > 2 or B.shape[0] != n:
        raise ValueError(f"B must have shape ({n},) or ({n}, C) to match A of shape ({n}, {n}), got {tuple(B.shape)}")
    a_dtype = getattr(A, "dtype", B.dtype)
    if not isinstance(a_dtype, torch.dtype):
        raise TypeError(f"A must support `A @ X` for torch tensors X, got {type(A).__name__} with dtype {a_dtype}")
    if a_dtype != B.dtype:
        raise TypeError(f"A and B must have the same dtype, got {a_dtype} and {B.dtype}")
    a_device = getattr(A, "device", B.device)
    if a_device is not None and torch.device(a_device) != B.device:
        raise ValueError(f"A and B must be on the same device, got {a_device} and {B.device}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0 < tol < math.inf):
        raise ValueError(f"tol must be a positive finite number (relative residual), got {tol!r}")
    check_positive_int("max_iter", max_iter, optional=True)
    if precond is not None and not callable(precond):
        raise TypeError(f"precond must be a callable R -> M^-1 R (or None), got {type(precond).__name__}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (or None), got {type(callback).__name__}")
    return n


def _apply_precond(precond: Callable[[Tensor], Tensor] | None, R: Tensor) -> Tensor:
    if precond is None:
        return R.clone()
    Z = precond(R)
    if not isinstance(Z, Tensor) or Z.shape != R.shape:
        got = tuple(Z.shape) if isinstance(Z, Tensor) else type(Z).__name__
        raise ValueError(f"precond must return a tensor of the residual's shape {tuple(R.shape)}, got {got}")
    return Z


def _colsum(X: Tensor, Y: Tensor) -> Tensor:
    return (X * Y).sum(0)


def cg(
    A: Any,
    B: Tensor,
    *,
    precond: Callable[[Tensor], Tensor] | None = None,
    tol: float = 1e-6,
    max_iter: int | None = None,
    callback: Callable[[int, Tensor, Tensor], None] | None = None,
) -> tuple[Tensor, CGResult]:
    r"""Solve :math:`A X = B` for a symmetric positive definite :math:`A` and many columns of :math:`B`.

    Preconditioned conjugate gradients run on all columns together: each iteration applies
    :math:`A` **once** to an ``(N, C)`` block (one kernel pass for all right-hand sides), and the
    step sizes are per column,

    .. math::

        \alpha_j = \frac{r_j^\top z_j}{p_j^\top A p_j}, \quad
        x_j \leftarrow x_j + \alpha_j p_j, \quad
        r_j \leftarrow r_j - \alpha_j A p_j, \quad
        z_j = M^{-1} r_j, \quad
        p_j \leftarrow z_j + \frac{r_j^\top z_j}{r_{j,\text{old}}^\top z_{j,\text{old}}} p_j,

    starting from :math:`x_j = 0`. Column :math:`j` has converged when
    :math:`\|b_j - A x_j\| \le \text{tol}\, \|b_j\|`; converged columns stop moving. The recursive
    residual is replaced by the true residual :math:`B - A X` every 50 iterations and before
    convergence is reported, so float32 runs cannot claim a tolerance they did not reach, and the
    iterate with the smallest true residual is returned (past the rounding floor of ``A @ X``,
    about :math:`\epsilon\, \kappa(A)` in relative terms, CG iterates wander: ask float32 for
    no less than that). If some column has not converged after ``max_iter`` iterations, or breaks
    down because :math:`A` or the preconditioner is not positive definite, its best iterate is
    returned with ``converged=False`` and a :class:`RuntimeWarning` is issued.

    The solve runs without autograd (differentiate through ``linear_operator``'s solves instead).

    Args:
        A: ``(N, N)`` symmetric positive definite operator supporting ``A @ X`` for an ``(N, C)``
            tensor: a ``torch.Tensor`` or any ``linear_operator`` ``LinearOperator``, including
            what GPyTorch kernels return (``kernel(X).add_diagonal(noise)``, ``ScaleKernel`` and
            sum outputs).
        B: ``(N,)`` or ``(N, C)`` finite right-hand sides, same dtype (float32/float64) as ``A``.
        precond: a callable applying :math:`M^{-1} \approx A^{-1}` to an ``(N, C)`` block, e.g. a
            :class:`~lazykern.solvers.JacobiPreconditioner` or
            :class:`~lazykern.solvers.PivotedCholeskyPreconditioner`; ``None`` for plain CG.
        tol: relative residual tolerance per column, > 0.
        max_iter: iteration cap (default :math:`\min(10 N, 1000)`).
        callback: called after every iteration as ``callback(iteration, X, relative_residuals)``
            (recursive residuals; ``X`` must not be modified).

    Returns:
        ``(X, result)``: the solution with the shape of ``B`` and a :class:`CGResult`.

    Example:
        >>> import torch
        >>> from lazykern.solvers import cg
        >>> G = torch.randn(50, 50, dtype=torch.float64)
        >>> A = G @ G.T + 50 * torch.eye(50, dtype=torch.float64)
        >>> B = torch.randn(50, 3, dtype=torch.float64)
        >>> X, result = cg(A, B, tol=1e-10)
        >>> result.all_converged, bool(torch.allclose(A @ X, B, atol=1e-7))
        (True, True)
    """
    n = _check_inputs(A, B, tol, max_iter, precond, callback)
    max_iter = min(10 * n, 1000) if max_iter is None else max_iter
    vector = B.dim() == 1
    matmul = operator_matmul(A)
    with torch.no_grad():
        X, result = _cg(matmul, B.unsqueeze(-1) if vector else B, precond, float(tol), max_iter, callback)
    if not result.all_converged:
        bad = (~result.converged).nonzero().flatten().tolist()
        if bool(result.breakdown.any()):
            reason = "A or the preconditioner is not positive definite (breakdown)"
        else:
            reason = f"max_iter={max_iter} reached"
        warnings.warn(
            f"cg did not reach tol={tol} for {len(bad)} of {B.shape[-1] if not vector else 1} right-hand "
            f"side(s) (columns {bad[:10]}{'...' if len(bad) > 10 else ''}; worst relative residual "
            f"{float(result.relative_residuals.max()):.3g}): {reason}",
            RuntimeWarning,
            stacklevel=2,
        )
    return (X.squeeze(-1) if vector else X), result


def _cg(
    matmul: Callable[[Tensor], Tensor],
    B: Tensor,
    precond: Callable[[Tensor], Tensor] | None,
    tol: float,
    max_iter: int,
    callback: Any,
) -> tuple[Tensor, CGResult]:
    b_norm = torch.linalg.vector_norm(B, dim=0)
    threshold = tol * b_norm
    X = torch.zeros_like(B)
    R = B.clone()
    r_norm = b_norm.clone()
    converged = r_norm <= threshold  # zero columns are solved by x = 0
    breakdown = torch.zeros_like(converged)
    # Past the rounding floor of A @ X (about eps * cond(A)), CG iterates wander and can grow;
    # the iterate with the smallest true residual is what gets returned.
    best_X, best_norm = X.clone(), b_norm.clone()
    Z = _apply_precond(precond, R)
    rz = _colsum(R, Z)
    initial_rz = rz.clone()
    P = Z
    steps, betas = [], []
    iterations = matvecs = 0
    checked = True  # whether the true residual of the current X has been evaluated

    def true_residual() -> tuple[Tensor, Tensor]:
        nonlocal matvecs, best_X, best_norm, checked
        checked = True
        R = B - matmul(X)
        matvecs += 1
        r_norm = torch.linalg.vector_norm(R, dim=0)
        better = torch.isfinite(r_norm) & (r_norm < best_norm)
        best_X = torch.where(better, X, best_X)
        best_norm = torch.where(better, r_norm, best_norm)
        return R, r_norm

    while not bool((converged | breakdown).all()) and iterations < max_iter:
        active = ~(converged | breakdown)
        AP = matmul(P)
        matvecs += 1
        iterations += 1
        pAp = _colsum(P, AP)
        broke = active & ~(torch.isfinite(pAp) & (pAp > 0) & torch.isfinite(rz) & (rz > 0))
        breakdown |= broke
        active &= ~broke
        step = torch.where(active, rz / torch.where(active, pAp, 1.0), 0.0)
        steps.append(step)
        X = X + step * P
        checked = False
        R = R - step * AP
        r_norm = torch.linalg.vector_norm(R, dim=0)
        if iterations % _TRUE_RESIDUAL_EVERY == 0 or bool((active & (r_norm <= threshold)).any()):
            R, r_norm = true_residual()
        converged |= active & (r_norm <= threshold)
        breakdown |= active & ~torch.isfinite(r_norm)
        if callback is not None:
            callback(iterations, X, _relative(r_norm, b_norm))
        if bool((converged | breakdown).all()):
            break
        Z = _apply_precond(precond, R)
        rz_new = _colsum(R, Z)
        beta = torch.where(active & ~converged, rz_new / torch.where(rz != 0, rz, 1.0), 0.0)
        betas.append(beta)
        P = Z + beta * P
        rz = rz_new

    if not checked:
        true_residual()
    return best_X, _result(iterations, matvecs, best_norm, b_norm, threshold, breakdown, steps, betas, initial_rz)


def _result(iterations: int, matvecs: int, best_norm: Tensor, b_norm: Tensor, threshold: Tensor, breakdown: Tensor,
            steps: list[Tensor], betas: list[Tensor], initial_rz: Tensor) -> CGResult:
    # The verdict is on the true residual only: a column never counts as converged on the recurrence.
    converged = best_norm <= threshold
    empty = b_norm.new_zeros(0, b_norm.shape[0])
    return CGResult(
        iterations=iterations,
        matvecs=matvecs,
        residual_norms=best_norm,
        relative_residuals=_relative(best_norm, b_norm),
        converged=converged,
        breakdown=breakdown & ~converged,
        steps=torch.stack(steps) if steps else empty,
        betas=torch.stack(betas) if betas else empty,
        initial_rz=initial_rz,
    )


def _relative(r_norm: Tensor, b_norm: Tensor) -> Tensor:
    return torch.where(b_norm > 0, r_norm / torch.where(b_norm > 0, b_norm, 1.0), r_norm)


def lanczos_logdet(result: CGResult, columns: slice | None = None) -> Tensor:
    r"""Stochastic Lanczos quadrature of :math:`\log|A| - \log|M|` from a preconditioned :func:`cg`
    run whose right-hand sides are probes :math:`z_j \sim \mathcal N(0, M)`.

    CG on :math:`A` preconditioned by :math:`M` is Lanczos on :math:`M^{-1/2} A M^{-1/2}` started
    from :math:`M^{-1/2} z_j`; its tridiagonal matrix has diagonal
    :math:`1/\alpha_k + \beta_{k-1}/\alpha_{k-1}` and off-diagonal :math:`\sqrt{\beta_k}/\alpha_k`.
    With its eigenvalues :math:`\theta_i` and the first entries :math:`\tau_i` of its eigenvectors,
    :math:`z_j^\top M^{-1/2} \log(M^{-1/2} A M^{-1/2}) M^{-1/2} z_j \approx (z_j^\top M^{-1} z_j)
    \sum_i \tau_i^2 \log \theta_i`, whose mean over the probes estimates
    :math:`\operatorname{tr} \log(M^{-1} A) = \log|A| - \log|M|` (Ubaru, Chen & Saad, 2017; GPyTorch's
    estimator). A column's quadrature has as many nodes as CG iterations it ran.

    Args:
        result: the :class:`CGResult` of ``cg(A, Z, precond=M^{-1})``.
        columns: the columns of the run that are probes (default: all).

    Returns:
        a 0-dimensional tensor.

    Example:
        >>> import torch
        >>> G = torch.randn(60, 60, dtype=torch.float64); A = G @ G.T / 60 + torch.eye(60, dtype=torch.float64)
        >>> Z = torch.randn(60, 400, dtype=torch.float64)            # M = I
        >>> _, result = cg(A, Z, tol=1e-10)
        >>> bool(abs(lanczos_logdet(result) - torch.logdet(A)) < 0.05 * torch.logdet(A))
        True
    """
    columns = slice(None) if columns is None else columns
    steps, betas, rz = result.steps[:, columns], result.betas[:, columns], result.initial_rz[columns]
    estimates = []
    for j in range(steps.shape[1]):
        k = int((steps[:, j] != 0).sum())
        if k == 0:
            estimates.append(rz.new_zeros(()))
            continue
        alpha, beta = steps[:k, j], betas[:k - 1, j]
        diagonal = 1.0 / alpha
        diagonal[1:] += beta / alpha[:-1]
        off = beta.sqrt() / alpha[:-1]
        tridiagonal = torch.diag(diagonal) + torch.diag(off, 1) + torch.diag(off, -1)
        theta, vectors = torch.linalg.eigh(tridiagonal)
        estimates.append(rz[j] * (vectors[0].square() * theta.clamp_min(torch.finfo(theta.dtype).tiny).log()).sum())
    return torch.stack(estimates).mean()
