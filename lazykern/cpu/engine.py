r"""The CPU engine as the chooser lists it: the compiler's C target, and CG's products of a stored dense matrix.

It evaluates a formula (:meth:`~lazykern.compiler.driver.CompiledEngine.supports`) when the
tensors are on the CPU, all float32 or all float64, with broadcastable batch shapes; the platform
is Linux on x86-64 with a C compiler; and the formula traces into operations the engine generates
(``lazykern.compiler.trace``) with one value per pair. Nothing is compiled to answer. Products,
dense blocks and the fused gradient of :math:`K(X, X)` are the driver's
(:class:`~lazykern.compiler.driver.CompiledEngine` with the C target,
``lazykern.cpu.reductions.TARGET``); the few-column products of a stored dense matrix are
:mod:`lazykern.cpu.dense_matmul`'s loop nest. Every program it runs is compiled by the C toolchain
(:mod:`lazykern.native`).

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> x = torch.randn(200, 3, dtype=torch.float64)
    >>> f, s = StationaryFormula("rbf", additive=True), {"scales": torch.ones(1, 3, dtype=torch.float64)}
    >>> plan = ENGINE.supports(f, x, x, s)
    >>> ENGINE.matmul(f, x, x, s, torch.ones(200, 4, dtype=torch.float64), plan).shape
    torch.Size([200, 4])
    >>> ENGINE.supports(f, x.half(), x.half(), s) is None
    True
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import native
from ..compiler.driver import CompiledEngine
from ..engine import ProgramCount
from .dense_matmul import dense_matmul, supports_dense_matmul
from .reductions import TARGET

__all__ = ["CPUEngine", "ENGINE"]


class CPUEngine(CompiledEngine):
    """The compiled C target (:class:`~lazykern.compiler.driver.CompiledEngine`), with the
    products of a stored dense matrix and the C toolchain's count of programs."""

    def dense_matmul(self, dense: Tensor, rhs: Tensor) -> Tensor | None:
        """The loop nest of :func:`lazykern.cpu.dense_matmul.dense_matmul` where it takes these
        tensors (:func:`~lazykern.cpu.dense_matmul.supports_dense_matmul`: CPU, 2 columns or more)."""
        return dense_matmul(dense, rhs) if supports_dense_matmul(dense, rhs) else None

    def program_count(self, device: torch.device) -> ProgramCount:
        """The C toolchain's folder and counts (:mod:`lazykern.native`); the structured engine's
        fixed sources, compiled by the same toolchain, are counted here too."""
        return ProgramCount((native.cache_folder(),), len(native.compile_log), native.loaded_programs())


#: The CPU engine, as the chooser (:mod:`lazykern.backend`) lists it.
ENGINE = CPUEngine("cpu", TARGET)
