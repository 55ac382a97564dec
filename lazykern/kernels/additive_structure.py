"""Additive kernels as one formula summed over dimensions."""

from __future__ import annotations

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.kernels import Kernel
from torch import Tensor

from ..operators import LazyKernelOperator
from ..validation import check_kernel_inputs, check_positive_int
from .stationary import LazyKernelMixin, check_no_last_dim_is_batch, formula_for, formula_inputs


class _ComponentScales:
    """``component_scales``: learned positive weights per term when the kernel was built with
    ``component_scales=True`` (``raw_component_scales``), else fixed unit weights of the width
    ``_unit_scales_width()`` in the base kernel's dtype and device."""

    def _unit_scales_width(self) -> int:
        raise NotImplementedError

    @property
    def component_scales(self) -> Tensor:
        """The per-term weights, shape ``(*batch_shape, 1, terms)``."""
        if not hasattr(self, "raw_component_scales"):
            ref = self.base_kernel.raw_lengthscale
            return torch.ones(*self.batch_shape, 1, self._unit_scales_width(), dtype=ref.dtype, device=ref.device)
        return self.raw_component_scales_constraint.transform(self.raw_component_scales)

    @component_scales.setter
    def component_scales(self, value: Tensor | float) -> None:
        if not hasattr(self, "raw_component_scales"):
            raise AttributeError("component_scales is fixed to 1: construct with component_scales=True")
        value = torch.as_tensor(value).to(self.raw_component_scales)
        self.initialize(raw_component_scales=self.raw_component_scales_constraint.inverse_transform(value))


class AdditiveStructureKernel(_ComponentScales, LazyKernelMixin, Kernel):
    r"""A sum of one-dimensional kernels, one per input dimension, as **one** lazy formula.

    .. math::

        k(x, x') = \sum_{d=1}^{D} s_d\, k_{\text{base}}(x_d, x'_d)

    The sum over :math:`d` happens inside the KeOps formula, so matvecs, gradients and diagonals
    run in O((N + M) D) memory: neither the D x N x M tensor of GPyTorch's
    ``AdditiveStructureKernel`` nor even the N x M matrix is formed (unless the N x M matrix fits
    :class:`lazykern.settings.max_dense_bytes`, where it is built once and reused).

    Args:
        base_kernel: the one-dimensional kernel: lazykern's or GPyTorch's ``RBFKernel``,
            ``MaternKernel``, ``RQKernel`` or ``PeriodicKernel``. Its hyperparameters are the ones
            used and trained: a lengthscale (and period) shared across dimensions (``ard_num_dims``
            unset) or one per dimension (``ard_num_dims=num_dims``).
        num_dims: number of input dimensions D (after ``active_dims``). Optional when it follows
            from the rest: the length of ``active_dims``, or ``ard_num_dims`` of the base kernel;
            without any of them (and without ``component_scales``) any D is accepted.
        active_dims: columns of the input to use (as in every GPyTorch kernel).
        component_scales: learn a positive weight :math:`s_d` per dimension (initialized to 1, so
            the kernel starts equal to the unweighted sum). Otherwise :math:`s_d = 1`.
        component_scales_constraint: constraint on :math:`s_d` (default ``Positive()``).

    Example:
        >>> import torch, gpytorch, lazykern
        >>> x = torch.randn(2000, 26)
        >>> base = lazykern.kernels.RBFKernel(ard_num_dims=26)
        >>> kernel = gpytorch.kernels.ScaleKernel(
        ...     lazykern.kernels.AdditiveStructureKernel(base, num_dims=26, component_scales=True))
        >>> K = kernel(x)   # a LinearOperator; no 26 x 2000 x 2000 tensor
        >>> kernel(x[:5], diag=True).shape
        torch.Size([5])
    """

    is_stationary = True

    def __init__(
        self,
        base_kernel: Kernel,
        num_dims: int | None = None,
        active_dims: tuple[int, ...] | None = None,
        component_scales: bool = False,
        component_scales_constraint: Interval | None = None,
    ) -> None:
        formula = formula_for(base_kernel, additive=True)
        if num_dims is None:
            num_dims = _implied_num_dims(base_kernel, active_dims)
        if num_dims is not None:
            check_positive_int("num_dims", num_dims)
        elif component_scales:
            raise ValueError("component_scales=True needs num_dims (one scale per dimension), got num_dims=None")
        if active_dims is not None and num_dims is not None and len(active_dims) != num_dims:
            raise ValueError(f"active_dims has {len(active_dims)} entries but num_dims={num_dims}")
        if base_kernel.active_dims is not None:
            raise ValueError(
                "base_kernel.active_dims must be None: pass active_dims to AdditiveStructureKernel instead"
            )
        for name in ("lengthscale", "period_length"):
            value = getattr(base_kernel, name, None)
            if value is not None and value.shape[-1] not in (1, num_dims):
                raise ValueError(
                    f"base_kernel.{name} has {value.shape[-1]} entries: use ard_num_dims=None (shared) "
                    f"or ard_num_dims=num_dims={num_dims} (one per dimension)"
                )
        super().__init__(active_dims=active_dims)
        self.base_kernel = base_kernel
        self.num_dims = num_dims
        self.formula = formula
        if component_scales:
            constraint = Positive() if component_scales_constraint is None else component_scales_constraint
            dtype = base_kernel.raw_lengthscale.dtype
            self.register_parameter(
                "raw_component_scales",
                torch.nn.Parameter(torch.zeros(*self.batch_shape, 1, num_dims, dtype=dtype)),
            )
            self.register_constraint("raw_component_scales", constraint)
            self.component_scales = torch.ones(*self.batch_shape, 1, num_dims, dtype=dtype)

    @property
    def batch_shape(self) -> torch.Size:
        """The base kernel's batch shape (also after ``kernel[i]`` or ``expand_batch``)."""
        return self.base_kernel.batch_shape

    @batch_shape.setter
    def batch_shape(self, value: torch.Size) -> None:
        # GPyTorch's indexing and expand_batch set it; the base kernel already carries it.
        self._batch_shape = torch.Size(value)

    def _unit_scales_width(self) -> int:
        # The per-dimension weights s_d; without num_dims one unit weight broadcasts over any D.
        return self.num_dims or 1

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params
    ) -> LazyKernelOperator | Tensor:
        check_no_last_dim_is_batch(self, last_dim_is_batch)
        dtype = check_kernel_inputs(
            x1, x2, num_dims=self.num_dims, num_dims_name="num_dims", dtype=self.base_kernel.raw_lengthscale.dtype
        )
        x1_, x2_, tensor_params = formula_inputs(self.base_kernel, x1, x2, dtype)
        # Per-dimension scales, so that fixed and learned scales run the same compiled formula.
        scales = self.component_scales.to(dtype)
        tensor_params["scales"] = scales.expand(*scales.shape[:-1], x1.shape[-1])
        op = LazyKernelOperator(x1_, x2_, covar_func=self.formula, **tensor_params)
        return op.diagonal(dim1=-2, dim2=-1) if diag else op

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        return self.base_kernel.prediction_strategy(train_inputs, train_prior_dist, train_labels, likelihood)


def _implied_num_dims(base_kernel: Kernel, active_dims: tuple[int, ...] | None) -> int | None:
    if active_dims is not None:
        return len(active_dims)
    ard = getattr(base_kernel, "ard_num_dims", None)
    return ard if ard not in (None, 1) else None
