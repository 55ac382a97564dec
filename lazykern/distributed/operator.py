r"""A lazykern operator whose products are computed in row blocks, one per rank, and all-gathered."""

from __future__ import annotations

import math
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from gpytorch.lazy import LazyEvaluatedKernelTensor
from linear_operator.operators import LinearOperator
from torch import Tensor

from ..validation import check_process_group
from .collectives import all_reduce_sum, check_same_on_all_ranks, gather_rows, row_bounds

__all__ = ["ShardedOperator", "shard"]


def _children(op: LinearOperator) -> list[tuple[str, Any]]:
    """The arguments an operator's representation is made of, named after the attributes holding them."""
    named: list[tuple[str, Any]] = []
    seen: dict[int, int] = {}  # by id(arg): how many of its holders are taken
    for i, arg in enumerate(op._args):
        holders = [k.lstrip("_") for k, v in vars(op).items() if v is arg and not k.startswith("__")]
        k = seen.get(id(arg), 0)
        seen[id(arg)] = k + 1
        named.append((holders[min(k, len(holders) - 1)] if holders else str(i), arg))
    return named + list(op._differentiable_kwargs.items())


def named_representation(op: LinearOperator, prefix: str | None = None) -> list[tuple[str, Tensor]]:
    """``op.representation()`` with a readable name per tensor (for error messages)."""
    prefix = type(op).__name__ if prefix is None else prefix
    named: list[tuple[str, Tensor]] = []
    for name, arg in _children(op):
        if isinstance(arg, LinearOperator):
            named += named_representation(arg, f"{prefix}.{name}")
        elif isinstance(arg, Tensor):
            named.append((f"{prefix}.{name}", arg))
    rep = op.representation()
    if len(named) != len(rep) or any(t is not r for (_, t), r in zip(named, rep)):
        # an operator that builds its representation its own way: number the tensors instead
        named = [(f"{prefix}[{i}]", t) for i, t in enumerate(rep)]
    return named


def rows_per_input(op: LinearOperator) -> int:
    """Rows that belong to one input point (``num_outputs_per_input``, e.g. ``k`` for a full-mode NTK).

    Row blocks are cut at multiples of it, so that each block is again an operator on a subset
    of the inputs. Composite operators (sums, scalings) need the least common multiple of their parts.
    """
    own = getattr(op, "num_outputs_per_input", (1, 1))
    unit = own[0] if isinstance(own, tuple) else 1
    for _, child in _children(op):
        if isinstance(child, LinearOperator):
            unit = math.lcm(unit, rows_per_input(child))
    return unit


