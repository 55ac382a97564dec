r"""lazykern's Triton engine: kernel formulas compiled to Triton kernels, for GPUs.

The second target of lazykern's compiler (``lazykern.compiler``): the formula is traced and
differentiated symbolically exactly as for the CPU engine, the same passes are planned
(``lazykern.compiler.plan``, ``lazykern.compiler.driver``), and each pass becomes one
``@triton.jit`` kernel (``lazykern.triton.codegen``) over tiles of ``BLOCK_N x BLOCK_M`` pairs,
generated into a cache folder and imported (``lazykern.triton.build``). Triton ships with
every CUDA build of torch and needs no CUDA toolkit; ``TRITON_INTERPRET=1`` (set before triton is
imported) runs the same kernels on CPU tensors, which is how the engine is tested without a GPU.

The package's face is ``ENGINE`` (:mod:`lazykern.triton.engine`), the engine as the chooser lists
it, with the contract of every engine (:class:`lazykern.engine.Engine`). Diagonals and gathered
entries are not passes over pairs: :func:`lazykern.backend.elementwise` evaluates them, O(N D),
on any device. Importing this package does not import triton.

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> from lazykern import triton as lk_triton
    >>> x = torch.randn(20, 3, dtype=torch.float64)
    >>> bool(lk_triton.ENGINE.supports(StationaryFormula("rbf"), x, x, {})) == lk_triton.ENGINE.available()
    True
"""

from .engine import ENGINE

__all__ = ["ENGINE"]
