"""From a GPyTorch-style stationary kernel to a formula, its inputs and its tensor parameters.

This is the bridge that lets lazykern's kernels *and* GPyTorch's own ``RBFKernel``,
``MaternKernel``, ``RQKernel`` and ``PeriodicKernel`` drive the same formulas with their own,
trainable hyperparameters.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..formulas import StationaryFormula
from ..formulas.stationary import MATERN_NUS
from ..operators import LazyKernelOperator
from ..validation import check_kernel_inputs

SUPPORTED_BASES = (
    gpytorch.kernels.RBFKernel,
    gpytorch.kernels.MaternKernel,
    gpytorch.kernels.RQKernel,
    gpytorch.kernels.PeriodicKernel,
)


def formula_for(kernel: Kernel, additive: bool) -> StationaryFormula:
    """The formula of a supported base kernel (raises ``TypeError`` for any other kernel)."""
    if isinstance(kernel, gpytorch.kernels.RBFKernel):
        return StationaryFormula("rbf", additive)
    if isinstance(kernel, gpytorch.kernels.MaternKernel):
        if kernel.nu not in MATERN_NUS:
            raise ValueError(f"nu must be one of {MATERN_NUS}, got {kernel.nu!r}")
        return StationaryFormula("matern", additive, nu=float(kernel.nu))
    if isinstance(kernel, gpytorch.kernels.RQKernel):
        return StationaryFormula("rq", additive)
    if isinstance(kernel, gpytorch.kernels.PeriodicKernel):
        return StationaryFormula("periodic", additive)
    names = ", ".join(f"{c.__module__}.{c.__name__}" for c in SUPPORTED_BASES)
    raise TypeError(f"base_kernel must be one of {names} (or lazykern's), got {type(kernel).__name__}")


def _per_dimension(name: str, value: Tensor, d: int) -> Tensor:
    if value.shape[-1] not in (1, d):
        raise ValueError(f"{name} has {value.shape[-1]} entries per batch but the inputs have {d} features")
    return value.expand(*value.shape[:-1], d)


def _centre(x1: Tensor, x2: Tensor) -> Tensor:
    """A point near the data, subtracted from both sides before dividing by the lengthscale.

    Stationary kernels see only differences, so any shared shift is exact; but dividing
    uncentred data first rounds each point to a relative precision of its *absolute* size
    (float32 data around 1e3 loses ~1e-4 of every O(1) difference). The mean of ``x1`` per batch
    member, or over everything when that would not broadcast against ``x2`` without growing it.
    """
    centre = x1.detach().mean(dim=-2, keepdim=True)
    if torch.broadcast_shapes(centre.shape[:-2], x2.shape[:-2]) != x2.shape[:-2]:
        centre = centre.reshape(-1, centre.shape[-1]).mean(dim=0)
    return centre


def formula_inputs(
    kernel: Kernel, x1: Tensor, x2: Tensor, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    r"""Transform inputs and gather tensor parameters for ``formula_for(kernel, ...)``, in ``dtype``
    (default: the inputs' and the kernel's dtypes promoted, as
    :func:`lazykern.validation.check_kernel_inputs` returns it).

    Inputs are centred, then divided by the lengthscale (periodic: multiplied by :math:`\pi/p`).
    Shared lengthscales are expanded to one per dimension, so shared and per-dimension
    lengthscales run the *same* compiled formula (gradients flow back through the expand).
    """
    if dtype is None:
        dtype = torch.promote_types(torch.promote_types(x1.dtype, x2.dtype), kernel.lengthscale.dtype)
    d = x1.shape[-1]
    lengthscale = _per_dimension("lengthscale", kernel.lengthscale, d).to(dtype)
    params = {}
    if isinstance(kernel, gpytorch.kernels.PeriodicKernel):
        scale = _per_dimension("period_length", kernel.period_length, d).to(dtype) / math.pi
        params["weights"] = 2.0 / lengthscale
    else:
        scale = lengthscale
        if isinstance(kernel, gpytorch.kernels.RQKernel):
            params["alpha"] = kernel.alpha.unsqueeze(-1).to(dtype)
    symmetric = x2 is x1
    x1, x2 = x1.to(dtype), x2.to(dtype)
    centre = _centre(x1, x2)
    x1_ = (x1 - centre) / scale
    # K(X, X) keeps one transformed tensor for both sides: the operator recognizes the symmetric
    # case and takes its gradient in one fused reduction.
    return x1_, x1_ if symmetric else (x2 - centre) / scale, params


def check_no_last_dim_is_batch(kernel: Kernel, last_dim_is_batch: bool) -> None:
    if last_dim_is_batch:
        raise ValueError(
            f"{type(kernel).__name__} does not take last_dim_is_batch=True; for a sum over dimensions use "
            "lazykern.kernels.AdditiveStructureKernel, which never forms the d x N x N batch"
        )


class LazyKernelMixin:
    """Mixin of every lazykern kernel: ``kernel * other`` is a :class:`lazykern.kernels.ProductKernel`,
    which evaluates lazykern factors as one formula also when ``x1`` differs from ``x2`` (GPyTorch's
    ``ProductKernel`` makes those dense). Sums need nothing: GPyTorch's ``AdditiveKernel`` adds the
    operators, and lazykern operators add into one formula."""

    def __mul__(self, other: Kernel) -> Kernel:
        from .combination import ProductKernel

        kernels = []
        for k in (self, other):
            kernels += list(k.kernels) if isinstance(k, gpytorch.kernels.ProductKernel) else [k]
        return ProductKernel(*kernels)


class LazyStationaryKernel(LazyKernelMixin, Kernel):
    """Mixin: ``forward`` of a full-dimensional stationary kernel as one lazy formula."""

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params
    ) -> LazyKernelOperator | Tensor:
        check_no_last_dim_is_batch(self, last_dim_is_batch)
        ard = self.ard_num_dims if self.ard_num_dims not in (None, 1) else None
        dtype = check_kernel_inputs(x1, x2, num_dims=ard, dtype=self.lengthscale.dtype)
        x1_, x2_, tensor_params = formula_inputs(self, x1, x2, dtype)
        op = LazyKernelOperator(x1_, x2_, covar_func=formula_for(self, additive=False), **tensor_params)
        return op.diagonal(dim1=-2, dim2=-1) if diag else op
