"""Any GPyTorch kernel whose kernel matrices are sharded over a process group."""

from __future__ import annotations

from typing import Any

import gpytorch
import torch.distributed as dist
from gpytorch.kernels import Kernel
from torch import Tensor

from .operator import ShardedOperator, shard

__all__ = ["ShardedKernel"]


class ShardedKernel(Kernel):
    r"""Wraps a kernel so that every kernel matrix it returns is :func:`~lazykern.distributed.shard`-ed.

    .. math::

        k_\text{sharded}(x, x') = k(x, x'), \qquad
        \big(K_\text{sharded} V\big)_{R_p} = K(X_{R_p}, X')\, V \text{ on rank } p

    The same kernel, the same hyperparameters (those of ``base_kernel``, trained as usual), only
    the products are split by rows over the ranks (see :class:`ShardedOperator`). Put it where a
    kernel goes: the covariance module of a GPyTorch ``ExactGP`` (training through the exact
    marginal likelihood and prediction, on every rank in lockstep) or
    :class:`lazykern.solvers.KernelRidge`. Diagonals (``diag=True``) are evaluated locally.

    Args:
        base_kernel: the kernel to shard (lazykern kernels, their ``ScaleKernel``/sums, the NTK kernel).
        group: a ``torch.distributed`` process group; ``None`` (default) means the default group at
            the time of each call.

    Example:
        >>> import torch, torch.distributed as dist, gpytorch, lazykern
        >>> from lazykern.distributed import ShardedKernel
        >>> if not dist.is_initialized():  # in real use: torchrun, and init_process_group on every rank
        ...     dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
        >>> x = torch.randn(500, 4, dtype=torch.float64)
        >>> y = x.sin().sum(-1)
        >>> kernel = ShardedKernel(gpytorch.kernels.ScaleKernel(lazykern.RBFKernel(ard_num_dims=4))).double()
        >>> model = lazykern.KernelRidge(kernel, alpha=1e-2, rank=50).fit(x, y)
        >>> model.predict(x[:3]).shape
        torch.Size([3])
        >>> dist.destroy_process_group()  # the example's own group: later code starts without one
    """

    def __init__(self, base_kernel: Kernel, group: dist.ProcessGroup | None = None) -> None:
        if not isinstance(base_kernel, Kernel):
            raise TypeError(f"base_kernel must be a gpytorch.kernels.Kernel, got {type(base_kernel).__name__}")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, got {type(group).__name__}")
        super().__init__()
        self.base_kernel = base_kernel
        self.group = group

    @property
    def is_stationary(self) -> bool:
        return self.base_kernel.is_stationary

    def num_outputs_per_input(self, x1: Tensor, x2: Tensor) -> int:
        return self.base_kernel.num_outputs_per_input(x1, x2)

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params: Any
    ) -> ShardedOperator | Tensor:
        with gpytorch.settings.lazily_evaluate_kernels(False):
            out = self.base_kernel(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params)
        return out if diag else shard(out, group=self.group)

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        return self.base_kernel.prediction_strategy(train_inputs, train_prior_dist, train_labels, likelihood)