class ShardedOperator(LinearOperator):
    r"""A linear operator :math:`K` whose products :math:`K V` are split by rows over a process group.

    With :math:`P` ranks and the rows cut into blocks :math:`R_0, \dots, R_{P-1}` of (nearly)
    equal size, rank :math:`p` evaluates only

    .. math::

        (K V)_{R_p} = K_{R_p, :}\, V \qquad \text{(a lazy row block of the wrapped operator)}

    and an ``all_gather`` assembles :math:`K V` on every rank. For a kernel matrix every row costs
    one reduction over all :math:`M` columns, so equal row counts are equal work (the symmetric
    :math:`K(X, X)` included). Gradients of :math:`\sum \langle U, K V\rangle` with respect to the
    hyperparameters and inputs are each rank's block gradient
    :math:`\partial \langle U_{R_p}, K_{R_p,:} V\rangle`, summed by one ``all_reduce``, so GPyTorch's
    CG, Lanczos and marginal likelihood run on it unchanged. Diagonals, single entries, row slices
    and :meth:`to_dense` need no communication: every rank holds the whole (lazy) operator and
    evaluates them locally.

    Build it with :func:`shard` (which checks that all ranks agree); ``linear_operator`` rebuilds
    it from its representation, which is the wrapped operator's.

    Args:
        base: the operator to shard.
        group: the process group (already checked by :func:`shard`).

    Example:
        >>> import torch, torch.distributed as dist, lazykern
        >>> if not dist.is_initialized():  # in real use: torchrun, and init_process_group on every rank
        ...     dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
        >>> x = torch.randn(100, 3, dtype=torch.float64)
        >>> K = lazykern.distributed.shard(lazykern.RBFKernel().double()(x))
        >>> K.local_rows, K.shape
        (slice(0, 100, None), torch.Size([100, 100]))
        >>> dist.destroy_process_group()  # the example's own group: later code starts without one
    """

    def __init__(self, base: LinearOperator, *, group: dist.ProcessGroup) -> None:
        super().__init__(base, group=group)
        self.base = base
        self.group = group
        self.bounds = row_bounds(base.shape[-2], dist.get_world_size(group), rows_per_input(base))
        self._local: LinearOperator | None = None

    @property
    def local_rows(self) -> slice:
        """The rows this rank computes."""
        start, stop = self.bounds[dist.get_rank(self.group)]
        return slice(start, stop)

    def _block_of(self, op: LinearOperator) -> LinearOperator | None:
        rows = self.local_rows
        if rows.start == rows.stop:
            return None
        if rows.start == 0 and rows.stop == op.shape[-2]:
            return op  # one rank: the operator itself, with its own (e.g. fused symmetric) paths
        return op[..., rows, :]

    @property
    def local_block(self) -> LinearOperator | None:
        """This rank's row block of the wrapped operator (``None`` if it has no rows)."""
        if self._local is None:
            self._local = self._block_of(self.base)
        return self._local

    # ------------------------------------------------------------------ structure
    def _size(self) -> torch.Size:
        return self.base.shape

    def _transpose_nonbatch(self) -> "ShardedOperator":
        return ShardedOperator(self.base._transpose_nonbatch(), group=self.group)

    # ------------------------------------------------------------------ products
    def _matmul(self, rhs: Tensor) -> Tensor:
        vector = rhs.dim() == 1
        rhs2 = rhs.unsqueeze(-1) if vector else rhs
        block = self.local_block
        if block is None:
            batch = torch.broadcast_shapes(self.batch_shape, rhs2.shape[:-2])
            local = rhs2.new_zeros(*batch, 0, rhs2.shape[-1])
        else:
            local = block._matmul(rhs2)
        out = gather_rows(local, rhs2, self.bounds, self.group)
        return out.squeeze(-1) if vector else out

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        # The block's own derivative (with respect to the block's representation: sliced inputs,
        # parameters) is chained back to the whole operator's representation by autograd through
        # the slicing, then summed over the ranks.
        args = self.representation()
        wanted = [a.dtype.is_floating_point and a.requires_grad for a in args]
        if not any(wanted):
            return (None,) * len(args)
        if left_vecs.dim() == 1:
            left_vecs, right_vecs = left_vecs.unsqueeze(-1), right_vecs.unsqueeze(-1)
        leaves = [a.detach().requires_grad_(w) for a, w in zip(args, wanted)]
        targets = [leaf for leaf, w in zip(leaves, wanted) if w]
        grads = [torch.zeros_like(t) for t in targets]
        with torch.enable_grad():
            block = self._block_of(self.base.representation_tree()(*leaves))
            if block is not None:
                block_grads = block._bilinear_derivative(left_vecs[..., self.local_rows, :], right_vecs)
                # detached: a derivative may come out attached to the graph (e.g. a constant's,
                # computed from a product under grad mode), and it is a constant of this chain
                terms = [
                    (t * g.detach()).sum()
                    for t, g in zip(block.representation(), block_grads)
                    if g is not None and t.requires_grad
                ]
                if terms:
                    found = torch.autograd.grad(sum(terms), targets, allow_unused=True)
                    grads = [z if g is None else g for g, z in zip(found, grads)]
        summed = iter(all_reduce_sum(grads, self.group))
        return tuple(next(summed) if w else None for w in wanted)

    # ------------------------------------------------------------------ local (no communication)
    def _diagonal(self) -> Tensor:
        return self.base._diagonal()

    def _get_indices(self, row_index: Any, col_index: Any, *batch_indices: Any) -> Tensor:
        return self.base._get_indices(row_index, col_index, *batch_indices)

    def _getitem(self, row_index: Any, col_index: Any, *batch_indices: Any) -> LinearOperator:
        if _whole(row_index) and _whole(col_index):
            return super()._getitem(row_index, col_index, *batch_indices)  # batch selection: stays sharded
        # a few rows (preconditioners) or a sub-block: cheaper evaluated locally than gathered
        return self.base._getitem(row_index, col_index, *batch_indices)

    def to_dense(self) -> Tensor:
        return self.base.to_dense()


