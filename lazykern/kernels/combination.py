"""Products of kernels that stay one lazy formula."""

from __future__ import annotations

import copy
import functools
import operator
from typing import cast

import gpytorch
import torch
from linear_operator import to_linear_operator
from linear_operator.operators import LinearOperator
from torch import Tensor

from gpytorch.kernels import Kernel

from ..operators import LazyKernelOperator

__all__ = ["LazyKernelMixin", "ProductKernel"]


class LazyKernelMixin:
    """Mixin of every lazykern kernel: ``kernel * other`` is a :class:`ProductKernel`, which
    evaluates lazykern factors as one formula also when ``x1`` differs from ``x2`` (GPyTorch's
    ``ProductKernel`` makes those dense). Sums need nothing: GPyTorch's ``AdditiveKernel`` adds the
    operators, and lazykern operators add into one formula.

    It lives beside :class:`ProductKernel`, which it builds and which is itself a lazykern kernel
    (so products of products flatten).

    Example:
        >>> import lazykern
        >>> kernel = lazykern.RBFKernel() * lazykern.MaternKernel() * lazykern.RQKernel()
        >>> type(kernel).__name__, len(kernel.kernels)
        ('ProductKernel', 3)
    """

    def __mul__(self, other: Kernel) -> Kernel:
        kernels = []
        for k in (self, other):
            kernels += list(k.kernels) if isinstance(k, gpytorch.kernels.ProductKernel) else [k]
        return ProductKernel(*kernels)


class ProductKernel(LazyKernelMixin, gpytorch.kernels.ProductKernel):
    r"""The elementwise product of kernels, :math:`k(x, x') = \prod_m k_m(x, x')`.

    ``lazykern_kernel * other`` builds it. When every factor evaluates to a lazykern operator
    (lazykern kernels, also inside ``ScaleKernel``), the product is **one** lazy formula on the
    factors' inputs side by side (:class:`lazykern.formulas.composite.Combination`), for ``K(X, X)`` and
    for ``K(X, Z)`` alike. GPyTorch's own ``ProductKernel`` would represent ``K(X, X)`` through
    root decompositions of the factors (with jitter) and make ``K(X, Z)`` dense. With other
    factors it behaves exactly as GPyTorch's.

    Args:
        kernels: the factors.

    Example:
        >>> import torch, lazykern
        >>> kernel = lazykern.RBFKernel() * lazykern.PeriodicKernel()
        >>> type(kernel).__name__
        'ProductKernel'
        >>> x, z = torch.randn(30, 2), torch.randn(20, 2)
        >>> type(kernel(x, z).evaluate_kernel()).__name__, kernel(x, z).shape
        ('LazyKernelOperator', torch.Size([30, 20]))
    """

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor | LinearOperator:
        if not diag:
            with gpytorch.settings.lazily_evaluate_kernels(False):
                factors = [to_linear_operator(k(x1, x2, **params)) for k in self.kernels]
            if all(isinstance(f, LazyKernelOperator) for f in factors):
                return functools.reduce(operator.mul, factors)
        return super().forward(x1, x2, diag=diag, **params)

    def expand_batch(self, *sizes: torch.Size | tuple[int, ...] | int) -> "ProductKernel":
        """A copy whose factors are expanded to the batch shape ``sizes`` (GPyTorch's generic
        ``expand_batch`` leaves the factors of a product unexpanded)."""
        if len(sizes) == 1 and not isinstance(sizes[0], int):
            shape = torch.Size(sizes[0])
        else:  # one int per dimension
            shape = torch.Size(cast("tuple[int, ...]", sizes))
        new = copy.deepcopy(self)
        new.kernels = torch.nn.ModuleList([k.expand_batch(shape) for k in self.kernels])
        return new
