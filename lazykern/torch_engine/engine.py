r"""The chunked torch engine: a formula evaluated densely in row blocks, differentiable to any order.

Products and dense blocks of :func:`rowwise` are built from :mod:`lazykern.row_blocks` (blocks of
at most :class:`lazykern.settings.chunk_bytes` of pairwise temporaries, recomputed rather than kept
for the backward pass, derivatives of every order). The engine of small problems and of formulas
that multiply matrices (the NTK's, which BLAS does best); every engine's second derivatives come
from the same row blocks (:func:`lazykern.row_blocks.vjp`).

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> x = torch.randn(30, 2, dtype=torch.float64, requires_grad=True)
    >>> v = torch.randn(30, 1, dtype=torch.float64)
    >>> f = lambda x: ENGINE.matmul(StationaryFormula("rbf"), x, x, {}, v)
    >>> torch.autograd.gradgradcheck(f, (x,))
    True
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from .. import row_blocks
from ..engine import Engine, Plan
from ..formulas import Formula

__all__ = ["ENGINE", "TorchEngine", "rowwise"]


def _flush_subnormals_(values: Tensor) -> None:
    # Kernel entries below the normal range (exp of a large negative number) make CPU LAPACK about
    # 10x slower on the dense matrix (measured: docs/cpu_engine.rst, "Passes"). Writing them as
    # zeros changes each entry by less than finfo.tiny, and changes no process-wide float mode.
    values.masked_fill_(values.abs() < torch.finfo(values.dtype).tiny, 0.0)


class _RowBlocks(torch.autograd.Function):
    """Row blocks of a formula (times ``rhs``), written into one preallocated output; a row whose
    temporaries exceed the chunk is itself taken in blocks of columns.

    Writing into a preallocated result (rather than concatenating block outputs) matters: small
    block outputs interleaved with large freed temporaries fragment the C heap, and the peak resident
    set then grows with the number of blocks (measured: docs/performance.rst, "Chunk size").
    """

    @staticmethod
    def forward(ctx, formula, names, step, columns, x1, x2, *tensors):  # noqa: D102 - autograd protocol
        out = None
        dense = len(tensors) == len(names)
        params, rhs = tensors[: len(names)], tensors[len(names):]
        for rows in row_blocks.row_blocks(x1.shape[-2], step):
            for cols in row_blocks.row_blocks(x2.shape[-2], columns):
                values = row_blocks.block(formula, x1[..., rows, :], x2[..., cols, :], names, *params,
                                          *(r[..., cols, :] for r in rhs))
                if dense:
                    _flush_subnormals_(values)
                if out is None:
                    width = x2.shape[-2] if dense else values.shape[-1]
                    out = (values.new_empty if dense else values.new_zeros)(*values.shape[:-2], x1.shape[-2], width)
                if dense:
                    out[..., rows, cols] = values
                else:
                    out[..., rows, :] += values
                del values
        ctx.formula, ctx.names = formula, names
        ctx.save_for_backward(x1, x2, *tensors)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd protocol
        # One path for every order: without create_graph the blocks' products build no graph.
        grads = row_blocks.vjp(ctx.formula, ctx.names, ctx.saved_tensors, ctx.needs_input_grad[4:], grad_out)
        return (None, None, None, None, *grads)


def rowwise(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor | None) -> Tensor:
    """``K(x1, x2) @ rhs`` (``rhs=None``: the dense ``(..., N, M)`` matrix, entries below the normal
    range written as zeros) in row blocks within :class:`lazykern.settings.chunk_bytes` (and a row
    in blocks of columns where one row exceeds it), differentiable to any order in every tensor.

    Args:
        formula: a kernel formula.
        x1: ``(..., N, D1)``.
        x2: ``(..., M, D2)``.
        params: tensor parameters, each ``(..., 1, K)``.
        rhs: ``(..., M, C)`` or ``None``.
    """
    names = tuple(params)
    tensors = tuple(params.values()) + (() if rhs is None else (rhs,))
    values = params.values()
    return _RowBlocks.apply(formula, names, row_blocks.block_rows(formula, x1, x2, values),
                            row_blocks.block_columns(formula, x1, x2, values), x1, x2, *tensors)


class TorchEngine(Engine):
    """The chunked torch engine (:func:`rowwise`): any formula, on any device, differentiable to any
    order (its plan is ``True``: nothing to prepare); no fused symmetric gradient (autograd
    differentiates its row blocks)."""

    name = "torch"

    def supports(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
        return True

    def matmul(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor,
               plan: Plan | None = None) -> Tensor:
        return rowwise(formula, x1, x2, params, rhs)

    def dense(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
              plan: Plan | None = None) -> Tensor:
        return rowwise(formula, x1, x2, params, None)


#: The torch engine, as the chooser (:mod:`lazykern.backend`) lists it.
ENGINE = TorchEngine()
