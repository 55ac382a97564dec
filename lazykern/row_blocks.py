r"""A formula evaluated densely in row blocks: the pieces every engine shares, derivatives of any order.

A block holds ``rows x M`` pairs of the formula (times a right-hand side, or the block itself for
a dense build), at most :class:`lazykern.settings.chunk_bytes` of pairwise temporaries at a time.
Nothing of a block is kept for the backward pass: each derivative recomputes its blocks (hand-made
checkpointing).

Derivatives of every order (:func:`vjp`): every backward pass is a ``_BlockSum`` (the sum over row
blocks of the blocks' vector-Jacobian products), whose own backward is again a ``_BlockSum``, of
*its* vector-Jacobian product; a pass that builds no graph (training) computes each block's product
on detached tensors and keeps nothing. Each order therefore keeps the memory bound of one block.
Every engine takes its second and higher derivatives from here: the derivative of a
vector-Jacobian product is a different reduction from the ones the compiled engines and KeOps
build. This module sits below the engines and imports none of them.

.. math::

    \frac{\partial}{\partial \theta}\, \langle \bar Y, K V \rangle
    = \sum_b \frac{\partial}{\partial \theta}\, \langle \bar Y_b, K_b V \rangle,
    \qquad K_b = K[\text{rows of block } b]

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> x = torch.randn(30, 2, dtype=torch.float64, requires_grad=True)
    >>> v = torch.randn(30, 1, dtype=torch.float64)
    >>> y_bar = torch.ones(30, 1, dtype=torch.float64)  # the incoming gradient of K(x, x') v
    >>> gx, gx2, gv = vjp(StationaryFormula("rbf"), (), (x, x.detach(), v), (True, False, False), y_bar)
    >>> gx.shape, gx2, gv
    (torch.Size([30, 2]), None, None)
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence

import torch
from torch import Tensor

from . import settings
from .formulas import Formula, declared

__all__ = ["block", "pairwise_params", "block_columns", "block_rows", "row_blocks", "rows_per_chunk", "vjp"]


def pairwise_params(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``(*batch, 1, K)`` parameters with the pairwise axis inserted: ``(*batch, 1, 1, K)``."""
    return {name: p.unsqueeze(-3) for name, p in params.items()}


def block(formula: Formula, x1: Tensor, x2: Tensor, names: tuple[str, ...], *rest: Tensor) -> Tensor:
    """The block ``K(x1, x2)`` (``rest``: the parameters in ``names`` order), times ``rest[-1]`` when
    one tensor more than the names is given."""
    params = dict(zip(names, rest[: len(names)]))
    K = formula(x1.unsqueeze(-2), x2.unsqueeze(-3), **pairwise_params(params)).squeeze(-1)
    return K @ rest[-1] if len(rest) > len(names) else K


def rows_per_chunk(m: int, width: int, itemsize: int) -> int:
    """Rows per block so that a block of ``rows x m x width`` items stays within ``settings.chunk_bytes``."""
    return max(1, settings.chunk_bytes.value() // max(1, m * width * itemsize))


def row_blocks(n: int, step: int) -> list[slice]:
    """The row slices of blocks of ``step`` rows over ``n`` rows."""
    return [slice(start, start + step) for start in range(0, n, step)]


def block_rows(formula: Formula, x1: Tensor, x2: Tensor, params: Collection[Tensor]) -> int:
    """Rows per block of ``formula`` on these inputs, within ``settings.chunk_bytes``."""
    return rows_per_chunk(x2.shape[-2], _pair_items(formula, x1, x2, params), x2.element_size())


def block_columns(formula: Formula, x1: Tensor, x2: Tensor, params: Collection[Tensor]) -> int:
    """Columns per block of one row of ``formula`` on these inputs: all ``M`` where a row fits
    ``settings.chunk_bytes``, else as many as fit (a projected kernel's row of 10^4 points and
    500 terms is 20 MB in float32 per temporary, five times the default chunk)."""
    return min(x2.shape[-2], rows_per_chunk(1, _pair_items(formula, x1, x2, params), x2.element_size()))


def _pair_items(formula: Formula, x1: Tensor, x2: Tensor, params: Collection[Tensor]) -> int:
    # A block holds rows x M x (numbers per pair) for every member of the kernel's batch at once. A
    # formula that multiplies matrices instead of broadcasting (the NTK's) says how many numbers it
    # holds per pair; the default is the D of a distance-based formula's broadcast.
    batch = torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2], *(p.shape[:-2] for p in params))
    width = declared(formula).pair_width
    return batch.numel() * (x2.shape[-1] if width is None else width)


