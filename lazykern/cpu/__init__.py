r"""lazykern's own CPU reduction engine: kernel formulas compiled to vectorized C.

KeOps' CPU code vectorizes along the feature axis inside each pair, which fits 8- or 16-wide
vectors badly for :math:`d = 26`. This engine traces a formula into an expression graph
(``lazykern.compiler.trace``), differentiates it symbolically (``lazykern.compiler.grad``),
generates one C loop nest per pass that vectorizes *across pairs* (``lazykern.cpu.codegen``),
and compiles it once per structure into its own cache folder, under its own settings
(``LAZYKERN_CPU_FLAGS``, ``LAZYKERN_CPU_CACHE``, ``CXX``: :mod:`lazykern.native`). It is the C
target of lazykern's compiler (``lazykern.compiler``, ``lazykern.cpu.reductions``); the GPU
target is :mod:`lazykern.triton`.

The package's face is ``ENGINE`` (:mod:`lazykern.cpu.engine`), the engine as the chooser lists it
(:class:`lazykern.engine.Engine`): products, dense blocks and fused gradients of a formula, and the
products of a stored dense matrix by a few columns (:mod:`lazykern.cpu.dense_matmul`, CG's
products on the dense cache).

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> from lazykern import cpu
    >>> x = torch.randn(200, 3, dtype=torch.float64)
    >>> f = StationaryFormula("rbf", additive=True)
    >>> s = torch.ones(1, 3, dtype=torch.float64)
    >>> bool(cpu.ENGINE.supports(f, x, x, {"scales": s}))
    True
    >>> cpu.ENGINE.matmul(f, x, x, {"scales": s}, torch.ones(200, 4, dtype=torch.float64)).shape
    torch.Size([200, 4])
"""

from .engine import ENGINE

__all__ = ["ENGINE"]
