"""From a GPyTorch-style stationary kernel to a formula, its inputs and its tensor parameters.

This is the bridge that lets lazykern's kernels *and* GPyTorch's own ``RBFKernel``,
``MaternKernel``, ``RQKernel`` and ``PeriodicKernel`` drive the same formulas with their own,
trainable hyperparameters; :class:`LazyStationaryKernel` is the :class:`~lazykern.kernels.base.LazyKernel`
of the full-dimensional ones.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..formulas import StationaryFormula
from .base import LazyKernel

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
        # The formula checks nu: GPyTorch's kernel lets it change after construction.
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


class LazyStationaryKernel(LazyKernel):
    """Base of lazykern's full-dimensional stationary kernels (:class:`~lazykern.kernels.RBFKernel`
    and the like, each also subclassing its GPyTorch namesake): the formula and its arguments
    follow from the GPyTorch hyperparameters (:func:`formula_for`, :func:`formula_inputs`).

    Example:
        >>> import lazykern
        >>> lazykern.MaternKernel(nu=1.5).formula
        StationaryFormula(family='matern', additive=False, nu=1.5)
    """

    @property
    def formula(self) -> StationaryFormula:
        """The formula of this kernel, read on each call (as GPyTorch's ``nu`` is an attribute)."""
        return formula_for(self, additive=False)

    def formula_arguments(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        return formula_inputs(self, x1, x2)

    def _input_spec(self) -> tuple[int | None, str, torch.dtype]:
        ard = self.ard_num_dims if self.ard_num_dims not in (None, 1) else None
        return ard, "ard_num_dims", self.raw_lengthscale.dtype