# ---------------------------------------------------------------------------- derivatives of any order
BlockFunction = Callable[..., tuple[Tensor, ...]]


def _vjp_of(f: BlockFunction, wanted: Sequence[bool], rows_of_cotangents: bool) -> BlockFunction:
    """The vector-Jacobian product of a block function ``f(rows, *inputs)``, itself a block function
    ``(rows, *inputs, *cotangents) -> gradients of the wanted inputs``.

    ``rows_of_cotangents``: ``f``'s outputs are the rows ``rows`` of a stacked result, so each block
    takes those rows of the cotangents; else its outputs are summed over blocks and every block takes
    the whole cotangents. Inputs that already require grad are differentiated as they are (a nested
    call from the next order's product), the others through fresh leaves.
    """
    count = len(wanted)

    def product(rows: slice, *args: Tensor) -> tuple[Tensor, ...]:
        inputs, cotangents = args[:count], args[count:]
        nested = any(t.requires_grad for t in args)
        with torch.enable_grad():
            leaves = [t if t.requires_grad else t.detach().requires_grad_(w) for t, w in zip(inputs, wanted)]
            outputs = f(rows, *leaves)
            if rows_of_cotangents:
                cotangents = tuple(c[..., rows, :] for c in cotangents)
            targets = [leaf for leaf, w in zip(leaves, wanted) if w]
            grads = torch.autograd.grad(outputs, targets, cotangents, create_graph=nested, allow_unused=True)
        return tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, targets))

    return product


class _BlockSum(torch.autograd.Function):
    r""":math:`\sum_b f(b, \text{inputs})` over row blocks :math:`b` of a block function returning
    a tuple of tensors. Its backward is another ``_BlockSum``, of ``f``'s vector-Jacobian product
    (:func:`_vjp_of`), so it is differentiable to any order, one block in memory at a time."""

    @staticmethod
    def forward(ctx, f, blocks, *inputs):  # noqa: D102 - autograd protocol
        detached = [t.detach() for t in inputs]
        total = None
        for rows in blocks:
            part = f(rows, *detached)
            total = list(part) if total is None else [a + b for a, b in zip(total, part)]
        ctx.f, ctx.blocks = f, blocks
        ctx.outputs = [(t.shape, t.dtype, t.device) for t in total]
        ctx.save_for_backward(*inputs)
        return tuple(total)

    @staticmethod
    def backward(ctx, *grads):  # noqa: D102 - autograd protocol
        inputs = ctx.saved_tensors
        wanted = ctx.needs_input_grad[2:]
        if not any(wanted):
            return (None, None, *(None for _ in inputs))
        # An output nothing downstream used has no gradient: a zero cotangent.
        grads = [torch.zeros(s, dtype=d, device=v) if g is None else g for g, (s, d, v) in zip(grads, ctx.outputs)]
        f = _vjp_of(ctx.f, wanted, rows_of_cotangents=False)
        result = iter(_BlockSum.apply(f, ctx.blocks, *inputs, *grads))
        return (None, None, *(next(result) if w else None for w in wanted))


def _stacked_rows(formula: Formula, names: tuple[str, ...]) -> BlockFunction:
    def rows_block(rows: slice, x1: Tensor, x2: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        return (block(formula, x1[..., rows, :], x2, names, *tensors),)

    return rows_block


def vjp(
    formula: Formula, names: tuple[str, ...], inputs: Sequence[Tensor], wanted: Sequence[bool], grad_out: Tensor
) -> list[Tensor | None]:
    r"""The gradients of :math:`\langle \bar Y, \text{out} \rangle` for the ``wanted`` ``inputs``,
    as a graph that is differentiable again (to any order), where ``out`` is the formula's product
    ``K(x1, x2) @ rhs`` or its dense matrix.

    Args:
        formula: the kernel formula.
        names: the parameter names, in the order of ``inputs[2 : 2 + len(names)]``.
        inputs: ``(x1, x2, *parameters)``, then ``rhs`` for a product.
        wanted: one flag per input: whether its gradient is returned (else ``None``).
        grad_out: :math:`\bar Y`, the shape of ``out``.
    """
    if not any(wanted):
        return [None for _ in inputs]
    x1, x2, *tensors = inputs
    rows = block_rows(formula, x1, x2, tensors[: len(names)])
    f = _vjp_of(_stacked_rows(formula, names), wanted, rows_of_cotangents=True)
    result = iter(_BlockSum.apply(f, row_blocks(x1.shape[-2], rows), *inputs, grad_out))
    return [next(result) if w else None for w in wanted]
