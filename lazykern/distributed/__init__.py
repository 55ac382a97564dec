r"""Kernel products, CG and GP training sharded over processes and GPUs with ``torch.distributed``.

:func:`shard` wraps any lazykern operator (a kernel matrix ``kernel(X)``, scaled or summed, or an
NTK operator) so that each rank computes one block of rows of every product and an ``all_gather``
assembles the result; :class:`ShardedKernel` does the same for every matrix a kernel returns. The
kernels and formulas underneath never see a process group. See :doc:`/distributed` for how to run
it (``torchrun``) and its scaling model.
"""

from .collectives import row_bounds
from .kernel import ShardedKernel
from .operator import ShardedOperator, shard

__all__ = ["ShardedKernel", "ShardedOperator", "row_bounds", "shard"]
