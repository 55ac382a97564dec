"""The empirical NTK of a fixed network as a GPyTorch kernel."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from ..validation import check_choice
from .operator import BACKENDS, NTKOperator, make_operator

__all__ = ["NTKKernel"]


class _NetworkReference:
    """Holds the network out of ``nn.Module``'s registry; copies of the kernel (``copy.deepcopy``,
    ``kernel[i]``, ``expand_batch``, a GP's fantasy model) share the network instead of cloning it."""

    __slots__ = ("module",)

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __deepcopy__(self, memo: dict) -> "_NetworkReference":
        return self


def _indexed_batch_shape(batch_shape: torch.Size, index: tuple) -> torch.Size:
    """The batch shape left after ``index`` is applied to batch dimensions ``batch_shape``, the way
    GPyTorch's ``Kernel.__getitem__`` reads it off an indexed parameter of shape ``(*batch_shape, 1, 1)``."""
    probe = torch.empty(*batch_shape, 1, 1)
    indexed = probe[index]
    return indexed.shape[: len(batch_shape) - (probe.dim() - indexed.dim())]


class NTKKernel(Kernel):
    r"""GPyTorch kernel :math:`k(x, x') = \sum_o \Theta_{oo}(x, x')`, the trace NTK of a fixed network.

    .. math::

        k(x, x') = \sum_{o=1}^{k} \big\langle \nabla_\theta f_o(x), \nabla_\theta f_o(x') \big\rangle

    The network is held by reference, not registered as a submodule: its weights are not kernel
    hyperparameters, so optimizing a GP's hyperparameters never trains the network (and never
    touches its ``.grad``); copies of the kernel (``copy.deepcopy``, ``kernel[i]``,
    ``expand_batch``) share the same network. Inputs are ``(..., n, d)``, one sample per row and any
    batch dimensions; gradients flow to the inputs (e.g. for input optimization through a GP).
    Products go through :func:`~lazykern.ntk.empirical_ntk` with ``mode="trace"``.

    A ``batch_shape`` (as for a batched GP, several outputs sharing one network) broadcasts with the
    inputs' batch dimensions, as every GPyTorch kernel's does: ``NTKKernel(net,
    batch_shape=torch.Size([2]))(x)`` is ``(2, n, n)`` for ``x`` of shape ``(n, d)``, the same kernel
    in each batch element, and ``kernel[0]`` is the unbatched kernel.

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
        >>> batched = NTKKernel(net, batch_shape=torch.Size([2]))
        >>> batched(x[0]).shape, batched[0].batch_shape
        (torch.Size([2, 20, 20]), torch.Size([]))
    """

    has_lengthscale = False

    def __init__(
        self, model: nn.Module, *, backend: str = "auto", forms: str | Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        check_choice("backend", backend, BACKENDS)
        super().__init__(**kwargs)
        self._network = _NetworkReference(model)
        self.backend, self.forms = backend, forms

    @property
    def model(self) -> nn.Module:
        return self._network.module

    def __getitem__(self, index: Any) -> "NTKKernel":
        # GPyTorch reads the new batch shape off the indexed parameters, and this kernel has none.
        new_kernel = super().__getitem__(index)
        if new_kernel is not self:
            index = index if isinstance(index, tuple) else (index,)
            new_kernel.batch_shape = _indexed_batch_shape(self.batch_shape, index)
        return new_kernel

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
        # The kernel's own batch shape broadcasts with the inputs' (expanded views, nothing copied).
        batch = torch.broadcast_shapes(self.batch_shape, x1.shape[:-2], x2.shape[:-2])
        x1 = x1.expand(*batch, *x1.shape[-2:])
        x2 = x1 if same else x2.expand(*batch, *x2.shape[-2:])
        op = make_operator(self.model, x1, None if same else x2, mode="trace", backend=self.backend, forms=self.forms,
                           sample_ndim=1)
        return op.diagonal() if diag else op
