r"""The Triton engine as the chooser lists it: the compiler's Triton target.

It evaluates a formula (:meth:`~lazykern.compiler.driver.CompiledEngine.supports`) where the
engine runs at all (:meth:`~lazykern.compiler.driver.CompiledEngine.available`: Triton installed,
and a CUDA device or Triton's interpreter, ``TRITON_INTERPRET=1``), the tensors are on one CUDA
device (on the CPU under the interpreter), and the compiler plans the formula on them
(:func:`lazykern.compiler.plan.product_plan`: one dtype, float32 or float64, broadcastable batch
shapes, operations the targets generate). Nothing is compiled to answer. Products, dense blocks
and the fused gradient of :math:`K(X, X)` are the driver's
(:class:`~lazykern.compiler.driver.CompiledEngine` with the Triton target,
``lazykern.triton.reductions.TARGET``), the same contract as the CPU engine's.

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> x = torch.randn(20, 3, dtype=torch.float64)
    >>> plan = ENGINE.supports(StationaryFormula("rbf"), x, x, {})
    >>> bool(plan) == ENGINE.available()  # CPU tensors: the interpreter's
    True
    >>> if plan:  # a GPU, or the interpreter on CPU tensors
    ...     out = ENGINE.matmul(StationaryFormula("rbf"), x, x, {}, torch.ones(20, 2, dtype=torch.float64), plan)
    ...     assert out.shape == (20, 2)
"""

from __future__ import annotations

from ..compiler.driver import CompiledEngine
from .reductions import TARGET

__all__ = ["ENGINE"]

#: The Triton engine, as the chooser (:mod:`lazykern.backend`) lists it.
ENGINE = CompiledEngine("triton", TARGET)
