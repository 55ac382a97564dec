"""Kernel ridge regression solved by batched preconditioned CG on a lazy kernel."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import gpytorch
import numpy as np
import torch
from gpytorch.kernels import Kernel
from linear_operator import to_linear_operator
from linear_operator.operators import LinearOperator
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data
from torch import Tensor

from ..validation import check_choice, check_floating_matrix, check_positive_int, check_positive_number
from .cg import CGResult, cg
from .preconditioners import JacobiPreconditioner, PivotedCholeskyPreconditioner, Preconditioner

__all__ = ["KernelRidge"]

_PRECONDITIONERS = ("nystrom", "jacobi", None)
# What scikit-learn's array checks turn numpy inputs into: float32 stays float32, anything else
# numeric (integers, object arrays of numbers) becomes float64.
_NUMPY_FLOATS = (np.float64, np.float32)


def _kernel_dtype_and_device(kernel: Kernel) -> tuple[torch.dtype | None, torch.device]:
    """The widest floating dtype among the kernel's parameters and buffers (``None`` if it has
    none) and the device they live on (CPU if none)."""
    tensors = [t for t in itertools.chain(kernel.parameters(), kernel.buffers()) if t.is_floating_point()]
    if not tensors:
        return None, torch.device("cpu")
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype, tensors[0].device


class KernelRidge(RegressorMixin, BaseEstimator):
    r"""Kernel ridge regression with a lazy kernel: a scikit-learn estimator (``fit`` / ``predict`` /
    ``score``, ``get_params`` / ``set_params``, so ``clone``, ``Pipeline`` and ``GridSearchCV`` work).

    Fitting solves, for all outputs at once,

    .. math::

        (K_{XX} + \alpha I)\, A = Y, \qquad A \in \mathbb{R}^{N \times k},

    with :func:`~lazykern.solvers.cg` (one kernel pass per iteration for all :math:`k` outputs),
    preconditioned by default with a rank-``rank`` Nyström factor
    (:class:`~lazykern.solvers.PivotedCholeskyPreconditioner`) built from ``rank`` kernel rows.
    Predicting is one lazy cross-kernel pass, :math:`\hat Y_* = K_{X_* X} A`; ``score`` is the
    coefficient of determination :math:`R^2` of those predictions (from ``RegressorMixin``).
    Nothing N x N is stored unless the kernel operator itself decides it fits its dense budget
    (:class:`lazykern.settings.max_dense_bytes`). Fitting and prediction run without autograd:
    the kernel's hyperparameters are used as they are (train them with a GP marginal likelihood).

    Inputs may be numpy arrays (or anything scikit-learn's ``check_array`` accepts: lists, pandas
    frames; they are moved to the kernel's device) or torch tensors; ``predict`` answers numpy for
    numpy and a tensor for a tensor. Dtypes promote as in GPyTorch: the solve runs in the widest of
    the inputs', the targets' and the kernel's floating dtypes (a float32 ``X`` with a float64
    kernel fits in float64), and ``predict`` computes in that fitted dtype.

    The constructor only stores its arguments (scikit-learn's convention); they are checked by
    ``fit``.

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
        dual_coef_: set by ``fit``: :math:`A`, a tensor of shape ``(N,)`` or ``(N, k)`` like ``y``.
        X_fit_: set by ``fit``: the training inputs, a tensor in the fitted dtype.
        n_features_in_: set by ``fit``: the number of input features :math:`D`.
        fit_result_: set by ``fit``: the :class:`~lazykern.solvers.CGResult` of the solve
            (iterations, residuals, convergence flags).
        n_iter_: set by ``fit``: CG iterations run (scikit-learn's name for ``fit_result_.iterations``).

    Example:
        >>> import numpy as np, torch, lazykern
        >>> X = torch.randn(300, 4, dtype=torch.float64)
        >>> y = X.sin().sum(-1)
        >>> kernel = lazykern.kernels.AdditiveStructureKernel(
        ...     lazykern.kernels.RBFKernel(), num_dims=4).double()
        >>> model = lazykern.solvers.KernelRidge(kernel, alpha=1e-2, rank=50).fit(X, y)
        >>> model.predict(X[:5]).shape, model.fit_result_.all_converged
        (torch.Size([5]), True)
        >>> type(model.predict(X[:5].numpy())).__name__, model.score(X.numpy(), y.numpy()) > 0.99
        ('ndarray', True)
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
        self.kernel = kernel
        self.alpha = alpha
        self.precond = precond
        self.rank = rank
        self.tol = tol
        self.max_iter = max_iter

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # a 2-D y is k outputs sharing one batched solve
        return tags

    def _check_params(self) -> None:
        if not isinstance(self.kernel, Kernel):
            raise TypeError(f"kernel must be a gpytorch.kernels.Kernel, got {type(self.kernel).__name__}")
        check_positive_number("alpha", self.alpha)
        check_choice("precond", self.precond, _PRECONDITIONERS)
        check_positive_int("rank", self.rank)
        check_positive_number("tol", self.tol)
        check_positive_int("max_iter", self.max_iter, optional=True)

    def _kernel_matrix(self, x1: Tensor, x2: Tensor) -> LinearOperator:
        # Evaluate the kernel's forward now (active_dims applied) rather than gpytorch's deferred
        # LazyEvaluatedKernelTensor, so matvecs, rows and diagonals reach the lazy operator directly.
        with gpytorch.settings.lazily_evaluate_kernels(False):
            return to_linear_operator(self.kernel(x1, x2))

    def _training_data(self, X: Any, y: Any) -> tuple[Tensor, Tensor]:
        """Checked ``X`` and ``y`` as tensors in the dtype the solve runs in; sets ``n_features_in_``."""
        kernel_dtype, device = _kernel_dtype_and_device(self.kernel)
        if isinstance(X, Tensor):
            check_floating_matrix("X", X)
            check_floating_matrix("y", y, min_dim=1)
            if X.dim() != 2:
                raise ValueError(f"X must have shape (N, D), got {tuple(X.shape)}")
            if y.dim() > 2 or y.shape[0] != X.shape[0]:
                raise ValueError(
                    f"y must have shape ({X.shape[0]},) or ({X.shape[0]}, k) to match X, got {tuple(y.shape)}"
                )
            self.n_features_in_ = X.shape[1]
        else:
            X, y = validate_data(self, X, y, dtype=_NUMPY_FLOATS, y_numeric=True, multi_output=True)
            # torch.tensor copies: scikit-learn may hand read-only (memory-mapped) arrays, which
            # torch.as_tensor would share and warn about.
            X, y = torch.tensor(X, device=device), torch.tensor(y, device=device)
        dtype = torch.promote_types(X.dtype, y.dtype)
        if kernel_dtype is not None:
            dtype = torch.promote_types(dtype, kernel_dtype)
        return X.to(dtype), y.to(dtype)

    def fit(
        self, X: Any, y: Any, *, callback: Callable[[int, Tensor, Tensor], None] | None = None
    ) -> "KernelRidge":
        """Solve :math:`(K_{XX} + \\alpha I) A = y` for the dual coefficients.

        Args:
            X: ``(N, D)`` finite training inputs: a float32/float64 tensor or a numpy array-like.
            y: ``(N,)`` or ``(N, k)`` finite targets, the same kind as ``X`` (any float dtype: it
                is promoted with ``X``'s and the kernel's).
            callback: passed to :func:`~lazykern.solvers.cg`, which calls it after every iteration as
                ``callback(iteration, coefficients, relative_residuals)`` (recursive residuals; a progress
                bar, a convergence trace).

        Returns:
            ``self``.
        """
        self._check_params()
        X, y = self._training_data(X, y)
        with torch.no_grad():
            K = self._kernel_matrix(X, X)
            A = K.add_diagonal(torch.tensor(float(self.alpha), dtype=X.dtype, device=X.device))
            precond: Preconditioner | None
            if self.precond == "nystrom":
                precond = PivotedCholeskyPreconditioner(K, rank=self.rank, shift=float(self.alpha))
            elif self.precond == "jacobi":
                precond = JacobiPreconditioner(K, shift=float(self.alpha))
            else:
                precond = None
            coef, result = cg(A, y, precond=precond, tol=float(self.tol), max_iter=self.max_iter, callback=callback)
        self.X_fit_ = X
        self.dual_coef_ = coef
        self.fit_result_: CGResult = result
        self.n_iter_ = result.iterations
        return self

    def predict(self, X: Any) -> Tensor | np.ndarray:
        """Predictions :math:`K_{X_* X} A`, shape ``(M,)`` or ``(M, k)`` like the fitted ``y``.

        Args:
            X: ``(M, D)`` finite inputs with the training number of features: a float32/float64
                tensor (answered with a tensor) or a numpy array-like (answered with a numpy array).
                They are cast to the fitted dtype.
        """
        check_is_fitted(self, "dual_coef_", msg="%(name)s.predict was called before fit(X, y)")
        as_numpy = not isinstance(X, Tensor)
        if as_numpy:
            X = torch.tensor(validate_data(self, X, reset=False, dtype=_NUMPY_FLOATS))
        else:
            check_floating_matrix("X", X)
            if X.dim() != 2 or X.shape[-1] != self.n_features_in_:
                raise ValueError(
                    f"X must have shape (M, {self.n_features_in_}) like the training inputs, got {tuple(X.shape)}"
                )
        X = X.to(dtype=self.X_fit_.dtype, device=self.X_fit_.device)
        with torch.no_grad():
            prediction = self._kernel_matrix(X, self.X_fit_) @ self.dual_coef_
        return prediction.cpu().numpy() if as_numpy else prediction

    def __repr__(self) -> str:
        # The kernel by class name: scikit-learn's default repr would print the whole nn.Module tree.
        return (
            f"KernelRidge(kernel={type(self.kernel).__name__}, alpha={self.alpha}, precond={self.precond!r}, "
            f"rank={self.rank}, tol={self.tol}, max_iter={self.max_iter})"
        )
