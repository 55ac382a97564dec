"""Any operator GPyTorch hands a user, as something an iterative solver can apply repeatedly."""

from __future__ import annotations

from typing import Any, Callable

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

__all__ = ["as_scipy", "evaluate_kernels", "operator_matmul"]


def evaluate_kernels(op: Any) -> Any:
    """``op`` with every GPyTorch ``LazyEvaluatedKernelTensor`` inside it replaced by the kernel
    operator it stands for; tensors are returned as they are.

    ``kernel(X)`` (and ``kernel(X).add_diagonal(...)``, sums, ``ScaleKernel`` outputs) hold
    ``LazyEvaluatedKernelTensor`` objects whose own ``_matmul`` refuses to run; every
    ``linear_operator`` function first rebuilds the operator from its representation, which
    evaluates them. This does the same, once, for solvers that apply the operator many times.

    Example:
        >>> import torch, lazykern
        >>> x = torch.randn(20, 2)
        >>> type(evaluate_kernels(lazykern.RBFKernel()(x).add_diagonal(torch.tensor(0.1)))).__name__
        'AddedDiagLinearOperator'
    """
    if isinstance(op, LinearOperator):
        return op.representation_tree()(*op.representation())
    return op


def operator_matmul(op: Any) -> Callable[[Tensor], Tensor]:
    """``X -> op @ X`` without autograd bookkeeping, for a tensor or any ``LinearOperator``
    (kernels evaluated once, see :func:`evaluate_kernels`).

    Example:
        >>> import torch
        >>> operator_matmul(torch.eye(3))(torch.ones(3, 1)).flatten().tolist()
        [1.0, 1.0, 1.0]
    """
    op = evaluate_kernels(op)
    # A LinearOperator's `@` goes through an autograd Function that rebuilds the operator on every
    # call; its `_matmul` is the closure linear_operator's own solvers iterate with.
    return op._matmul if isinstance(op, LinearOperator) else op.__matmul__


def as_scipy(op: Tensor | LinearOperator) -> Any:
    """A non-batch ``(N, M)`` operator as a ``scipy.sparse.linalg.LinearOperator`` (``matvec``,
    ``matmat``, ``rmatvec``, ``rmatmat``) on NumPy arrays of the operator's dtype.

    Takes a tensor or any ``linear_operator`` ``LinearOperator``: lazykern operators, what a
    GPyTorch kernel returns (``kernel(X)``, a ``ScaleKernel`` or sum output), and compositions
    such as ``kernel(X).add_diagonal(noise)``. Products run without autograd.

    Args:
        op: the operator, shape ``(N, M)``.

    Raises:
        TypeError: ``op`` is neither a tensor nor a ``LinearOperator``.
        ValueError: ``op`` is not two-dimensional.

    Example:
        >>> import numpy as np, scipy.sparse.linalg, torch, gpytorch, lazykern
        >>> x = torch.randn(200, 3, dtype=torch.float64)
        >>> kernel = gpytorch.kernels.ScaleKernel(lazykern.RBFKernel()).double()
        >>> A = lazykern.as_scipy(kernel(x).add_diagonal(torch.tensor(0.1, dtype=torch.float64)))
        >>> b = np.ones(200)
        >>> solution, info = scipy.sparse.linalg.cg(A, b, rtol=1e-10)
        >>> info, bool(np.allclose(A @ solution, b, atol=1e-6))
        (0, True)
    """
    from scipy.sparse.linalg import LinearOperator as ScipyOperator

    if not isinstance(op, (Tensor, LinearOperator)):
        raise TypeError(f"op must be a torch.Tensor or a linear_operator LinearOperator, got {type(op).__name__}")
    if op.dim() != 2:
        raise ValueError(f"op must be a non-batch (N, M) operator, got shape {tuple(op.shape)}")
    op = evaluate_kernels(op)
    dtype, device = op.dtype, op.device
    forward = operator_matmul(op)
    backward = operator_matmul(op.mT)

    def apply(matmul: Callable[[Tensor], Tensor], v: Any) -> Any:
        rhs = torch.as_tensor(v, dtype=dtype, device=device).reshape(v.shape[0], -1)
        with torch.no_grad():
            return matmul(rhs).cpu().numpy()

    return ScipyOperator(
        tuple(op.shape),
        matvec=lambda v: apply(forward, v).reshape(-1),
        matmat=lambda v: apply(forward, v),
        rmatvec=lambda v: apply(backward, v).reshape(-1),
        rmatmat=lambda v: apply(backward, v),
        dtype=torch.empty((), dtype=dtype).numpy().dtype,
    )
