"""The kernel matrix of a lazykern formula, as a ``linear_operator`` ``KernelLinearOperator``."""

from __future__ import annotations

from typing import Any

import torch
from linear_operator.operators import KernelLinearOperator, LinearOperator
from torch import Tensor

from .. import backend
from ..formulas import Combination, Part, Scaled
from .dense_cache import DENSE_CACHE
from .preconditioning import attach_grid_preconditioner


def _one_tensor(a: Tensor, b: Tensor) -> bool:
    """Whether gradients for ``b`` may be given to ``a``: the same tensor, or views of one tensor
    with one geometry (what KernelLinearOperator makes of ``x1 is x2`` in a batch)."""
    if a is b:
        return True
    return (
        a._base is not None
        and a._base is b._base
        and (a.shape, a.stride(), a.storage_offset()) == (b.shape, b.stride(), b.storage_offset())
    )


class LazyKernelOperator(KernelLinearOperator):
    r"""The matrix :math:`K_{ij} = k(x^{(1)}_i, x^{(2)}_j)` of a formula, never stored unless it fits.

    Matvecs are one lazy reduction of the formula, in O((N + M) D) memory, on the engine
    :func:`lazykern.backend.choose_engine` picks (:mod:`lazykern.backend`): lazykern's compiled
    CPU engine for CPU tensors, KeOps on GPUs, the chunked torch engine for small problems. When
    the N x M matrix fits the dense budget (:class:`lazykern.settings.max_dense_bytes`, per
    device), it is formed once, blockwise, kept in
    :data:`~lazykern.operators.dense_cache.DENSE_CACHE`, and later matvecs use BLAS; gradients
    still come from the lazy reduction. Diagonals and gathered entries are O(N D) elementwise
    evaluations, so pivoted-Cholesky preconditioners never touch a full row block of the pairwise
    expression.

    Sums, elementwise products and constant multiples of lazykern operators of one shape are
    again lazykern operators of **one** formula (:mod:`lazykern.formulas.composite`): GPyTorch's
    ``ScaleKernel``, ``AdditiveKernel`` and ``ProductKernel`` of lazykern kernels evaluate as one
    reduction, with no root decomposition.

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
        >>> type(K + 2 * K).__name__  # one formula: the sum of K and a scaled K
        'LazyKernelOperator'
    """

    def __init__(self, x1: Tensor, x2: Tensor, covar_func: Any, **kwargs: Any) -> None:
        if x2 is x1:
            # KernelLinearOperator broadcasts x1 and x2 to the batch shape one by one (two copies);
            # broadcast once here instead, so that both sides stay views of one tensor.
            batch = torch.broadcast_shapes(
                x1.shape[:-2], *(p.shape[:-2] for p in kwargs.values() if torch.is_tensor(p))
            )
            if batch != x1.shape[:-2]:
                x1 = x2 = x1.expand(*batch, *x1.shape[-2:]).contiguous()
        super().__init__(x1, x2, covar_func=covar_func, **kwargs)

    # ------------------------------------------------------------------ reductions
    def _needs_grad(self, rhs: Tensor) -> bool:
        return torch.is_grad_enabled() and any(
            t.requires_grad for t in (self.x1, self.x2, rhs, *self.tensor_params.values())
        )

    def _cached_dense(self) -> tuple[Tensor | None, backend.Choice | None]:
        """The dense matrix from the dense cache, formed now if it fits the budget and the chosen
        engine's products do not cost less than forming it; else ``None``. Also the chooser's answer, when
        this asked the chooser (so that a product asks it once)."""
        others = (self.x2, *self.tensor_params.values())
        dense = DENSE_CACHE.lookup(self.x1, others, self.covar_func)
        if dense is not None:
            return dense, None
        n, m = self.x1.shape[-2], self.x2.shape[-2]
        nbytes = self.batch_broadcast_shape.numel() * n * m * self.x1.element_size()
        if not DENSE_CACHE.fits(nbytes, self.x1.device):
            return None, None
        choice = backend.choose_engine(self.covar_func, self.x1, self.x2, self.tensor_params)
        if choice.engine.products_beat_dense:
            return None, choice
        with torch.no_grad():
            dense = backend.pairwise_dense(self.covar_func, self.x1, self.x2, self.tensor_params, choice)
        DENSE_CACHE.store(self.x1, others, self.covar_func, dense)
        return dense, choice

    def _matmul(self, rhs: Tensor) -> Tensor:
        # Inside linear_operator's Matmul/solve functions grad is off here and gradients come from
        # _bilinear_derivative, which calls back into this method with grad on: the lazy branch.
        choice = None
        if not self._needs_grad(rhs):
            dense, choice = self._cached_dense()
            if dense is not None:
                return backend.dense_matmul(dense, rhs)
        return backend.pairwise_matmul(self.covar_func, self.x1, self.x2, self.tensor_params, rhs, choice)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():
            return self._differentiable_bilinear_derivative(left_vecs, right_vecs)
        if self._same_points():
            # K(X, X): one fused reduction where the chosen engine has one (else None)
            if left_vecs.dim() == 1:
                left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
            x2 = self.x1 if _one_tensor(self.x1, self.x2) else self.x2
            fused = backend.symmetric_gradients(
                self.covar_func, self.x1, x2, self.tensor_params, left_vecs, right_vecs
            )
            if fused is not None:
                grad_x1, grad_x2, grads = fused
                # linear_operator's representation order: x1, x2, then the parameters by name.
                return (grad_x1, grad_x2, *(grads[name] for name in self._differentiable_kwargs))
        return super()._bilinear_derivative(left_vecs, right_vecs)

    def _differentiable_bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        """The derivative of a backward pass that builds a graph (``create_graph=True``: Hessians,
        Hessian-vector products), itself differentiable.

        linear_operator's default differentiates detached copies of the arguments, so every second
        derivative through it would be zero. Here each argument is differentiated through an alias
        (a view, a node of its own in the graph): gradients for the alias follow only the paths
        through this operator's formula, not the vectors' own dependence on the arguments (the
        incoming gradient is often a function of this very product), and the result stays a
        function of the arguments and of both vectors. One alias stands for a tensor given for both
        ``x1`` and ``x2`` (``K(X, X)``), which receives its whole gradient once, in its first place.
        """
        if left_vecs.dim() == 1:
            left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
        args = self.representation()
        aliases = {id(a): a.view_as(a) for a in args if a.requires_grad}
        if not aliases:
            return (None,) * len(args)
        operator = self.representation_tree()(*(aliases.get(id(a), a) for a in args))
        loss = (left_vecs * operator._matmul(right_vecs)).sum()
        grads = torch.autograd.grad(loss, list(aliases.values()), create_graph=True, allow_unused=True)
        by_tensor = dict(zip(aliases, grads))
        return tuple(by_tensor.pop(id(a), None) for a in args)

    def _same_points(self) -> bool:
        """Whether both sides hold the same points (K(X, X)), as one tensor or equal ones."""
        x1, x2 = self.x1, self.x2
        return x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))

    def to_dense(self) -> Tensor:
        """The dense ``(..., N, M)`` matrix: differentiable when gradients are enabled and some
        input requires them, else the dense-cache copy when it fits the budget."""
        if not (torch.is_grad_enabled() and self.requires_grad):
            dense, choice = self._cached_dense()
            if dense is not None:
                return dense
            return backend.pairwise_dense(self.covar_func, self.x1, self.x2, self.tensor_params, choice)
        return backend.pairwise_dense(self.covar_func, self.x1, self.x2, self.tensor_params)

    def _diagonal(self) -> Tensor:
        n = min(self.x1.shape[-2], self.x2.shape[-2])
        return backend.elementwise(
            self.covar_func, self.x1[..., :n, :], self.x2[..., :n, :], self.tensor_params
        )

    def __getitem__(self, index: Any) -> LinearOperator | Tensor:
        if isinstance(index, tuple) and len(index) == 2 and self.dim() == 2 and _is_grid(*index):
            # A block of rows x columns by tensor indices (GPyTorch's pivoted Cholesky asks for
            # N x rank entries this way, also with gradients): one pairwise pass, where
            # linear_operator would gather a copy of both inputs for every entry (N x rank x D).
            rows, cols = index
            x1, x2 = self.x1[rows[:, 0]], self.x2[cols[0]]
            return backend.pairwise_dense(self.covar_func, x1, x2, self.tensor_params)
        return super().__getitem__(index)

    def _get_indices(self, row_index: Any, col_index: Any, *batch_indices: Any) -> Tensor:
        x1 = self.x1[batch_indices + (row_index,)]
        x2 = self.x2[batch_indices + (col_index,)]
        # (*batch, 1, K) -> (*indexed, K): one parameter row per gathered entry.
        params = {name: p.squeeze(-2)[batch_indices] for name, p in self.tensor_params.items()}
        return backend.elementwise(self.covar_func, x1, x2, params)

    # ------------------------------------------------------------------ one formula for sums and products
    def __add__(self, other: Any) -> LinearOperator | Tensor:
        combined = self._combine(other, "sum")
        # K + noise (what GPyTorch's likelihood builds) carries the grid preconditioner where it applies
        return attach_grid_preconditioner(super().__add__(other)) if combined is None else combined

    def add_diagonal(self, diag: Tensor) -> LinearOperator:
        """:math:`K + \\operatorname{diag}(d)`, with the grid preconditioner of
        :mod:`lazykern.operators.preconditioning` where it applies."""
        return attach_grid_preconditioner(super().add_diagonal(diag))

    def _mul_matrix(self, other: LinearOperator | Tensor) -> LinearOperator:
        combined = self._combine(other, "product")
        return super()._mul_matrix(other) if combined is None else combined

    def _mul_constant(self, other: Tensor) -> LinearOperator:
        scale = other.to(self.dtype).reshape(*other.shape, 1, 1)
        params = dict(self.tensor_params)
        if isinstance(self.covar_func, Scaled):
            formula = self.covar_func
            params["outputscale"] = params["outputscale"] * scale
        else:
            formula = Scaled(self.covar_func)
            params["outputscale"] = scale
        return LazyKernelOperator(self.x1, self.x2, covar_func=formula, **params)

    def _combine(self, other: Any, op: str) -> LazyKernelOperator | None:
        """``self + other`` or ``self * other`` (elementwise) as one operator on the concatenated
        inputs, or ``None`` when ``other`` is not a lazykern operator of the same shape."""
        if not isinstance(other, LazyKernelOperator) or other.shape[-2:] != self.shape[-2:]:
            return None
        if other.device != self.device:
            return None
        try:
            batch = torch.broadcast_shapes(self.batch_shape, other.batch_shape)
        except RuntimeError:
            return None
        dtype = torch.promote_types(self.dtype, other.dtype)
        parts: list[Part] = []
        params: dict[str, Tensor] = {}
        x1s, x2s, offset, symmetric = [], [], 0, True
        for operand in (self, other):
            formula = operand.covar_func
            if isinstance(formula, Combination) and formula.op == op:
                pieces = formula.parts
            else:
                names = tuple((name, name) for name in operand.tensor_params)
                pieces = (Part(formula, 0, operand.x1.shape[-1], names),)
            for piece in pieces:
                names = tuple((f"t{len(parts)}_{inner}", inner) for _, inner in piece.names)
                for (old, _), (new, _) in zip(piece.names, names):
                    params[new] = operand.tensor_params[old].to(dtype)
                parts.append(Part(piece.formula, offset + piece.start, offset + piece.stop, names))
            x1 = operand.x1.to(dtype).expand(*batch, *operand.x1.shape[-2:])
            x1s.append(x1)
            x2s.append(x1 if operand.x2 is operand.x1 else operand.x2.to(dtype).expand(*batch, *operand.x2.shape[-2:]))
            symmetric &= operand.x2 is operand.x1
            offset += operand.x1.shape[-1]
        x1 = torch.cat(x1s, dim=-1)
        # One tensor for both sides keeps K(X, X) recognizable (fused symmetric gradient, one cache key).
        x2 = x1 if symmetric else torch.cat(x2s, dim=-1)
        return LazyKernelOperator(x1, x2, covar_func=Combination(op, tuple(parts)), **params)

    # ------------------------------------------------------------------ interop
    def as_scipy(self) -> Any:
        """This (non-batch) operator as a ``scipy.sparse.linalg.LinearOperator``: see
        :func:`lazykern.operators.as_scipy`, which takes any ``LinearOperator``.

        Example:
            >>> import torch
            >>> from lazykern.formulas import StationaryFormula
            >>> x = torch.randn(50, 2, dtype=torch.float64)
            >>> A = LazyKernelOperator(x, x, covar_func=StationaryFormula("rbf")).as_scipy()
            >>> A.shape, A.dtype
            ((50, 50), dtype('float64'))
        """
        from .scipy_view import as_scipy

        return as_scipy(self)


def _is_grid(row_index: Any, col_index: Any) -> bool:
    """Whether the indices select a full block: rows ``(R, 1)`` against columns ``(1, C)``."""
    return (
        torch.is_tensor(row_index) and torch.is_tensor(col_index)
        and row_index.dim() == 2 and col_index.dim() == 2
        and row_index.shape[1] == 1 and col_index.shape[0] == 1
    )
