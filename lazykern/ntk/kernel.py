"""The empirical NTK of a fixed network as a GPyTorch kernel."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from .operator import BACKENDS, NTKOperator, make_operator

__all__ = ["NTKKernel"]


class NTKKernel(Kernel):
    r"""GPyTorch kernel :math:`k(x, x') = \sum_o \Theta_{oo}(x, x')`, the trace NTK of a fixed network.

    .. math::

        k(x, x') = \sum_{o=1}^{k} \big\langle \nabla_\theta f_o(x), \nabla_\theta f_o(x') \big\rangle

    The network is held by reference, not registered as a submodule: its weights are not kernel
    hyperparameters, so optimizing a GP's hyperparameters never trains the network (and never
    touches its ``.grad``). Inputs are ``(..., n, d)``, one sample per row and any batch
    dimensions; gradients flow to the inputs (e.g. for input optimization through a GP). Products
    go through :func:`~lazykern.ntk.empirical_ntk` with ``mode="trace"``.

    Args:
        model: the network, mapping ``(batch, d)`` to ``(batch, ...)``.
        backend: as in :func:`~lazykern.ntk.empirical_ntk`.
        forms: as in :func:`~lazykern.ntk.empirical_ntk`.
        **kwargs: passed to :class:`gpytorch.kernels.Kernel`.

    Example:
        >>> import torch, gpytorch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()
        >>> kernel = gpytorch.kernels.ScaleKernel(NTKKernel(net))
        >>> x = torch.randn(3, 20, 2, dtype=torch.float64)  # a batch of 3 sets of 20 inputs
        >>> kernel(x).to_dense().shape
        torch.Size([3, 20, 20])
    """

    has_lengthscale = False

    def __init__(
        self, model: nn.Module, *, backend: str = "auto", forms: str | Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        super().__init__(**kwargs)
        self._network = (model,)  # a tuple, so nn.Module does not register it
        self.backend, self.forms = backend, forms

    @property
    def model(self) -> nn.Module:
        return self._network[0]

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params: Any
    ) -> Tensor | NTKOperator:
        if last_dim_is_batch:
            raise ValueError("NTKKernel does not support last_dim_is_batch=True (the network sees whole input rows)")
        for name, x in (("x1", x1), ("x2", x2)):
            if not isinstance(x, Tensor) or x.dim() < 2:
                raise ValueError(f"{name} must be a tensor of shape (..., n, d), got {getattr(x, 'shape', type(x))}")
        same = x1 is x2 or (
            not (x1.requires_grad or x2.requires_grad) and x1.shape == x2.shape and torch.equal(x1, x2)
        )
        op = make_operator(self.model, x1, None if same else x2, mode="trace", backend=self.backend, forms=self.forms,
                           sample_ndim=1)
        return op.diagonal() if diag else op