def shard(op: LinearOperator, group: dist.ProcessGroup | None = None) -> ShardedOperator:
    r"""Split the products of ``op`` over the ranks of ``group``: each rank computes a block of rows.

    Call it on **every** rank of ``group`` with the same operator (same data, same
    hyperparameters): the output of a lazykern kernel (``kernel(X)``, ``kernel(X1, X2)``, also
    scaled or summed), or an NTK operator (:func:`lazykern.ntk.empirical_ntk`). Products
    :math:`K V` then cost :math:`1/P` of the kernel evaluations per rank plus one ``all_gather``
    of the :math:`N \times C` result (see :class:`ShardedOperator`); gradients one ``all_reduce``.
    Run everything that follows identically on all ranks (same seed): solvers and GPyTorch's
    marginal likelihood keep their state on every rank; each product checks that all ranks
    multiplied the same right-hand side.

    Before returning, two tiny ``all_gather`` calls check that all ranks hold the same operator:
    the same structure, shapes and dtypes, and the same values (position-weighted checksums of
    inputs and hyperparameters).

    Args:
        op: a ``linear_operator`` ``LinearOperator``, or GPyTorch's ``LazyEvaluatedKernelTensor``
            (what ``kernel(X)`` returns; it is evaluated to the kernel's operator).
        group: a ``torch.distributed`` process group (``None``: the default group). ``gloo``
            works for CPU tensors, ``nccl`` for CUDA tensors (one GPU per rank).

    Returns:
        :class:`ShardedOperator`, a ``LinearOperator`` of the same shape, dtype and device.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        TypeError: ``op`` is not an operator, or ``group`` not a process group.
        ValueError: the ranks disagree on the operator (shapes, dtypes or values: the message
            names the tensor and the ranks), or an ``nccl`` group was given CPU tensors.

    Example:
        >>> import torch, torch.distributed as dist, gpytorch, lazykern
        >>> if not dist.is_initialized():  # in real use: torchrun, and init_process_group on every rank
        ...     dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29532", rank=0, world_size=1)
        >>> x = torch.randn(1000, 3, dtype=torch.float64)
        >>> kernel = gpytorch.kernels.ScaleKernel(lazykern.RBFKernel(ard_num_dims=3)).double()
        >>> K = lazykern.distributed.shard(kernel(x))
        >>> (K @ torch.ones(1000, 2, dtype=torch.float64)).shape
        torch.Size([1000, 2])
        >>> dist.destroy_process_group()  # the example's own group: later code starts without one
    """
    if isinstance(op, LazyEvaluatedKernelTensor):
        op = op.evaluate_kernel()
    if not isinstance(op, LinearOperator):
        raise TypeError(
            f"op must be a linear_operator LinearOperator or the LazyEvaluatedKernelTensor of kernel(X), "
            f"got {type(op).__name__}"
        )
    group = check_process_group("group", group)
    if dist.get_backend(group) == "nccl" and op.device.type != "cuda":
        raise ValueError(f"group uses the nccl backend, which needs CUDA tensors, but op is on {op.device}; use gloo for CPU")
    check_same_on_all_ranks(named_representation(op), op.shape, group)
    return ShardedOperator(op, group=group)


def _whole(index: Any) -> bool:
    """Whether a row or column index selects everything (``:``). (linear_operator has this test as a
    private helper, ``utils.getitem._is_noop_index``; its private names are not lazykern's to import.)"""
    return isinstance(index, slice) and index == slice(None)
