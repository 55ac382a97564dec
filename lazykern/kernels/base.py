"""The base of every lazykern kernel: one ``forward`` that returns one lazy operator.

A kernel says *what* it evaluates through three small hooks (its ``formula``, the formula's
arguments, and what its inputs are checked against);
:meth:`~lazykern.kernels.base.LazyKernel.forward` does the rest, the same way for every kernel.
:class:`WeightedTermsKernel` adds what the sums of one base kernel over dimensions or groups share:
the constructor checks and the learned weight of each term.
"""

from __future__ import annotations

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.kernels import Kernel
from torch import Tensor

from ..formulas import Formula
from ..operators import LazyKernelOperator
from ..validation import check_kernel_inputs, check_positive_int, check_term_hyperparameters
from .combination import LazyKernelMixin

__all__ = ["LazyKernel", "WeightedTermsKernel"]

#: What :meth:`LazyKernel.extra_repr` shows of a kernel, where the kernel has it: its structure,
#: then its hyperparameters by value (the constraints are shown by ``torch.nn.Module`` as children).
_REPR_STRUCTURE = ("num_dims", "active_dims", "groups", "max_degree", "nu", "input_measure")
_REPR_VALUES = ("lengthscale", "period_length", "alpha", "component_scales", "outputscale")
#: Longest hyperparameter shown whole; longer ones show their first entries and their shape.
_REPR_MAX_ENTRIES = 8


def _short(value: object) -> str:
    """A tensor as a rounded list (at most ``_REPR_MAX_ENTRIES`` entries, and its shape where it is
    batched or cut), anything else as its ``repr``."""
    if not isinstance(value, Tensor):
        return repr(value)
    flat = [float(f"{v:.4g}") if value.is_floating_point() else int(v) for v in value.detach().flatten().tolist()]
    if value.dim() == 0:
        return repr(flat[0])
    # A batch of values (more entries than the last dimension holds) says its shape.
    shape = f" (shape {tuple(value.shape)})" if len(flat) > value.shape[-1] else ""
    if len(flat) <= _REPR_MAX_ENTRIES:
        return f"{flat}{shape}"
    return f"[{', '.join(map(repr, flat[:_REPR_MAX_ENTRIES]))}, ...] (shape {tuple(value.shape)})"


