"""Additive kernels as one formula summed over dimensions."""

from __future__ import annotations

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import Kernel
from torch import Tensor

from ..formulas.interactions import InteractionFormula
from .base import WeightedTermsKernel
from .stationary import formula_for, formula_inputs


class AdditiveStructureKernel(WeightedTermsKernel):
    r"""A sum of one-dimensional kernels, one per input dimension, as **one** lazy formula.

    .. math::

        k(x, x') = \sum_{d=1}^{D} s_d\, k_{\text{base}}(x_d, x'_d)

    The sum over :math:`d` happens inside the formula, so matvecs, gradients and diagonals
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
        # Without num_dims one unit weight broadcasts over any D.
        super().__init__(base_kernel, formula, num_dims=num_dims, num_terms=num_dims, active_dims=active_dims,
                         component_scales=component_scales, component_scales_constraint=component_scales_constraint)

    def formula_arguments(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        return additive_formula_arguments(self, x1, x2)

    def lengthscale_widths(self, num_dims: int) -> tuple[int, ...]:
        """One-dimensional terms: width 1 for each dimension."""
        return (1,) * (num_dims if self.num_dims is None else self.num_dims)

    @property
    def component_axes(self) -> str:
        """A term per input dimension, so ``"inputs"``."""
        return "inputs"

    def first_order_terms(
        self, x1: Tensor, x2: Tensor
    ) -> tuple[InteractionFormula, Tensor, Tensor, dict[str, Tensor]]:
        r"""The terms :math:`s_d\, k_{\text{base}}(x_d, x'_d)` (the whole kernel)."""
        return one_dimensional_terms(self.base_kernel, x1, x2, self.component_scales)


def additive_formula_arguments(
    kernel: WeightedTermsKernel, x1: Tensor, x2: Tensor
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The arguments of the additive formula (one term per column of ``x1`` and ``x2``, weighted by
    ``kernel.component_scales``) for the base kernel of ``kernel``: what
    :class:`AdditiveStructureKernel` passes for its inputs and
    :class:`~lazykern.kernels.ProjectedAdditiveKernel` for the projections of its inputs."""
    x1_, x2_, tensor_params = formula_inputs(kernel.base_kernel, x1, x2)
    # Per-column scales, so that fixed and learned scales run the same compiled formula.
    scales = kernel.component_scales.to(x1_.dtype)
    tensor_params["scales"] = scales.expand(*scales.shape[:-1], x1.shape[-1])
    return x1_, x2_, tensor_params


def one_dimensional_terms(
    base_kernel: Kernel, x1: Tensor, x2: Tensor, weights: Tensor
) -> tuple[InteractionFormula, Tensor, Tensor, dict[str, Tensor]]:
    r"""The terms :math:`c_d\, k_{\text{base}}(x_d, x'_d)`, :math:`d = 1..D`, as a batch of :math:`D`
    one-dimensional kernels (see :meth:`~lazykern.kernels.base.LazyKernel.first_order_terms`, which
    :class:`AdditiveStructureKernel`, :class:`~lazykern.kernels.NewtonGirardAdditiveKernel` and
    :class:`~lazykern.kernels.ProjectedAdditiveKernel` return through it) for ``(N, D)`` and
    ``(M, D)`` inputs and weights :math:`c` ``(1, 1 or D)``."""
    d = x1.shape[-1]
    # Both sides transformed together: the inputs are centred on a shift taken from both.
    x1_, x2_, params = formula_inputs(base_kernel, x1, x2)
    left, right = (side.transpose(0, 1).unsqueeze(-1) for side in (x1_, x2_))  # (D, *, 1)
    # (*, 1, D) per-dimension parameters become a batch of D; shared ones broadcast.
    params = {n: p.reshape(-1, 1, 1) if p.shape[-1] == d else p.reshape(1, 1, -1) for n, p in params.items()}
    weights = weights.expand(*weights.shape[:-1], d).reshape(d, 1, 1)
    params.update(order_variances=weights, scales=torch.ones_like(weights))
    return InteractionFormula(formula_for(base_kernel, additive=False), 1), left, right, params


def _implied_num_dims(base_kernel: Kernel, active_dims: tuple[int, ...] | None) -> int | None:
    if active_dims is not None:
        return len(active_dims)
    ard = getattr(base_kernel, "ard_num_dims", None)
    return ard if ard not in (None, 1) else None
