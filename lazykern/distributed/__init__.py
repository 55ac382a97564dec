r"""Kernel products, CG and GP training sharded over processes and GPUs with ``torch.distributed``.

:func:`shard` wraps any lazykern operator (a kernel matrix ``kernel(X)``, scaled or summed, or an
NTK operator) so that each rank computes one block of rows of every product and an ``all_gather``
assembles the result; :class:`ShardedKernel` does the same for every matrix a kernel returns. The
kernels and formulas underneath never see a process group. See :doc:`/distributed` for how to run
it (``torchrun``) and its scaling model.
"""

import torch.distributed as _dist

if _dist.is_available():
    # Imported now, before any process group exists: its functions take ``group=group.WORLD`` as a
    # default evaluated at import, so imported after ``init_process_group`` (``torch.optim`` does,
    # through ``torch._dynamo``) they would hold the default group for the life of the process.
    # ``destroy_process_group`` then frees nothing: gloo's worker threads outlive the interpreter's
    # shutdown, where one still releasing a tensor aborts the process ("terminate called without an
    # active exception"; measured in docs/distributed.rst).
    import torch.distributed.nn.functional  # noqa: F401

from .collectives import row_bounds
from .kernel import ShardedKernel
from .operator import ShardedOperator, shard

__all__ = ["ShardedKernel", "ShardedOperator", "row_bounds", "shard"]
