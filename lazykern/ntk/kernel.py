"""The empirical NTK of a fixed network as a GPyTorch kernel."""

from __future__ import annotations

from typing import Any

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from .operator import BACKENDS, NTKOperator, empirical_ntk

__all__ = ["NTKKernel"]


class NTKKernel(Kernel):
    r"""GPyTorch kernel :math:`k(x, x') = \sum_o \Theta_{oo}(x, x')`, the trace NTK of a fixed network.

    .. math::

        k(x, x') = \sum_{o=1}^{k} \big\langle \nabla_\theta f_o(x), \nabla_\theta f_o(x') \big\rangle

    The network is held by reference, not registered as a submodule: its weights are not kernel
    hyperparameters, so optimizing a GP's hyperparameters never trains the network. Inputs are
    ``(n, d)`` (one sample per row, as GPyTorch kernels expect); products go through
    :func:`~lazykern.ntk.empirical_ntk` with ``mode="trace"``.

    Args:
        model: the network, mapping ``(batch, d)`` to ``(batch, ...)``.
        backend: as in :func:`~lazykern.ntk.empirical_ntk`.
        **kwargs: passed to :class:`gpytorch.kernels.Kernel`.

    Example:
        >>> import torch, gpytorch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
        >>> kernel = gpytorch.kernels.ScaleKernel(NTKKernel(net))
        >>> x = torch.randn(20, 2, dtype=torch.float64)
        >>> kernel(x).to_dense().shape
        torch.Size([20, 20])
    """

    has_lengthscale = False

    def __init__(self, model: nn.Module, *, backend: str = "auto", **kwargs: Any) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        super().__init__(**kwargs)
        self._network = (model,)  # a tuple, so nn.Module does not register it
        self.backend = backend

    @property
    def model(self) -> nn.Module:
        return self._network[0]

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params: Any
    ) -> Tensor | NTKOperator:
        if last_dim_is_batch or x1.dim() != 2 or x2.dim() != 2:
            raise ValueError(
                f"NTKKernel expects (n, d) inputs without batch dimensions, got {tuple(x1.shape)} and {tuple(x2.shape)}"
            )
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        op = empirical_ntk(self.model, x1, None if same else x2, mode="trace", backend=self.backend)
        return op.diagonal() if diag else op
