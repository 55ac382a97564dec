"""Kernel ridge regression solved by batched preconditioned CG on a lazy kernel."""

from __future__ import annotations

from typing import Callable

import gpytorch
import torch
from gpytorch.kernels import Kernel
from linear_operator import to_linear_operator
from linear_operator.operators import LinearOperator
from torch import Tensor

from ..validation import check_floating_matrix, check_positive_int, check_positive_number
from .cg import CGResult, cg
from .preconditioners import JacobiPreconditioner, PivotedCholeskyPreconditioner

__all__ = ["KernelRidge"]

_PRECONDITIONERS = ("nystrom", "jacobi", None)


class KernelRidge:
    r"""Kernel ridge regression with a lazy kernel, in the scikit-learn ``fit`` / ``predict`` style.

    Fitting solves, for all outputs at once,

    .. math::

        (K_{XX} + \alpha I)\, A = Y, \qquad A \in \mathbb{R}^{N \times k},

    with :func:`~lazykern.solvers.cg` (one kernel pass per iteration for all :math:`k` outputs),
    preconditioned by default with a rank-``rank`` Nyström factor
    (:class:`~lazykern.solvers.PivotedCholeskyPreconditioner`) built from ``rank`` kernel rows.
    Predicting is one lazy cross-kernel pass, :math:`\hat Y_* = K_{X_* X} A`. Nothing N x N is
    stored unless the kernel operator itself decides it fits its dense budget
    (:class:`lazykern.settings.max_dense_bytes`). Fitting and prediction run without autograd:
    the kernel's hyperparameters are used as they are (train them with a GP marginal likelihood).

    Args:
        kernel: any ``gpytorch.kernels.Kernel``; lazykern kernels (additive included, optionally
            wrapped in ``ScaleKernel``) keep everything lazy, others are used through whatever
            ``LinearOperator`` or tensor they return.
        alpha: ridge :math:`\alpha > 0` (the noise variance of the GP view).
        precond: ``"nystrom"`` (default), ``"jacobi"`` or ``None``.
        rank: rank of the Nyström preconditioner, :math:`\ge 1` (capped at N).
        tol: relative residual tolerance of the CG solve, per output.
        max_iter: CG iteration cap (``None``: :func:`~lazykern.solvers.cg`'s default).

    Attributes:
        dual_coef_: set by ``fit``: :math:`A`, shape ``(N,)`` or ``(N, k)`` like ``y``.
        X_fit_: set by ``fit``: the training inputs.
        fit_result_: set by ``fit``: the :class:`~lazykern.solvers.CGResult` of the solve
            (iterations, residuals, convergence flags).

    Example:
        >>> import torch, lazykern
        >>> X = torch.randn(300, 4, dtype=torch.float64)
        >>> y = X.sin().sum(-1)
        >>> kernel = lazykern.kernels.AdditiveStructureKernel(
        ...     lazykern.kernels.RBFKernel(), num_dims=4).double()
        >>> model = lazykern.solvers.KernelRidge(kernel, alpha=1e-2, rank=50).fit(X, y)
        >>> model.predict(X[:5]).shape, model.fit_result_.all_converged
        (torch.Size([5]), True)
    """

    def __init__(
        self,
        kernel: Kernel,
        alpha: float = 1.0,
        *,
        precond: str | None = "nystrom",
        rank: int = 100,
        tol: float = 1e-6,
        max_iter: int | None = None,
    ) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a gpytorch.kernels.Kernel, got {type(kernel).__name__}")
        check_positive_number("alpha", alpha)
        if precond not in _PRECONDITIONERS:
            raise ValueError(f"precond must be one of {_PRECONDITIONERS}, got {precond!r}")
        check_positive_int("rank", rank)
        check_positive_number("tol", tol)
        if max_iter is not None and (isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1):
            raise ValueError(f"max_iter must be a positive int or None, got {max_iter!r}")
        self.kernel = kernel
        self.alpha = float(alpha)
        self.precond = precond
        self.rank = rank
        self.tol = float(tol)
        self.max_iter = max_iter

    def _kernel_matrix(self, x1: Tensor, x2: Tensor) -> LinearOperator:
        # Evaluate the kernel's forward now (active_dims applied) rather than gpytorch's deferred
        # LazyEvaluatedKernelTensor, so matvecs, rows and diagonals reach the lazy operator directly.
        with gpytorch.settings.lazily_evaluate_kernels(False):
            return to_linear_operator(self.kernel(x1, x2))

    def fit(
        self, X: Tensor, y: Tensor, *, callback: Callable[[int, Tensor, Tensor], None] | None = None
    ) -> "KernelRidge":
        """Solve :math:`(K_{XX} + \\alpha I) A = y` for the dual coefficients.

        Args:
            X: ``(N, D)`` finite training inputs (float32/float64).
            y: ``(N,)`` or ``(N, k)`` finite targets, same dtype as ``X``.
            callback: passed to :func:`~lazykern.solvers.cg`, which calls it after every iteration as
                ``callback(iteration, coefficients, relative_residuals)`` (recursive residuals; a progress
                bar, a convergence trace).

        Returns:
            ``self``.
        """
        check_floating_matrix("X", X)
        check_floating_matrix("y", y, min_dim=1)
        if X.dim() != 2:
            raise ValueError(f"X must have shape (N, D), got {tuple(X.shape)}")
        if y.dim() > 2 or y.shape[0] != X.shape[0]:
            raise ValueError(f"y must have shape ({X.shape[0]},) or ({X.shape[0]}, k) to match X, got {tuple(y.shape)}")
        if y.dtype != X.dtype:
            raise TypeError(f"X and y must have the same dtype, got {X.dtype} and {y.dtype}")
        with torch.no_grad():
            K = self._kernel_matrix(X, X)
            A = K.add_diagonal(torch.tensor(self.alpha, dtype=X.dtype, device=X.device))
            if self.precond == "nystrom":
                precond = PivotedCholeskyPreconditioner(K, rank=self.rank, shift=self.alpha)
            elif self.precond == "jacobi":
                precond = JacobiPreconditioner(K, shift=self.alpha)
            else:
                precond = None
            coef, result = cg(A, y, precond=precond, tol=self.tol, max_iter=self.max_iter, callback=callback)
        self.X_fit_ = X
        self.dual_coef_ = coef
        self.fit_result_: CGResult = result
        return self

    def predict(self, X: Tensor) -> Tensor:
        """Predictions :math:`K_{X_* X} A`, shape ``(M,)`` or ``(M, k)`` like the fitted ``y``.

        Args:
            X: ``(M, D)`` finite inputs with the training dtype and number of features.
        """
        if not hasattr(self, "dual_coef_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("KernelRidge.predict was called before fit(X, y)")
        check_floating_matrix("X", X)
        D = self.X_fit_.shape[-1]
        if X.dim() != 2 or X.shape[-1] != D:
            raise ValueError(f"X must have shape (M, {D}) like the training inputs, got {tuple(X.shape)}")
        if X.dtype != self.X_fit_.dtype:
            raise TypeError(f"X must have the training dtype {self.X_fit_.dtype}, got {X.dtype}")
        with torch.no_grad():
            return self._kernel_matrix(X, self.X_fit_) @ self.dual_coef_

    def __repr__(self) -> str:
        return (
            f"KernelRidge(kernel={type(self.kernel).__name__}, alpha={self.alpha}, precond={self.precond!r}, "
            f"rank={self.rank}, tol={self.tol}, max_iter={self.max_iter})"
        )

