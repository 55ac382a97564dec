r"""The C target of lazykern's compiler: each pass of a product, a dense block or a fused gradient as compiled C.

The formula is traced once per structure (``lazykern.compiler.trace``), differentiated
symbolically where gradients are asked for (``lazykern.compiler.grad``), and each pass is generated
(``lazykern.cpu.codegen``), compiled (:mod:`lazykern.native`) and run on the tensors. Which passes
a product, a dense block or the fused gradient runs is decided once for every target
(:mod:`lazykern.compiler.driver`); this module is the C target's side of it (:data:`TARGET`: the
inner side's buffer layout and the launches), which the CPU engine
(:mod:`lazykern.cpu.engine`) runs.

Each backward pass evaluates the kernel's exponentials once per pair for all its outputs (KeOps'
autodiff runs one reduction per differentiated variable).
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from _ctypes import CFuncPtr  # ctypes' class of a loaded C function (ctypes._CFuncPtr), by its public name
from typing import Mapping

import torch
from torch import Tensor

from ..compiler.driver import Buffer, Target, flat_buffer
from ..compiler.plan import Reduction, unsupported
from ..compiler.programs import Programs
from ..formulas import Formula
from ..native import compiler, load_source
from .codegen import generate

__all__ = ["TARGET", "load", "threads"]

# Dimension-major rows are padded to a multiple of this many entries (64-byte aligned rows).
_ALIGN = 16
#: Pairs (or multiply-adds) per thread at least: see :func:`threads`.
WORK_PER_THREAD = 1 << 15

_REDUCE_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 6
_programs = Programs()  # by Reduction: its source is generated once


def load(red: Reduction) -> CFuncPtr:
    """The compiled function of ``red`` (generated and compiled on first use, then cached on disk
    and in memory: :func:`lazykern.native.load_source`)."""
    return _programs.get(red, lambda: load_source(generate(red), "lk_reduce", _REDUCE_ARGTYPES))


# ---------------------------------------------------------------------------- the C target
class CTarget(Target):
    """The C target: inner points dimension-major and padded for the vector loops; each pass one
    compiled C function (:func:`load`) called through ``ctypes``."""

    title = "lazykern's CPU engine"

    def available(self) -> bool:
        """Linux on x86-64 with a C compiler (:func:`lazykern.native.compiler`)."""
        return _platform_ok()

    def accepts(self, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
        """Tensors on the CPU (their dtypes and the formula are the plan's business)."""
        return all(isinstance(t, Tensor) and t.device.type == "cpu" for t in [x1, x2, *params.values()])

    def unsupported(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
        reason = unsupported(formula, x1, x2, params)  # what the formula does that the engine lacks
        if reason is not None:
            return f"{self.title} cannot evaluate this formula: {reason}"
        return (
            f"{self.title} needs CPU tensors of one dtype (float32 or float64) with broadcastable "
            f"batch shapes on Linux x86-64 with g++; got x1 {x1.dtype} on {x1.device}, x2 {x2.dtype} on "
            f"{x2.device}, params {[(n, p.dtype, tuple(p.shape)) for n, p in params.items()]}"
        )

    def inner_buffer(self, t: Tensor, batch: torch.Size, nb: int) -> Buffer:
        """Inner points ``(..., M, W)`` as dimension-major ``(nb', W, mp)`` rows, zero-padded to
        ``mp`` (a multiple of 16 entries: 64-byte aligned rows for the vector loops)."""
        base, stride, count = flat_buffer(t, batch, nb)
        base = base.reshape(count, *t.shape[-2:])
        out = base.new_zeros(count, t.shape[-1], _padded(t.shape[-2]))
        out[:, :, : t.shape[-2]] = base.transpose(-1, -2)
        return out, (out[0].numel() if stride else 0)

    def inner_vectors(self, t: Tensor, batch: torch.Size, nb: int) -> Buffer:
        """Column arrays over the inner points, laid out as the points themselves."""
        return self.inner_buffer(t, batch, nb)

    def launch(self, red: Reduction, buffers: dict[str, Buffer], nb: int, n: int, m: int, c: int) -> None:
        fn = load(red)
        roles = red.operands()
        ptrs = (ctypes.c_void_p * len(roles))(*[buffers[r][0].data_ptr() for r in roles])
        strides = (ctypes.c_int64 * len(roles))(*[buffers[r][1] for r in roles])
        fn(ptrs, strides, nb, n, m, _padded(m), c, threads(nb * n * m))


#: The C target, as the driver (:mod:`lazykern.compiler.driver`) receives it.
TARGET = CTarget()


def threads(work: int) -> int:
    """The threads of one compiled loop over ``work`` pairs (or multiply-adds): torch's thread count,
    but one thread per :data:`WORK_PER_THREAD` at most, since waking a thread costs more than a
    small reduction (tens of milliseconds on a loaded machine).

    Example:
        >>> threads(1000), threads(10**9) == torch.get_num_threads()
        (1, True)
    """
    return max(1, min(torch.get_num_threads(), work // WORK_PER_THREAD))


def _padded(m: int) -> int:
    return max(_ALIGN, -(-m // _ALIGN) * _ALIGN)


@functools.lru_cache(maxsize=1)
def _platform_ok() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64") and compiler() is not None
