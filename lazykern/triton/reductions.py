r"""The Triton target of lazykern's compiler: each pass of a product, a dense block or a fused gradient as a Triton kernel.

The same compiler as the CPU engine's: the passes are planned once per structure
(:mod:`lazykern.compiler.plan`: trace, symbolic derivative, outputs), the autograd side is shared
(:mod:`lazykern.compiler.driver`), and this module is the Triton target's side of it
(:data:`TARGET`: buffers in the layouts of :mod:`lazykern.triton.codegen` and launches of the
kernels :mod:`lazykern.triton.build` loads), which the Triton engine (:mod:`lazykern.triton.engine`)
runs. Memory: the inputs, the outputs and one tile of registers per program, O((N + M) D); nothing
of size N x M exists except a dense block asked for.

Tiles: :data:`BLOCK` x :data:`BLOCK` pairs per program and step, and column blocks of
:func:`_column_block`.
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Mapping

import torch
from torch import Tensor

from ..compiler.driver import Buffer, Target, row_buffer
from ..compiler.plan import Reduction, unsupported
from ..formulas import Formula
from . import build

__all__ = ["TARGET", "available"]

#: Rows and points of one tile, fixed because compiles grow steeply with the tile (ptxas unrolls every
#: op over a thread's share of it; measured: docs/triton.rst, "The kernels"), so Triton's autotuner,
#: which compiles every candidate, is not used. Not yet timed on a GPU. Under the interpreter one
#: tile covers the tests' sizes (its cost is per operation and program). ``tl.dot`` needs 16 at
#: least on each axis.
BLOCK = 32
#: Warps per program: 8 (4 entries of a tile per thread) compiles faster than 4 (measured:
#: docs/triton.rst, "The kernels").
NUM_WARPS = 8


def available() -> bool:
    """Whether the Triton engine can run here: Triton is installed, and either a CUDA device is
    present or Triton's interpreter is on (``TRITON_INTERPRET=1``: the kernels run on CPU tensors).

    Example:
        >>> isinstance(available(), bool)
        True
    """
    if importlib.util.find_spec("triton") is None:
        return False
    return build.interpreted() or torch.cuda.is_available()


def _device_ok(t: Tensor, device: torch.device) -> bool:
    """On ``device`` (one kernel reads every buffer on one device), a CUDA one or the interpreter's CPU."""
    return t.device == device and t.device.type == ("cpu" if build.interpreted() else "cuda")


def _column_block(c: int) -> int:
    """Columns of one ``tl.dot`` block: the column count rounded up to a power of two, 16 to 64 (a
    product of more columns runs one program per block of them)."""
    return min(64, max(16, 1 << (max(c, 1) - 1).bit_length()))


class TritonTarget(Target):
    """The Triton target: one ``@triton.jit`` kernel per pass (:func:`lazykern.triton.build.load`)
    over tiles of :data:`BLOCK` x :data:`BLOCK` pairs."""

    title = "lazykern's Triton engine"

    def available(self) -> bool:
        return available()

    def accepts(self, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
        """Tensors on one CUDA device (on the CPU under ``TRITON_INTERPRET=1``, the interpreter's)."""
        return all(isinstance(t, Tensor) and _device_ok(t, x1.device) for t in [x1, x2, *params.values()])

    def unsupported(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
        if not available():
            return (
                f"{self.title} needs the triton package and a CUDA device (or TRITON_INTERPRET=1 "
                "set before triton is imported, to run on CPU tensors)"
            )
        reason = unsupported(formula, x1, x2, params)  # what the formula does that the engine lacks
        if reason is not None:
            return f"{self.title} cannot evaluate this formula: {reason}"
        device = "cpu (TRITON_INTERPRET=1)" if build.interpreted() else "cuda"
        return (
            f"{self.title} needs {device} tensors on one device, of one dtype (float32 or float64), "
            f"with broadcastable batch shapes; got x1 {x1.dtype} on {x1.device}, x2 {x2.dtype} on {x2.device}, "
            f"params {[(n, p.dtype, tuple(p.shape), str(p.device)) for n, p in params.items()]}"
        )

    def inner_buffer(self, t: Tensor, batch: torch.Size, nb: int) -> Buffer:
        """Inner points ``(..., M, W)`` dimension-major, ``(nb', W, M)``: loads along the points are
        contiguous."""
        return row_buffer(t.transpose(-1, -2), batch, nb)

    def inner_vectors(self, t: Tensor, batch: torch.Size, nb: int) -> Buffer:
        """Column arrays over the inner points ``(..., M, C)`` row-major, as ``tl.dot`` reads them."""
        return row_buffer(t, batch, nb)

    def launch(self, red: Reduction, buffers: dict[str, Buffer], nb: int, n: int, m: int, c: int) -> None:
        import triton
        import triton.language as tl

        kernel = build.load(red)
        roles = red.operands()
        bc = _column_block(c)
        column_blocks = triton.cdiv(c, bc) if red.matmul is not None else 1
        meta = dict(BLOCK_N=BLOCK, BLOCK_M=BLOCK, BLOCK_C=bc, DT=tl.float32 if red.dtype == "float" else tl.float64)
        if not build.interpreted():
            # No fused multiply-adds, as the C target (-ffp-contract=off): where a formula cancels (OAK's
            # terms at a collapsed lengthscale) fused roundings differ enough to overflow an expm1.
            meta.update(num_warps=NUM_WARPS, enable_fp_fusion=False)
        grid = (triton.cdiv(n, BLOCK), nb, column_blocks)
        if n and m and nb and column_blocks:
            tensors = [buffers[r][0] for r in roles]
            # Triton launches on the current CUDA device: make it the tensors' (a model on cuda:1).
            on_device = contextlib.nullcontext() if build.interpreted() else torch.cuda.device(tensors[0].device)
            with on_device:
                kernel[grid](*tensors, *[buffers[r][1] for r in roles], n, m, c, **meta)
        else:  # no pairs (or no columns): every sum is zero
            for r in roles:
                if r.startswith("out:"):
                    buffers[r][0].zero_()


#: The Triton target, as the driver (:mod:`lazykern.compiler.driver`) receives it.
TARGET = TritonTarget()