class LazyKernel(LazyKernelMixin, Kernel):
    r"""Base of every lazykern kernel: :meth:`forward` checks the inputs and returns the kernel
    matrix as one lazy operator,

    .. math::

        K_{ij} = f(\tilde x_i, \tilde z_j; \theta), \qquad
        (\tilde x, \tilde z, \theta) = \texttt{formula\_arguments}(x, z),

    with :math:`f` the kernel's ``formula``: nothing N x M is stored unless it fits the dense budget,
    and ``kernel * other`` stays one formula (:class:`~lazykern.kernels.ProductKernel`).

    A subclass provides three hooks:

    * ``formula``: the formula :math:`f` (an attribute or a property), a function of the pairwise
      inputs and tensor parameters that every engine evaluates (:mod:`lazykern.formulas`);
    * :meth:`formula_arguments`: the transformed inputs and the tensor parameters :math:`\theta`;
    * ``_input_spec()``: the number of features and the hyperparameter dtype the inputs are
      checked against.

    Example:
        >>> import torch, lazykern
        >>> kernel = lazykern.RBFKernel()
        >>> isinstance(kernel, lazykern.kernels.base.LazyKernel)
        True
        >>> x = torch.randn(5, 2, dtype=torch.float64)
        >>> x_, z_, params = kernel.double().formula_arguments(x, x)
        >>> dense = kernel.formula(x_[:, None, :], z_[None, :, :], **params).squeeze(-1)
        >>> torch.allclose(dense, kernel(x).to_dense())
        True
    """

    def extra_repr(self) -> str:
        """What ``repr(kernel)`` shows on its first line: the structure (``num_dims``,
        ``active_dims``, ``groups``, ``max_degree``, ``nu``, ...) and the hyperparameters' values
        (lengthscales, periods, ``alpha``, learned component scales, order variances), each where
        the kernel has it; one hook for every lazykern kernel.

        Example:
            >>> import lazykern
            >>> lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=3, component_scales=True)
            AdditiveStructureKernel(
              num_dims=3, component_scales=[1.0, 1.0, 1.0]
              (base_kernel): RBFKernel(
                lengthscale=[0.6931]
                (raw_lengthscale_constraint): Positive()
              )
              (raw_component_scales_constraint): Positive()
            )
        """
        shown = []
        for name in _REPR_STRUCTURE + _REPR_VALUES:
            # Fixed unit scales are not a hyperparameter: only learned ones are shown.
            if name == "component_scales" and not hasattr(self, "raw_component_scales"):
                continue
            value = getattr(self, name, None)
            if value is not None:
                shown.append(f"{name}={_short(value)}")
        return ", ".join(shown)

    def formula_arguments(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The inputs as the formula reads them (``(..., N, F)`` and ``(..., M, F)``) and its tensor
        parameters, for inputs already checked by :meth:`~lazykern.kernels.base.LazyKernel.forward`."""
        raise NotImplementedError

    def _input_spec(self) -> tuple[int | None, str, torch.dtype]:
        """The number of features the inputs must have (``None``: any), the constructor argument
        that fixed it (for the message), and the hyperparameters' dtype (inputs promote with it)."""
        raise NotImplementedError

    def forward(
        self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params
    ) -> LazyKernelOperator | Tensor:
        """The lazy kernel matrix :math:`K(x_1, x_2)` (its diagonal where ``diag``), after the inputs
        are checked (:func:`lazykern.validation.check_kernel_inputs`), before anything is compiled."""
        if last_dim_is_batch:
            raise ValueError(
                f"{type(self).__name__} does not take last_dim_is_batch=True; for a sum over dimensions use "
                "lazykern.kernels.AdditiveStructureKernel, which never forms the d x N x N batch"
            )
        num_dims, num_dims_name, dtype = self._input_spec()
        check_kernel_inputs(x1, x2, num_dims=num_dims, num_dims_name=num_dims_name, dtype=dtype)
        x1_, x2_, tensor_params = self.formula_arguments(x1, x2)
        op = LazyKernelOperator(x1_, x2_, covar_func=self.formula, **tensor_params)
        return op.diagonal(dim1=-2, dim2=-1) if diag else op


class WeightedTermsKernel(LazyKernel):
    r"""Base of the kernels that sum terms of one base kernel (one term per dimension, per group),

    .. math::

        k(x, x') = \sum_t s_t\, k_t(x, x'),

    in one ``formula``. It holds the base kernel (whose hyperparameters are the ones trained), checks
    the constructor arguments once for all such kernels, and owns the term weights :math:`s_t`
    (:attr:`component_scales`: learned where asked, else fixed to 1).

    Args:
        base_kernel: lazykern's or GPyTorch's RBF, Matérn, RQ or periodic kernel; its lengthscale (and
            period) shared (``ard_num_dims`` unset) or one per dimension (``ard_num_dims=num_dims``).
        formula: the formula of the sum, built by the subclass from ``base_kernel``.
        num_dims: number of input dimensions D (after ``active_dims``); ``None``: any.
        num_terms: number of weights :math:`s_t`; ``None``: one unit weight broadcast over any D.
        active_dims: columns of the input to use.
        component_scales: learn a positive weight per term (initialized to 1).
        component_scales_constraint: constraint on the weights (default ``Positive()``).

    Example:
        >>> import lazykern
        >>> kernel = lazykern.GroupAdditiveKernel(lazykern.RBFKernel(), groups=[(0,), (0, 1)],
        ...                                       component_scales=True)
        >>> isinstance(kernel, lazykern.kernels.base.WeightedTermsKernel), kernel.component_scales.shape
        (True, torch.Size([1, 2]))
    """

    def __init__(
        self,
        base_kernel: Kernel,
        formula: Formula,
        *,
        num_dims: int | None,
        num_terms: int | None,
        active_dims: tuple[int, ...] | None = None,
        component_scales: bool = False,
        component_scales_constraint: Interval | None = None,
    ) -> None:
        if num_dims is not None:
            check_positive_int("num_dims", num_dims)
        elif component_scales:
            raise ValueError("component_scales=True needs num_dims (one scale per dimension), got num_dims=None")
        if active_dims is not None and num_dims is not None and len(active_dims) != num_dims:
            raise ValueError(f"active_dims has {len(active_dims)} entries but num_dims={num_dims}")
        if base_kernel.active_dims is not None:
            raise ValueError(
                f"base_kernel.active_dims must be None: pass active_dims to {type(self).__name__} instead"
            )
        check_term_hyperparameters(base_kernel, num_dims, terms_name="num_dims", term="dimension")
        super().__init__(active_dims=active_dims)
        self.base_kernel = base_kernel
        self.num_dims = num_dims
        self.formula = formula
        self._num_terms = num_terms
        if component_scales:
            constraint = Positive() if component_scales_constraint is None else component_scales_constraint
            shape = (*self.batch_shape, 1, num_terms)
            self.register_parameter("raw_component_scales", torch.nn.Parameter(torch.zeros(shape, dtype=self._dtype())))
            self.register_constraint("raw_component_scales", constraint)
            self.component_scales = torch.ones(shape, dtype=self._dtype())

    @property
    def batch_shape(self) -> torch.Size:
        """The base kernel's batch shape (also after ``kernel[i]`` or ``expand_batch``)."""
        return self.base_kernel.batch_shape

    @batch_shape.setter
    def batch_shape(self, value: torch.Size) -> None:
        # GPyTorch's indexing and expand_batch set it; the base kernel already carries it.
        self._batch_shape = torch.Size(value)

    @property
    def component_scales(self) -> Tensor:
        """The weights :math:`s_t` of the terms, shape ``(*batch_shape, 1, terms)``: learned where
        the kernel was built with ``component_scales=True`` (``raw_component_scales``), else ones
        in the base kernel's dtype and device."""
        if not hasattr(self, "raw_component_scales"):
            ref = self.base_kernel.raw_lengthscale
            return torch.ones(*self.batch_shape, 1, self._num_terms or 1, dtype=ref.dtype, device=ref.device)
        return self.raw_component_scales_constraint.transform(self.raw_component_scales)

    @component_scales.setter
    def component_scales(self, value: Tensor | float) -> None:
        if not hasattr(self, "raw_component_scales"):
            raise AttributeError("component_scales is fixed to 1: construct with component_scales=True")
        value = torch.as_tensor(value).to(self.raw_component_scales)
        self.initialize(raw_component_scales=self.raw_component_scales_constraint.inverse_transform(value))

    def _dtype(self) -> torch.dtype:
        """The hyperparameters' dtype: the base kernel's, whose hyperparameters are the ones trained."""
        return self.base_kernel.raw_lengthscale.dtype

    def _input_spec(self) -> tuple[int | None, str, torch.dtype]:
        return self.num_dims, "num_dims", self._dtype()

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        return self.base_kernel.prediction_strategy(train_inputs, train_prior_dist, train_labels, likelihood)
