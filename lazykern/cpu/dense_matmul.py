r"""Products of a stored dense kernel matrix with a few right-hand sides: :math:`K V`, ``V`` of
``C`` columns.

CG and Lanczos multiply the cached dense :math:`K` by a handful of columns (the targets and the
probe vectors) each iteration. BLAS ``gemm`` is tuned for wide right-hand sides and was several
times slower than this loop nest at a few columns (measured: ``benchmarks/results/dense-matmul.md``).
The loop reads 4 rows of :math:`K` against 4 columns of :math:`V` at a time (16 accumulators in
registers, vectorized along the rows of :math:`K`), so :math:`K` streams from memory about once
per 4 columns. A single column stays with BLAS ``gemv``, which is already memory-bound.
"""

from __future__ import annotations

import ctypes
import os

import torch
from torch import Tensor

from ..compiler.plan import DTYPES
from .. import native
from .reductions import threads

__all__ = ["dense_matmul", "supports_dense_matmul"]

#: The loop nest, in C (its element type ``LK_REAL`` defined by :func:`dense_matmul`).
_SOURCE = os.path.join(os.path.dirname(__file__), "dense_matmul.c")

_ARGTYPES = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5


def supports_dense_matmul(dense: Tensor, rhs: Tensor) -> bool:
    """Whether :func:`dense_matmul` takes ``dense @ rhs``: CPU tensors of one float dtype, at least
    2 columns, and ``rhs``'s batch no larger than ``dense``'s (``dense`` is never copied).

    Example:
        >>> import torch
        >>> supports_dense_matmul(torch.ones(3, 3), torch.ones(3, 2)), supports_dense_matmul(torch.ones(3, 3), torch.ones(3))
        (True, False)
    """
    return (
        dense.device.type == "cpu"
        and dense.dtype in DTYPES
        and rhs.dtype == dense.dtype
        and rhs.device == dense.device
        and dense.dim() >= 2
        and rhs.dim() >= 2
        and rhs.shape[-1] >= 2
        and rhs.shape[-2] == dense.shape[-1]
        and torch.broadcast_shapes(dense.shape[:-2], rhs.shape[:-2]) == dense.shape[:-2]
        and native.compiler() is not None
    )


def dense_matmul(dense: Tensor, rhs: Tensor) -> Tensor:
    """``dense @ rhs`` for ``dense`` ``(..., N, M)`` and ``rhs`` ``(..., M, C)`` (see :func:`supports_dense_matmul`).

    Example:
        >>> import torch
        >>> k, v = torch.rand(50, 40, dtype=torch.float64), torch.rand(40, 3, dtype=torch.float64)
        >>> torch.allclose(dense_matmul(k, v), k @ v)
        True
    """
    if not supports_dense_matmul(dense, rhs):
        raise ValueError(
            f"dense_matmul: expected CPU float32/float64 dense (..., N, M) and rhs (..., M, C >= 2) of its dtype and "
            f"at most its batch; got dense {tuple(dense.shape)} {dense.dtype}, rhs {tuple(rhs.shape)} {rhs.dtype}"
        )
    batch = dense.shape[:-2]
    n, m, c = dense.shape[-2], dense.shape[-1], rhs.shape[-1]
    k = dense.detach().contiguous()
    vt = rhs.detach().expand(*batch, m, c).mT.contiguous()
    out = dense.new_empty(*batch, n, c)
    fn = native.load_file(_SOURCE, "lk_dense_matmul", _ARGTYPES, {"LK_REAL": DTYPES[dense.dtype]})
    fn(k.data_ptr(), vt.data_ptr(), out.data_ptr(), batch.numel(), n, m, c, threads(k.numel() * c))
    return out
