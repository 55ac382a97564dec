r"""lazykern's Triton engine: kernel formulas compiled to Triton kernels, for GPUs.

The second target of lazykern's compiler (``lazykern.compiler``): the formula is traced and
differentiated symbolically exactly as for the CPU engine, the same passes are planned
(``lazykern.compiler.plan``, ``lazykern.compiler.driver``), and each pass becomes one
``@triton.jit`` kernel (``lazykern.triton.codegen``) over tiles of ``BLOCK_N x BLOCK_M`` pairs,
generated into a cache folder and imported (``lazykern.triton.build``). Triton ships with
every CUDA build of torch and needs no CUDA toolkit; ``TRITON_INTERPRET=1`` (set before triton is
imported) runs the same kernels on CPU tensors, which is how the engine is tested without a GPU.

Functions (same shapes and contracts as :mod:`lazykern.cpu`): :func:`matmul`, :func:`dense`,
:func:`symmetric_gradients`, :func:`supports` and :func:`available`; ``ENGINE`` is the engine as
the chooser lists it. Diagonals and gathered
entries are not passes over pairs: :func:`lazykern.backend.elementwise` evaluates them, O(N D),
on any device. Importing this package does not import triton.

Example:
    >>> import torch
    >>> from lazykern.formulas import StationaryFormula
    >>> from lazykern import triton as lk_triton
    >>> x = torch.randn(20, 3, dtype=torch.float64)
    >>> lk_triton.supports(StationaryFormula("rbf"), x, x, {}) == lk_triton.available()
    True
"""

from .reductions import ENGINE, available, dense, matmul, supports, symmetric_gradients

__all__ = ["ENGINE", "available", "dense", "matmul", "supports", "symmetric_gradients"]
