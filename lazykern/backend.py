"""Which engine evaluates a kernel formula, and how.

Two engines evaluate the same formula (:mod:`lazykern.formulas`):

* **KeOps**: the inputs are wrapped as ``LazyTensor`` and the reduction is compiled once per formula;
  memory is O((N + M) * D), nothing pairwise is ever stored.
* **torch**: row blocks of the pairwise expression are evaluated densely, at most
  :class:`lazykern.settings.chunk_bytes` at a time; the backward pass recomputes blocks instead of
  keeping them.

Parameters arrive with ``(*batch, 1, K)`` shapes (the ``KernelLinearOperator`` convention); this
module inserts the pairwise axis. Formulas return a trailing axis of size 1 per pair (as KeOps does),
which the torch engine drops.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import Tensor

from . import settings
from .keops import keops_lazy_tensor, keops_session, padded_size

Formula = Callable[..., object]

__all__ = ["use_keops", "pairwise_matmul", "pairwise_dense", "elementwise", "symmetric_gradients"]


def use_keops(n: int, m: int) -> bool:
    """Whether a pairwise reduction of an ``n`` x ``m`` kernel runs on KeOps under current settings."""
    choice = settings.engine.value()
    if choice != "auto":
        return choice == "keops"
    threshold = settings.keops_min_size.value()
    return n >= threshold and m >= threshold


def _pairwise_params(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {name: p.unsqueeze(-3) for name, p in params.items()}


def _keops_matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
    c = rhs.shape[-1]
    padded = padded_size(c)
    if padded != c:
        rhs = torch.nn.functional.pad(rhs, (0, padded - c))
    with keops_session():
        K = formula(
            keops_lazy_tensor(x1.unsqueeze(-2)),
            keops_lazy_tensor(x2.unsqueeze(-3)),
            **{n: keops_lazy_tensor(p) for n, p in _pairwise_params(params).items()},
        )
        out = K @ rhs.contiguous()
    return out[..., :c]


def symmetric_gradients(
    formula: Formula, x: Tensor, params: Mapping[str, Tensor], left: Tensor, right: Tensor
) -> tuple[Tensor | None, dict[str, Tensor | None]]:
    r"""Gradients of :math:`\sum_{ij} \langle l_i, r_j\rangle k(x_i, x_j)` in ONE KeOps reduction.

    For an even stationary formula, :math:`\partial k(x_i, x_j)/\partial x_j = -\partial k/\partial x_i`,
    so the gradient with respect to both occurrences of ``x`` is
    :math:`\sum_j (\langle l_i, r_j\rangle + \langle l_j, r_i\rangle)\, \partial k_{ij}/\partial x_i`,
    a reduction over j; the parameter gradients ride along in the same reduction (concatenated
    outputs, summed over i afterwards). KeOps' own backward would run one reduction per
    differentiated variable, each re-evaluating every exponential.

    Returns the gradient for ``x`` (``None`` unless it requires grad) and one per parameter.
    """
    c = left.shape[-1]
    pad = padded_size(c) - c
    left, right = torch.nn.functional.pad(left, (0, pad)), torch.nn.functional.pad(right, (0, pad))
    wanted = {n: p for n, p in params.items() if p.requires_grad}
    with keops_session():
        xi, xj = keops_lazy_tensor(x.unsqueeze(-2)), keops_lazy_tensor(x.unsqueeze(-3))
        lazy_params = {n: keops_lazy_tensor(p) for n, p in _pairwise_params(params).items()}
        K = formula(xi, xj, **lazy_params)
        li, rj = keops_lazy_tensor(left.unsqueeze(-2)), keops_lazy_tensor(right.unsqueeze(-3))
        weight = li | rj
        parts, sizes = [], []
        if x.requires_grad:
            ri, lj = keops_lazy_tensor(right.unsqueeze(-2)), keops_lazy_tensor(left.unsqueeze(-3))
            parts.append(K.grad(xi, weight + (ri | lj)))
            sizes.append(x.shape[-1])
        for name, p in wanted.items():
            parts.append(K.grad(lazy_params[name], weight))
            sizes.append(p.shape[-1])
        if not parts:
            return None, {n: None for n in params}
        fused = parts[0]
        for part in parts[1:]:
            fused = fused.concat(part)
        out = fused.sum(dim=x.dim() - 1)  # reduce over j: (..., N, sum(sizes))
    blocks = iter(out.split(sizes, dim=-1))
    grad_x = next(blocks) if x.requires_grad else None
    grads = {n: (next(blocks).sum(-2, keepdim=True).reshape(p.shape) if n in wanted else None) for n, p in params.items()}
    return grad_x, grads


def rows_per_chunk(m: int, width: int, itemsize: int) -> int:
    """Rows per block so that a block of ``rows x m x width`` items stays within ``settings.chunk_bytes``."""
    return max(1, settings.chunk_bytes.value() // max(1, m * width * itemsize))


def _torch_block(formula: Formula, x1: Tensor, x2: Tensor, names: tuple[str, ...], *rest: Tensor) -> Tensor:
    params = dict(zip(names, rest[: len(names)]))
    K = formula(x1.unsqueeze(-2), x2.unsqueeze(-3), **_pairwise_params(params)).squeeze(-1)
    return K @ rest[-1] if len(rest) > len(names) else K


def _row_blocks(x1: Tensor, step: int):
    for start in range(0, x1.shape[-2], step):
        yield slice(start, start + step)


class _RowBlocks(torch.autograd.Function):
    """Row blocks of a formula (times ``rhs``), written into one preallocated output.

    Hand-made checkpointing: forward keeps no intermediates and backward recomputes one block at a
    time. Writing into a preallocated result (rather than concatenating block outputs) matters: small
    block outputs interleaved with large freed temporaries fragment the C heap, and peak RSS then grew
    by ~2 MB per block (400 MB for a 2000 x 2000 matrix) in measurements.
    """

    @staticmethod
    def forward(ctx, formula, names, step, x1, x2, *tensors):  # noqa: D102 - autograd protocol
        out = None
        for rows in _row_blocks(x1, step):
            block = _torch_block(formula, x1[..., rows, :], x2, names, *tensors)
            if out is None:
                out = block.new_empty(*block.shape[:-2], x1.shape[-2], block.shape[-1])
            out[..., rows, :] = block
            del block
        ctx.formula, ctx.names, ctx.step = formula, names, step
        ctx.save_for_backward(x1, x2, *tensors)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        x1, x2, *tensors = ctx.saved_tensors
        inputs = (x1, x2, *tensors)
        wanted = ctx.needs_input_grad[3:]
        grads = [torch.zeros_like(t) if w else None for t, w in zip(inputs, wanted)]
        for rows in _row_blocks(x1, ctx.step):
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(w) for t, w in zip(inputs, wanted)]
                block = _torch_block(ctx.formula, leaves[0][..., rows, :], leaves[1], ctx.names, *leaves[2:])
                targets = [leaf for leaf, w in zip(leaves, wanted) if w]
                block_grads = iter(torch.autograd.grad(block, targets, grad_out[..., rows, :], allow_unused=True))
            for i, w in enumerate(wanted):
                g = next(block_grads) if w else None
                if g is not None:
                    grads[i] += g
        return (None, None, None, *grads)


def _torch_rowwise(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor | None) -> Tensor:
    names = tuple(params)
    tensors = tuple(params.values()) + (() if rhs is None else (rhs,))
    # A formula that multiplies matrices instead of broadcasting (the NTK's) says how many numbers
    # it holds per pair; the default is the broadcast rows x M x D of a distance-based formula.
    width = getattr(formula, "pair_width", x2.shape[-1])
    step = rows_per_chunk(x2.shape[-2], width, x2.element_size())
    return _RowBlocks.apply(formula, names, step, x1, x2, *tensors)


def _broadcast_rhs(x1: Tensor, rhs: Tensor) -> Tensor:
    batch = torch.broadcast_shapes(x1.shape[:-2], rhs.shape[:-2])
    return rhs.expand(*batch, *rhs.shape[-2:])


def pairwise_matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
    """``K(x1, x2) @ rhs`` without storing K. ``x1``: (..., N, D), ``x2``: (..., M, D), ``rhs``: (..., M, C)."""
    vector = rhs.dim() == 1
    if vector:
        rhs = rhs.unsqueeze(-1)
    rhs = _broadcast_rhs(x1, rhs)
    if use_keops(x1.shape[-2], x2.shape[-2]):
        out = _keops_matmul(formula, x1, x2, params, rhs)
    else:
        out = _torch_rowwise(formula, x1, x2, params, rhs)
    return out.squeeze(-1) if vector else out


def pairwise_dense(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """The (..., N, M) kernel matrix, built in row blocks so N x M x D never exists."""
    return _torch_rowwise(formula, x1, x2, params, None)


def elementwise(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    """``k(x1[..., i, :], x2[..., i, :])`` for each i, in O(N * D): diagonals and gathered entries."""
    return formula(x1, x2, **params).squeeze(-1)
