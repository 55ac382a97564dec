r"""The CPU engine's public functions: products, dense blocks and fused gradients of a formula.

Each function traces the formula once per structure (``lazykern.compiler.trace``), differentiates
it symbolically where gradients are asked for (``lazykern.compiler.grad``), generates and compiles
one reduction per pass (``lazykern.cpu.codegen``, :mod:`lazykern.native`) and runs it on
the tensors. Shapes follow :mod:`lazykern.backend`: ``x1`` ``(..., N, D1)``, ``x2``
``(..., M, D2)``, parameters ``(..., 1, K)``, right-hand sides ``(..., M, C)``; batch dimensions
broadcast.

Which passes a product, a dense block or the fused gradient runs is decided once for every target
(:mod:`lazykern.compiler.driver`); this module is the C target's side of it (:data:`TARGET`: the
inner side's buffer layout and the launches) and the CPU engine (:data:`ENGINE`).

Each backward pass evaluates the kernel's exponentials once per pair for all its outputs (KeOps'
autodiff runs one reduction per differentiated variable).
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from typing import Mapping

import torch
from torch import Tensor

from ..compiler import driver
from ..compiler.driver import Buffer, CompiledEngine, Target, flat_buffer
from ..compiler.plan import Reduction, plannable, unsupported
from ..compiler.programs import Programs
from ..formulas import Formula
from ..native import compiler, load_source
from .codegen import generate

__all__ = ["ENGINE", "TARGET", "load", "matmul", "dense", "symmetric_gradients", "supports", "threads"]

# Dimension-major rows are padded to a multiple of this many entries (64-byte aligned rows).
_ALIGN = 16
#: Pairs (or multiply-adds) per thread at least: see :func:`threads`.
WORK_PER_THREAD = 1 << 15

_REDUCE_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 6
_programs = Programs()  # by Reduction: its source is generated once


def load(red: Reduction) -> ctypes._CFuncPtr:
    """The compiled function of ``red`` (generated and compiled on first use, then cached on disk
    and in memory: :func:`lazykern.native.load_source`)."""
    return _programs.get(red, lambda: load_source(generate(red), "lk_reduce", _REDUCE_ARGTYPES))


# ---------------------------------------------------------------------------- the C target
class CTarget(Target):
    """The C target: inner points dimension-major and padded for the vector loops; each pass one
    compiled C function (:func:`load`) called through ``ctypes``."""

    title = "lazykern's CPU engine"

    def supports(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
        return supports(formula, x1, x2, params)

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
#: The CPU engine, as the chooser (:mod:`lazykern.backend`) lists it.
ENGINE = CompiledEngine("cpu", TARGET)


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


# ---------------------------------------------------------------------------- public API
def supports(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
    """Whether the CPU engine evaluates ``formula`` on these tensors (else use KeOps or torch).

    True when: the tensors are on the CPU, all float32 or all float64, with broadcastable batch
    shapes; the platform is Linux on x86-64 with a C++ compiler; and the formula traces into
    operations the engine generates (see ``lazykern.compiler.trace``) with one value per pair.
    Nothing is compiled.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(10, 3, dtype=torch.float64)
        >>> supports(StationaryFormula("rbf"), x, x, {})
        True
    """
    if not all(isinstance(t, Tensor) and t.device.type == "cpu" for t in [x1, x2, *params.values()]):
        return False
    return _platform_ok() and plannable(formula, x1, x2, params)


@functools.lru_cache(maxsize=1)
def _platform_ok() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64") and compiler() is not None


def matmul(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
    r""":math:`K(x_1, x_2)\, V` without storing :math:`K`, differentiable in ``x1``, ``x2``, ``rhs``
    and every parameter.

    .. math::

        (K V)_{ic} = \sum_j k(x^{(1)}_i, x^{(2)}_j)\, V_{jc}

    Args:
        formula: a kernel formula (:mod:`lazykern.formulas`) with one value per pair.
        x1: ``(..., N, D1)`` inputs (rows of the result).
        x2: ``(..., M, D2)`` inputs.
        params: tensor parameters, each ``(..., 1, K)``.
        rhs: ``(..., M, C)`` (or ``(M,)``, giving ``(N,)``).

    Raises ``ValueError`` when :func:`supports` is false.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(100, 3, dtype=torch.float64)
        >>> matmul(StationaryFormula("rbf"), x, x, {}, torch.ones(100, 2, dtype=torch.float64)).shape
        torch.Size([100, 2])
    """
    driver.require_support(TARGET, formula, x1, x2, params)
    return driver.matmul(TARGET, formula, x1, x2, params, rhs)


def dense(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor:
    r"""The ``(..., N, M)`` matrix :math:`K_{ij} = k(x^{(1)}_i, x^{(2)}_j)`, computed row by row in
    one pass (nothing ``N x M x D``), differentiable in ``x1``, ``x2`` and every parameter.

    Args:
        formula: a kernel formula with one value per pair.
        x1: ``(..., N, D1)``.
        x2: ``(..., M, D2)``.
        params: tensor parameters, each ``(..., 1, K)``.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(50, 3, dtype=torch.float64)
        >>> K = dense(StationaryFormula("rbf"), x, x, {})
        >>> torch.allclose(K.diagonal(), torch.ones(50, dtype=torch.float64))
        True
    """
    driver.require_support(TARGET, formula, x1, x2, params)
    return driver.dense(TARGET, formula, x1, x2, params)


def symmetric_gradients(
    formula: Formula, x: Tensor, params: Mapping[str, Tensor], left: Tensor, right: Tensor
) -> tuple[Tensor | None, dict[str, Tensor | None]]:
    r"""Gradients of :math:`S = \sum_{ij} \langle l_i, r_j\rangle\, k(x_i, x_j)` with respect to
    ``x`` (both occurrences) and each parameter, in ONE pass over the pairs.

    .. math::

        \frac{\partial S}{\partial x_i} = \sum_j \langle l_i, r_j\rangle \partial_1 k(x_i, x_j)
        + \langle l_j, r_i\rangle \partial_2 k(x_j, x_i),

    where for a symmetric formula (``formula.symmetric``: :math:`k(u, v) = k(v, u)`) the second
    derivative is the first, so :math:`k` is evaluated once per pair. Same contract as
    :func:`lazykern.backend.symmetric_gradients`: the gradient for ``x`` is ``None`` unless ``x``
    requires grad, and so is each parameter's.

    Args:
        formula: a kernel formula with one value per pair.
        x: ``(..., N, D)``.
        params: tensor parameters, each ``(..., 1, K)``.
        left: ``(..., N, C)``, the :math:`l_i`.
        right: ``(..., N, C)``, the :math:`r_j`.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(20, 3, dtype=torch.float64, requires_grad=True)
        >>> v = torch.randn(20, 1, dtype=torch.float64)
        >>> gx, _ = symmetric_gradients(StationaryFormula("rbf"), x, {}, v, v)
        >>> gx.shape
        torch.Size([20, 3])
    """
    driver.require_support(TARGET, formula, x, x, params)
    return driver.symmetric_gradients(TARGET, formula, x, params, left, right)
