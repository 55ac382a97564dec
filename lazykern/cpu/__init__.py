r"""lazykern's own CPU reduction engine: kernel formulas compiled to vectorized C.

KeOps' CPU code vectorizes along the feature axis inside each pair, which fits 8- or 16-wide
vectors badly for :math:`d = 26`. This engine traces a formula into an expression graph
(``lazykern.compiler.trace``), differentiates it symbolically (``lazykern.compiler.grad``),
generates one C loop nest per pass that vectorizes *across pairs* (``lazykern.cpu.codegen``),
and compiles it once per structure into its own cache folder, under its own settings
(``LAZYKERN_CPU_FLAGS``, ``LAZYKERN_CPU_CACHE``, ``CXX``: :mod:`lazykern.native`). It is the C
target of lazykern's compiler (``lazykern.compiler``); the GPU target is :mod:`lazykern.triton`.

Functions (same shapes as :mod:`lazykern.backend`): :func:`matmul`, :func:`dense`,
:func:`symmetric_gradients` and :func:`supports`; :func:`dense_matmul` multiplies a stored dense
matrix by a few columns (CG's products on the dense cache). ``ENGINE`` is the engine as the chooser
lists it (:class:`lazykern.engine.Engine`, a :class:`lazykern.compiler.driver.CompiledEngine` of
the C target).

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> from lazykern import cpu
    >>> x = torch.randn(200, 3, dtype=torch.float64)
    >>> f = StationaryFormula("rbf", additive=True)
    >>> s = torch.ones(1, 3, dtype=torch.float64)
    >>> cpu.supports(f, x, x, {"scales": s})
    True
    >>> cpu.matmul(f, x, x, {"scales": s}, torch.ones(200, 4, dtype=torch.float64)).shape
    torch.Size([200, 4])
"""

from .dense_matmul import dense_matmul, supports_dense_matmul
from .reductions import ENGINE, dense, matmul, supports, symmetric_gradients

__all__ = ["ENGINE", "dense", "dense_matmul", "matmul", "supports", "supports_dense_matmul", "symmetric_gradients"]
