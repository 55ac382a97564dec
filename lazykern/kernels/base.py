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

    # What a kernel family knows about itself, asked by initialisations, priors, random features and
    # the component analysis: the defaults describe one full-dimensional term (an ARD kernel); each
    # family overrides what differs.

    #: The measure under which the kernel's components are orthogonal
    #: (:class:`~lazykern.kernels.OrthogonalAdditiveKernel`: ``"gaussian"``), which gives closed-form
    #: Sobol indices; ``None`` for a kernel whose components are not orthogonal.
    input_measure: str | None = None

    @property
    def lengthscale_kernel(self) -> Kernel | None:
        """The module whose ``lengthscale`` the kernel's terms divide their inputs by, where
        initialisations and priors set the lengthscales. The default is the kernel itself (a
        full-dimensional kernel; ``None`` for one without lengthscales); a sum of terms
        (:class:`WeightedTermsKernel`) has its base kernel.

        Example:
            >>> import lazykern
            >>> ard = lazykern.RBFKernel(ard_num_dims=3)
            >>> additive = lazykern.AdditiveStructureKernel(ard, num_dims=3)
            >>> ard.lengthscale_kernel is ard, additive.lengthscale_kernel is ard
            (True, True)
        """
        return self if self.has_lengthscale else None

    def lengthscale_widths(self, num_dims: int) -> tuple[int, ...]:
        r"""For each coordinate the terms' lengthscales act on, the number of dimensions
        :math:`w_c = \max_{t \ni c} |G_t|` of the widest term :math:`t` that contains it.

        A term over :math:`w` standardized dimensions sees distances of about :math:`\sqrt w`: what a
        dimension-aware lengthscale initialisation and BoTorch's dimension-scaled lengthscale prior
        read. The default is one term over all :math:`d` inputs (an ARD kernel): :math:`w_c = d`.

        Args:
            num_dims: the number of input dimensions d the kernel sees (read where the kernel does
                not fix its own).

        Returns:
            One width per coordinate of :attr:`lengthscale_kernel`'s lengthscale: per input dimension,
            or per projection for :class:`~lazykern.kernels.ProjectedAdditiveKernel`.

        Example:
            >>> import lazykern
            >>> lazykern.RBFKernel(ard_num_dims=3).lengthscale_widths(3)
            (3, 3, 3)
            >>> lazykern.GroupAdditiveKernel(lazykern.RBFKernel(), groups=[(0, 1), (1, 2, 3)]).lengthscale_widths(4)
            (2, 3, 3, 3)
        """
        return (num_dims,) * num_dims

    def per_input_lengthscale(self) -> tuple[Kernel, str]:
        """Where the lengthscales that divide the input columns live, as ``(module, attribute)``:
        ``getattr(module, attribute)`` is ``(..., 1, d)`` with one per input column, ``(..., 1, 1)``
        where one is shared, or ``None`` where the kernel has none. The default:
        :attr:`lengthscale_kernel`'s ``lengthscale``, as the terms read the input columns themselves.

        Example:
            >>> import lazykern
            >>> kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims=3, num_projections=5,
            ...                                           input_lengthscales=True)
            >>> module, name = kernel.per_input_lengthscale()
            >>> name, getattr(module, name).shape
            ('input_lengthscale', torch.Size([1, 3]))
        """
        return self.lengthscale_kernel, "lengthscale"

    @property
    def variance_weights(self) -> tuple[str, int] | None:
        r"""The hyperparameter that shares the kernel's prior variance among its terms, and its number
        of entries :math:`T`: for :math:`k = \sum_t w_t k_t` with terms of unit variance,
        :math:`k(x, x) = \sum_t w_t`, so :math:`w_t = 1/T` gives the sum unit variance.
        ``("component_scales", T)`` for a sum of weighted terms, ``("outputscale", R)`` for the order
        variances of an interaction kernel; ``None`` (the default) for one term, whose variance is a
        ``ScaleKernel``'s.

        Example:
            >>> import lazykern
            >>> lazykern.GroupAdditiveKernel(lazykern.RBFKernel(), groups=[(0,), (0, 1)]).variance_weights
            ('component_scales', 2)
            >>> lazykern.RBFKernel().variance_weights is None
            True
        """
        return None

    @property
    def order_variances(self) -> Tensor | None:
        r"""The variance :math:`\sigma_r^2` of each interaction order :math:`r = 1..R`, shape
        ``(*batch_shape, R)``, where the kernel is a sum over orders
        (:class:`~lazykern.kernels.NewtonGirardAdditiveKernel`); ``None`` (the default) otherwise.

        Example:
            >>> import lazykern
            >>> lazykern.OrthogonalAdditiveKernel(num_dims=4, max_degree=2).order_variances.detach()
            tensor([0.5000, 0.5000])
            >>> lazykern.RBFKernel().order_variances is None
            True
        """
        return None

    @property
    def component_axes(self) -> str | None:
        r"""What the kernel's first-order components are functions of, where it is a sum with one
        (:mod:`lazykern.components` analyses it): ``"inputs"`` (component :math:`d` a function of
        :math:`x_d`) or ``"projections"`` (component :math:`j` a function of :math:`w_j^\top x`);
        ``None`` (the default) for a kernel without first-order components.

        Example:
            >>> import lazykern
            >>> lazykern.OrthogonalAdditiveKernel(num_dims=3).component_axes, lazykern.RBFKernel().component_axes
            ('inputs', None)
        """
        return None

    def component_coordinates(self, x: Tensor) -> Tensor:
        """The coordinates of ``x`` (``(..., N, d)``) that the first-order components are functions of,
        ``(..., N, D)``: the inputs themselves (the default), or their projections for
        :class:`~lazykern.kernels.ProjectedAdditiveKernel` (:meth:`~lazykern.kernels.ProjectedAdditiveKernel.project`).

        Example:
            >>> import torch, lazykern
            >>> lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=3).component_coordinates(
            ...     torch.randn(10, 3)).shape
            torch.Size([10, 3])
        """
        return x

    def first_order_terms(self, x1: Tensor, x2: Tensor) -> tuple[object, Tensor, Tensor, dict[str, Tensor]]:
        r"""The kernel's first-order part :math:`\sum_{d=1}^D c_d\, k_d(u_d, u'_d)` as a batch of
        :math:`D` one-dimensional kernels in one formula: ``(formula, u1, u2, params)`` such that
        ``lazykern.backend.pairwise_dense(formula, u1, u2, params)`` is the ``(D, N, M)`` stack of the
        weighted terms :math:`c_d k_d`. For a first-order kernel their sum is the kernel matrix. The
        weights :math:`c_d` are ``params["order_variances"]`` (``(D, 1, 1)``): scaling them scales
        the terms.

        Args:
            x1, x2: ``(N, D)`` and ``(M, D)`` points in :meth:`component_coordinates` (a kernel
                without batch shape).

        Returns:
            The formula, the two batches of one-dimensional inputs ``(D, N, F)`` and ``(D, M, F)``,
            and the tensor parameters.

        Raises:
            TypeError: for a kernel without first-order components (:attr:`component_axes` ``None``).

        Example:
            >>> import torch, lazykern
            >>> from lazykern import backend
            >>> kernel = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=3), num_dims=3).double()
            >>> x = torch.randn(6, 3, dtype=torch.float64)
            >>> terms = backend.pairwise_dense(*kernel.first_order_terms(x, x))   # one matrix per dimension
            >>> terms.shape, torch.allclose(terms.sum(0), kernel(x).to_dense())
            (torch.Size([3, 6, 6]), True)
        """
        raise TypeError(f"{type(self).__name__} has no first-order components")

    @property
    def learns_projections(self) -> bool:
        """Whether training moves the directions the kernel projects its inputs onto
        (:class:`~lazykern.kernels.ProjectedAdditiveKernel` built with ``learn_projections=True``);
        ``False`` (the default) for a kernel without projections.

        Example:
            >>> import lazykern
            >>> kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims=3, num_projections=4,
            ...                                           learn_projections=True)
            >>> kernel.learns_projections, lazykern.RBFKernel().learns_projections
            (True, False)
        """
        return False

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

    @property
    def lengthscale_kernel(self) -> Kernel:
        """The base kernel, whose hyperparameters every term reads."""
        return self.base_kernel

    @property
    def variance_weights(self) -> tuple[str, int]:
        """The term weights :attr:`component_scales`, one per term (one where any number of
        dimensions is taken)."""
        return "component_scales", self._num_terms or 1

    def _dtype(self) -> torch.dtype:
        """The hyperparameters' dtype: the base kernel's, whose hyperparameters are the ones trained."""
        return self.base_kernel.raw_lengthscale.dtype

    def _input_spec(self) -> tuple[int | None, str, torch.dtype]:
        return self.num_dims, "num_dims", self._dtype()

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        return self.base_kernel.prediction_strategy(train_inputs, train_prior_dist, train_labels, likelihood)
