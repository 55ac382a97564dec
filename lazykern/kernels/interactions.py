"""Additive kernels with interactions: all orders (Newton–Girard), orthogonal (OAK), groups."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.kernels import Kernel
from gpytorch.priors import Prior
from torch import Tensor

from ..formulas.interactions import (
    GroupFormula,
    InteractionFormula,
    orthogonal_rbf_features,
    orthogonal_rbf_variance,
)
from ..formulas.stationary import StationaryFormula
from ..validation import (
    check_choice,
    check_index_groups,
    check_per_dimension,
    check_positive_int,
    check_positive_int_at_most,
)
from .additive_structure import AdditiveStructureKernel, one_dimensional_terms
from .base import WeightedTermsKernel
from .base_kernels import RBFKernel
from .stationary import formula_for, formula_inputs

__all__ = ["NewtonGirardAdditiveKernel", "OrthogonalAdditiveKernel", "GroupAdditiveKernel"]


class NewtonGirardAdditiveKernel(AdditiveStructureKernel):
    r"""Additive kernel over all interaction orders 1..R (Duvenaud, Nickisch & Rasmussen, 2011), lazily.

    .. math::

        k(x, x') = \sum_{r=1}^{R} \sigma_r^2\, \tilde e_r(s_1 z_1, \dots, s_D z_D), \qquad
        \tilde e_r(z) = \binom Dr^{-1} \sum_{|S| = r} \prod_{d \in S} z_d,

    with :math:`z_d = k_{\text{base}}(x_d, x'_d)` the one-dimensional base kernel of dimension d.
    Order 1 is the first-order additive kernel, order D the ARD product kernel; order r sums the
    products over all :math:`\binom Dr` subsets of r dimensions. Dividing by :math:`\binom Dr`
    makes :math:`\sigma_r^2` (``outputscale``) the prior variance of order r at :math:`x = x'`
    (for unit ``component_scales``); GPyTorch's kernel of this name uses :math:`\sigma_r^2 e_r`,
    i.e. its ``outputscale[r-1]`` is this one divided by :math:`\binom Dr`.

    All orders are computed together in one formula by an O(D R) recurrence (not the
    Newton–Girard power sums, which lose every digit of the high orders in float32: see
    :func:`lazykern.formulas.interactions.elementary_symmetric` for the measurements), so memory
    stays O((N + M) D): neither GPyTorch's R x D x N x N tensor nor N x M is formed.

    Args:
        base_kernel: the one-dimensional kernel, as for :class:`AdditiveStructureKernel` (lazykern's
            or GPyTorch's RBF, Matérn, RQ or periodic kernel; ``ard_num_dims=num_dims`` for one
            lengthscale per dimension).
        num_dims: number of input dimensions D (after ``active_dims``).
        max_degree: highest interaction order R, 1..D (default D: all orders).
        active_dims: columns of the input to use.
        component_scales: learn a positive weight :math:`s_d` per dimension (initialized to 1).
        component_scales_constraint: constraint on :math:`s_d` (default ``Positive()``).
        outputscale_constraint: constraint on :math:`\sigma_r^2` (default ``Positive()``).
        outputscale_prior: optional prior on :math:`\sigma_r^2`.

    The order variances :math:`\sigma_1^2, \dots, \sigma_R^2` are :attr:`outputscale`, shape
    ``(*batch_shape, max_degree)``, initialized to :math:`1/R` each (so that :math:`k(x, x) = 1`).

    Example:
        >>> import torch, lazykern
        >>> base = lazykern.kernels.RBFKernel(ard_num_dims=8)
        >>> kernel = lazykern.kernels.NewtonGirardAdditiveKernel(base, num_dims=8, max_degree=3)
        >>> kernel.outputscale.shape
        torch.Size([3])
        >>> x = torch.randn(1000, 8)
        >>> (kernel(x) @ torch.ones(1000, 1)).shape   # one lazy reduction, all three orders
        torch.Size([1000, 1])
    """

    if TYPE_CHECKING:  # a plain class annotation would retype __init__'s num_dims in the API reference
        num_dims: int  # given (WeightedTermsKernel allows None: any width)

    def __init__(
        self,
        base_kernel: Kernel,
        num_dims: int,
        max_degree: int | None = None,
        active_dims: tuple[int, ...] | None = None,
        component_scales: bool = False,
        component_scales_constraint: Interval | None = None,
        outputscale_constraint: Interval | None = None,
        outputscale_prior: Prior | None = None,
    ) -> None:
        super().__init__(base_kernel, num_dims, active_dims=active_dims, component_scales=component_scales,
                         component_scales_constraint=component_scales_constraint)
        self.max_degree = num_dims if max_degree is None else check_positive_int_at_most(
            "max_degree", max_degree, num_dims, f"num_dims={num_dims} (orders are subsets of dimensions)")
        self.formula = self._make_formula()
        dtype = self._dtype()
        self.register_parameter(
            "raw_outputscale", torch.nn.Parameter(torch.zeros(*self.batch_shape, self.max_degree, dtype=dtype))
        )
        self.register_constraint("raw_outputscale",
                                 Positive() if outputscale_constraint is None else outputscale_constraint)
        if outputscale_prior is not None:
            self.register_prior("outputscale_prior", outputscale_prior, lambda m: m.outputscale,
                                lambda m, v: m._set_outputscale(v))
        self.outputscale = torch.full((*self.batch_shape, self.max_degree), 1.0 / self.max_degree, dtype=dtype)

    def _make_formula(self) -> InteractionFormula:
        return InteractionFormula(formula_for(self.base_kernel, additive=False), self.max_degree)

    @property
    def outputscale(self) -> Tensor:
        """Variance :math:`\\sigma_r^2` of each interaction order, shape ``(*batch_shape, max_degree)``."""
        return self.raw_outputscale_constraint.transform(self.raw_outputscale)

    @outputscale.setter
    def outputscale(self, value: Tensor | float | Sequence[float]) -> None:
        self._set_outputscale(value)

    def _set_outputscale(self, value: Tensor | float | Sequence[float]) -> None:
        value = torch.as_tensor(value).to(self.raw_outputscale)
        self.initialize(raw_outputscale=self.raw_outputscale_constraint.inverse_transform(value))

    def _inputs(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Transformed inputs and the tensor parameters of :attr:`formula` but the scales and variances."""
        return formula_inputs(self.base_kernel, x1, x2)

    def formula_arguments(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        x1_, x2_, tensor_params = self._inputs(x1, x2)
        tensor_params["scales"] = self.term_scales()
        tensor_params["order_variances"] = self.outputscale.unsqueeze(-2)
        return x1_, x2_, tensor_params

    def term_scales(self) -> Tensor:
        """The factors :math:`s_d` applied to the per-dimension terms, ``(*batch_shape, 1, num_dims)``."""
        return self.component_scales

    def lengthscale_widths(self, num_dims: int) -> tuple[int, ...]:
        """Each dimension's lengthscale is shared by the products of every order: the widest has
        ``max_degree`` factors."""
        return (self.max_degree,) * self.num_dims

    @property
    def variance_weights(self) -> tuple[str, int]:
        """The order variances (:attr:`outputscale`), one per order."""
        return "outputscale", self.max_degree

    @property
    def order_variances(self) -> Tensor:
        """The order variances are :attr:`outputscale`; setting one sets the other."""
        return self.outputscale

    @order_variances.setter
    def order_variances(self, value: Tensor | float | Sequence[float]) -> None:
        self._set_outputscale(value)

    def first_order_terms(
        self, x1: Tensor, x2: Tensor
    ) -> tuple[InteractionFormula, Tensor, Tensor, dict[str, Tensor]]:
        r"""Order 1, :math:`\frac{\sigma_1^2}{D} \sum_d s_d\, k_{\text{base}}(x_d, x'_d)`."""
        return one_dimensional_terms(self.base_kernel, x1, x2, self._first_order_weights())

    def _first_order_weights(self) -> Tensor:
        """:math:`\\sigma_1^2 / D` times each term's factor, ``(*batch_shape, 1, num_dims)``."""
        return self.outputscale[..., :1].unsqueeze(-2) / self.num_dims * self.term_scales()


class OrthogonalAdditiveKernel(NewtonGirardAdditiveKernel):
    r"""Orthogonal additive kernel (OAK; Lu, Boukouvalas & Hensman, 2022), lazily.

    The one-dimensional RBF kernel of each dimension is made orthogonal to a Gaussian input measure
    :math:`p_d = \mathcal N(\mu_d, \delta_d^2)`: with :math:`m_d(x) = \int k_d(x, t)\, p_d(t)\, dt`
    and :math:`v_d = \iint k_d\, p_d\, p_d`,

    .. math::

        \tilde k_d(x, y) = k_d(x, y) - \frac{m_d(x)\, m_d(y)}{v_d}
        = e^{-\frac{(x - y)^2}{2 \ell_d^2}}
          - \frac{\ell_d \sqrt{\ell_d^2 + 2\delta_d^2}}{\ell_d^2 + \delta_d^2}
            \exp\Big(-\frac{(x - \mu_d)^2 + (y - \mu_d)^2}{2 (\ell_d^2 + \delta_d^2)}\Big),

    so every function drawn from :math:`\tilde k_d` integrates to zero under :math:`p_d`. Each term
    is divided by its average variance :math:`\bar v_d = \int \tilde k_d(x, x)\, p_d(x)\, dx`
    (:func:`lazykern.formulas.interactions.orthogonal_rbf_variance`: a smooth term loses most of its
    variance to the removed constant), and the orders are combined as in
    :class:`NewtonGirardAdditiveKernel`:

    .. math::

        k(x, x') = \sum_{r=1}^R \sigma_r^2\, \tilde e_r\big(s_1 \tilde k_1 / \bar v_1, \dots,
        s_D \tilde k_D / \bar v_D\big),

    so that :math:`\sigma_r^2` is the prior variance of order r averaged over the input measure
    (for unit :math:`s`), whatever the lengthscales. Components of
    different subsets of dimensions are then orthogonal under :math:`p = \prod_d p_d`, which makes
    them identifiable and gives closed-form Sobol indices
    (:func:`lazykern.components.component_analysis`). The constant (order 0) is left to the GP's
    mean. Everything is one formula; memory stays O((N + M) D).

    Args:
        num_dims: number of input dimensions D (after ``active_dims``).
        max_degree: highest interaction order R, 1..D (default D).
        input_measure: ``"gaussian"`` (the only measure with this closed form).
        measure_mean, measure_std: :math:`\mu_d` and :math:`\delta_d`, a number or one per
            dimension (default 0 and 1: standardized inputs). Fixed, not trained.
        active_dims: columns of the input to use.
        batch_shape: batch shape of the hyperparameters.
        lengthscale_prior, lengthscale_constraint: of the per-dimension lengthscales :math:`\ell_d`.
        component_scales, component_scales_constraint, outputscale_constraint, outputscale_prior:
            as for :class:`NewtonGirardAdditiveKernel`.

    Example:
        >>> import torch, lazykern
        >>> kernel = lazykern.kernels.OrthogonalAdditiveKernel(num_dims=5, max_degree=2)
        >>> x = torch.randn(2000, 5)
        >>> K = kernel(x)                      # lazy; K @ v is one reduction
        >>> kernel.base_kernel.lengthscale.shape
        torch.Size([1, 5])
    """

    is_stationary = False

    def __init__(
        self,
        num_dims: int,
        max_degree: int | None = None,
        input_measure: str = "gaussian",
        measure_mean: float | Tensor = 0.0,
        measure_std: float | Tensor = 1.0,
        active_dims: tuple[int, ...] | None = None,
        batch_shape: torch.Size = torch.Size(),
        lengthscale_prior: Prior | None = None,
        lengthscale_constraint: Interval | None = None,
        component_scales: bool = False,
        component_scales_constraint: Interval | None = None,
        outputscale_constraint: Interval | None = None,
        outputscale_prior: Prior | None = None,
    ) -> None:
        check_choice("input_measure", input_measure, ("gaussian",))
        check_positive_int("num_dims", num_dims)
        base = RBFKernel(ard_num_dims=num_dims, batch_shape=batch_shape, lengthscale_prior=lengthscale_prior,
                         lengthscale_constraint=lengthscale_constraint)
        super().__init__(base, num_dims, max_degree, active_dims=active_dims, component_scales=component_scales,
                         component_scales_constraint=component_scales_constraint,
                         outputscale_constraint=outputscale_constraint, outputscale_prior=outputscale_prior)
        self.input_measure = input_measure
        dtype = self._dtype()
        self.register_buffer("measure_mean", check_per_dimension("measure_mean", measure_mean, num_dims, dtype=dtype))
        self.register_buffer("measure_std",
                             check_per_dimension("measure_std", measure_std, num_dims, dtype=dtype, positive=True))

    def _make_formula(self) -> InteractionFormula:
        return InteractionFormula(StationaryFormula("rbf"), self.max_degree, kind="orthogonal")

    def term_scales(self) -> Tensor:
        return self.component_scales / orthogonal_rbf_variance(self.base_kernel.lengthscale, self.measure_std)

    def _inputs(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        features = lambda x: orthogonal_rbf_features(  # noqa: E731
            x, self.base_kernel.lengthscale, self.measure_mean, self.measure_std)
        x1_ = features(x1)
        return x1_, x1_ if x2 is x1 else features(x2), {}

    def first_order_terms(
        self, x1: Tensor, x2: Tensor
    ) -> tuple[InteractionFormula, Tensor, Tensor, dict[str, Tensor]]:
        r"""Order 1, :math:`\frac{\sigma_1^2}{D} \sum_d s_d\, \tilde k_d(x_d, x'_d) / \bar v_d`: each
        dimension's orthogonalised term on its five features."""
        d = self.num_dims
        left, right = (side.reshape(side.shape[0], 5, d).permute(2, 0, 1)  # (D, *, 5)
                       for side in self.formula_arguments(x1, x2)[:2])  # (*, 5D): [u, g(u), a(u), log a(u), m]
        weights = self._first_order_weights().reshape(d, 1, 1)
        formula = InteractionFormula(StationaryFormula("rbf"), 1, kind="orthogonal")
        return formula, left, right, {"order_variances": weights, "scales": torch.ones_like(weights)}


class GroupAdditiveKernel(WeightedTermsKernel):
    r"""A sum of one multi-dimensional base kernel over given groups of dimensions, lazily.

    .. math::

        k(x, x') = \sum_{g=1}^{G} s_g\, k_{\text{base}}(x_{G_g}, x'_{G_g})

    Groups may overlap and have any sizes; a dimension's lengthscale is shared by the groups that
    contain it. All groups are one formula: memory stays O((N + M) D).

    Args:
        base_kernel: lazykern's or GPyTorch's RBF, Matérn, RQ or periodic kernel, with a shared
            lengthscale (``ard_num_dims`` unset) or one per dimension (``ard_num_dims=num_dims``).
        groups: the groups, each a non-empty sequence of distinct column indices in ``0..num_dims-1``.
        num_dims: number of input dimensions (after ``active_dims``; default: largest index + 1).
        active_dims: columns of the input to use.
        component_scales: learn a positive weight :math:`s_g` per group (initialized to 1).
        component_scales_constraint: constraint on :math:`s_g` (default ``Positive()``).

    Example:
        >>> import torch, lazykern
        >>> base = lazykern.kernels.RBFKernel(ard_num_dims=4)
        >>> kernel = lazykern.kernels.GroupAdditiveKernel(base, groups=[(0, 1), (1, 2, 3)])
        >>> kernel(torch.randn(10, 4)).shape
        torch.Size([10, 10])
    """

    is_stationary = True

    if TYPE_CHECKING:  # as NewtonGirardAdditiveKernel's
        num_dims: int  # given, or found from the groups (WeightedTermsKernel allows None: any width)

    def __init__(
        self,
        base_kernel: Kernel,
        groups: Sequence[Sequence[int]],
        num_dims: int | None = None,
        active_dims: tuple[int, ...] | None = None,
        component_scales: bool = False,
        component_scales_constraint: Interval | None = None,
    ) -> None:
        formula = GroupFormula(formula_for(base_kernel, additive=False))
        groups = check_index_groups("groups", groups)
        largest = max(max(g) for g in groups)
        if num_dims is None:
            num_dims = largest + 1
        super().__init__(base_kernel, formula, num_dims=num_dims, num_terms=len(groups), active_dims=active_dims,
                         component_scales=component_scales, component_scales_constraint=component_scales_constraint)
        if largest >= num_dims:
            raise ValueError(f"groups use column {largest} but num_dims={num_dims}")
        self.groups = groups
        membership = torch.zeros(len(groups), num_dims, dtype=self._dtype())
        for g, dims in enumerate(groups):
            membership[g, list(dims)] = 1
        self.register_buffer("membership", membership.reshape(1, -1))

    def lengthscale_widths(self, num_dims: int) -> tuple[int, ...]:
        """Each dimension: the size of the largest group that contains it (1 where none does)."""
        widths = [1] * self.num_dims
        for group in self.groups:
            for d in group:
                widths[d] = max(widths[d], len(group))
        return tuple(widths)

    def formula_arguments(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        x1_, x2_, tensor_params = formula_inputs(self.base_kernel, x1, x2)
        tensor_params["membership"] = self.membership
        tensor_params["scales"] = self.component_scales
        return x1_, x2_, tensor_params
