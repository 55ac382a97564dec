r"""The chunked torch engine: a formula evaluated densely in row blocks, differentiable to any order.

The package's face is ``ENGINE`` (:mod:`lazykern.torch_engine.engine`), the engine as the chooser
lists it (:class:`lazykern.engine.Engine`): the engine of small problems, of formulas that multiply
matrices (the NTK's, which BLAS does best) and of the dense blocks of engines that have none.

Example:
    >>> from lazykern import torch_engine
    >>> torch_engine.ENGINE
    <lazykern engine 'torch'>
"""

from .engine import ENGINE

__all__ = ["ENGINE"]
