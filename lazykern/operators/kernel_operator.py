"""The kernel matrix of a lazykern formula, as a ``linear_operator`` ``KernelLinearOperator``."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from linear_operator.operators import KernelLinearOperator
from linear_operator.utils.memoize import cached
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from .. import backend, settings


#: x1 -> (weak refs to x2 and the parameters, versions and formula, dense matrix). Keyed by identity
#: (tensors compare elementwise) and dropped when x1 dies.
_DENSE_CACHE = WeakIdKeyDictionary()


class LazyKernelOperator(KernelLinearOperator):
    r"""The matrix :math:`K_{ij} = k(x^{(1)}_i, x^{(2)}_j)` of a formula, never stored unless it fits.

    Matvecs run on KeOps (O((N + M) D) memory) or on the chunked torch engine (see
    :mod:`lazykern.backend`). When the N x M matrix fits in
    :class:`lazykern.settings.max_dense_bytes`, it is formed once, blockwise, and later matvecs
    use BLAS; gradients still come from the lazy reduction. Diagonals and gathered entries are
    O(N D) elementwise evaluations, so pivoted-Cholesky preconditioners never touch a full row
    block of the pairwise expression.

    Args:
        x1: ``(..., N, D)`` inputs, already transformed for the formula (e.g. divided by lengthscales).
        x2: ``(..., M, D)`` inputs.
        covar_func: a formula from :mod:`lazykern.formulas` (pure, closes over no tensor).
        params: tensor hyperparameters, each ``(*batch, 1, K)``.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(100, 3, dtype=torch.float64)
        >>> K = LazyKernelOperator(x, x, covar_func=StationaryFormula("rbf"))
        >>> (K @ torch.ones(100, 1, dtype=torch.float64)).shape
        torch.Size([100, 1])
    """

    # ------------------------------------------------------------------ reductions
    def _needs_grad(self, rhs: Tensor) -> bool:
        return torch.is_grad_enabled() and any(
            t.requires_grad for t in (self.x1, self.x2, rhs, *self.tensor_params.values())
        )

    def _dense_fits(self) -> bool:
        n, m = self.x1.shape[-2], self.x2.shape[-2]
        nbytes = self.batch_broadcast_shape.numel() * n * m * self.x1.element_size()
        return nbytes <= settings.max_dense_bytes.value()

    def _dense_no_grad(self) -> Tensor:
        # linear_operator rebuilds operators from their tensors inside Matmul/InvQuadLogdet, so a cache
        # on this object would be lost; key it on the tensors themselves (identity and version).
        others = (self.x2, *self.tensor_params.values())
        key = (self.covar_func, tuple(t._version for t in (self.x1, *others)))
        hit = _DENSE_CACHE.get(self.x1)
        if hit is not None and hit[1] == key and all(r() is t for r, t in zip(hit[0], others)):
            return hit[2]
        with torch.no_grad():
            dense = backend.pairwise_dense(self.covar_func, self.x1, self.x2, self.tensor_params)
        _DENSE_CACHE[self.x1] = (tuple(weakref.ref(t) for t in others), key, dense)
        return dense

    def _matmul(self, rhs: Tensor) -> Tensor:
        # Inside linear_operator's Matmul/solve functions grad is off here and gradients come from
        # _bilinear_derivative, which calls back into this method with grad on: the lazy branch.
        if not self._needs_grad(rhs) and self._dense_fits():
            return self._dense_no_grad() @ rhs
        return backend.pairwise_matmul(self.covar_func, self.x1, self.x2, self.tensor_params, rhs)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        if self._fused_symmetric_gradient():
            if left_vecs.dim() == 1:
                left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
            grad_x, grads = backend.symmetric_gradients(
                self.covar_func, self.x1, self.tensor_params, left_vecs, right_vecs
            )
            # x1 and x2 are one tensor: its whole gradient goes to the first occurrence.
            return (grad_x, None, *grads.values())
        return super()._bilinear_derivative(left_vecs, right_vecs)

    def _fused_symmetric_gradient(self) -> bool:
        x1, x2 = self.x1, self.x2
        same = x1 is x2 or (
            x1.data_ptr() == x2.data_ptr() and x1.shape == x2.shape and x1.stride() == x2.stride()
        )
        return (
            same
            and not self.batch_broadcast_shape
            and getattr(self.covar_func, "even_stationary", False)
            and backend.use_keops(x1.shape[-2], x2.shape[-2])
        )

    @cached
    def to_dense(self) -> Tensor:
        if not (torch.is_grad_enabled() and self.requires_grad) and self._dense_fits():
            return self._dense_no_grad()
        return backend.pairwise_dense(self.covar_func, self.x1, self.x2, self.tensor_params)

    @cached(name="kernel_diag")
    def _diagonal(self) -> Tensor:
        n = min(self.x1.shape[-2], self.x2.shape[-2])
        return backend.elementwise(
            self.covar_func, self.x1[..., :n, :], self.x2[..., :n, :], self.tensor_params
        )

    def _get_indices(self, row_index: Any, col_index: Any, *batch_indices: Any) -> Tensor:
        x1 = self.x1[(*batch_indices, row_index)]
        x2 = self.x2[(*batch_indices, col_index)]
        params = {name: p[batch_indices] for name, p in self.tensor_params.items()}
        return backend.elementwise(self.covar_func, x1, x2, params)

    # ------------------------------------------------------------------ interop
    def as_scipy(self):
        """This (non-batch) operator as a ``scipy.sparse.linalg.LinearOperator`` (matvec and matmat).

        Example:
            >>> import scipy.sparse.linalg
            >>> A = K.as_scipy()  # doctest: +SKIP
            >>> x, info = scipy.sparse.linalg.cg(A, b)  # doctest: +SKIP
        """
        from scipy.sparse.linalg import LinearOperator as ScipyOperator

        if len(self.batch_shape):
            raise ValueError(f"as_scipy expects a non-batch operator, got batch shape {tuple(self.batch_shape)}")
        torch_dtype, device = self.dtype, self.device
        transposed = self._transpose_nonbatch()

        def apply(op: LazyKernelOperator, v):
            rhs = torch.as_tensor(v, dtype=torch_dtype, device=device).reshape(v.shape[0], -1)
            with torch.no_grad():
                return op._matmul(rhs).cpu().numpy()

        numpy_dtype = torch.empty((), dtype=torch_dtype).numpy().dtype
        return ScipyOperator(
            self.shape,
            matvec=lambda v: apply(self, v).reshape(-1),
            matmat=lambda v: apply(self, v),
            rmatvec=lambda v: apply(transposed, v).reshape(-1),
            rmatmat=lambda v: apply(transposed, v),
            dtype=numpy_dtype,
        )
