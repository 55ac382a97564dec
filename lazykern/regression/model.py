r"""Building the model: the kernel by name, the exact GP, its initial hyperparameters.

Example:
    >>> import torch
    >>> from lazykern.regression import build_model
    >>> model, likelihood = build_model(torch.randn(50, 3), torch.randn(50), "additive-rbf")
    >>> type(model.covar_module.base_kernel).__name__
    'AdditiveStructureKernel'
"""

from __future__ import annotations

import math

import gpytorch
import torch
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from .. import kernels as lazy_kernels
from ..kernels.base import LazyKernel
from ..kernel_names import INTERACTION_KERNELS, KERNELS, PROJECTED_KERNELS, default_num_projections
from ..validation import check_floating_matrix, check_positive_int, check_positive_number

__all__ = ["DEFAULT_MAX_DEGREE", "DISCRETE_FLOOR", "DISCRETE_MAX_LEVELS", "INITIAL_NOISE", "TOP_ORDER_SHARE",
           "ExactGPRegressor", "build_model", "discrete_columns", "floor_discrete_lengthscales", "hyperparameters",
           "initialize", "make_kernel"]


DEFAULT_MAX_DEGREE: int | None = None
"""Highest interaction order of ``additive-ng`` and ``oak`` unless ``max_degree`` says otherwise;
``None``: every order up to the number of dimensions d (Duvenaud et al.'s model, and GPyTorch's
default), so that ``additive-ng`` contains the ARD kernel as its top order and fits data whose
function is not additive; fewer orders fit kin40k worse (``docs/uci.rst``, "The recipe's choices").
Costs D R multiply-adds per pair, against D exponentials for an ARD kernel."""

INITIAL_NOISE = 0.01
"""Noise variance at the start of training, 1% of the variance of the standardized targets: from a
start that calls most of the targets' variance noise, training can settle at the mean predictor
(all noise), where from this one it finds the fit (``docs/uci.rst``, "The recipe's choices")."""
#: Share of a Newton–Girard kernel's initial variance on its top order (see :func:`initialize`).
TOP_ORDER_SHARE = 0.9
#: Most distinct values of a column taken as binary or categorical (:func:`discrete_columns`): the
#: months of a year are categories, the hours of a day a continuous input (``docs/uci.rst``).
DISCRETE_MAX_LEVELS = 12
#: Lengthscale floor of a binary or categorical input, as a fraction of the smallest gap between its
#: values (:func:`floor_discrete_lengthscales`).
DISCRETE_FLOOR = 1.0 / 3.0


def make_kernel(name: str, num_dims: int, max_degree: int | None = None, num_projections: int | None = None) -> Kernel:
    r"""A kernel by name, with one lengthscale per input dimension.

    * ``additive-rbf`` / ``additive-matern52``: :math:`s \sum_d w_d\, k(x_d, x'_d)` with a
      one-dimensional RBF / Matérn-5/2 kernel per dimension and learned weights :math:`w_d`
      (:class:`lazykern.kernels.AdditiveStructureKernel`, one formula, one reduction);
    * ``additive-ng``: interaction orders 1..R of one-dimensional RBF kernels, one variance per
      order (:class:`lazykern.kernels.NewtonGirardAdditiveKernel`, no ``ScaleKernel``);
    * ``oak``: the same over RBF kernels made orthogonal to a standard normal input measure
      (:class:`lazykern.kernels.OrthogonalAdditiveKernel`, for standardized inputs);
    * ``dpa-matern52`` / ``dpa-rbf`` / ``rpa-matern52`` / ``rpa-rbf``: :math:`s \sum_j w_j\, k(u_j^\top
      \Lambda^{-1} x, u_j^\top \Lambda^{-1} x')` over J unit directions :math:`u_j`, diverse (DPA) or
      random (RPA), fixed, with learned weights :math:`w_j` and one learned lengthscale per input
      dimension, :math:`\Lambda = \operatorname{diag}(\ell)` (``input_lengthscales=True``; the base
      kernel's lengthscale stays at 1, as it would only scale every :math:`\ell_i` alike)
      (:class:`lazykern.kernels.ProjectedAdditiveKernel`);
    * ``dpa-matern52-learned``: :math:`s \sum_j w_j\, k(u_j^\top x, u_j^\top x')` with the directions
      :math:`u_j` learned from DPA's (``learn_projections=True``); their lengths take the place of
      the lengthscales, so there are no input lengthscales and the base lengthscale stays at 1;
    * ``rbf-ard`` / ``matern52-ard``: lazykern's full-dimensional ARD kernels
      (:class:`lazykern.kernels.RBFKernel`, :class:`lazykern.kernels.MaternKernel`);
    * ``gpytorch-rbf-ard``: GPyTorch's own :class:`gpytorch.kernels.RBFKernel`, the baseline.

    Args:
        name: one of :data:`~lazykern.kernel_names.KERNELS`.
        num_dims: number of input dimensions d.
        max_degree: highest interaction order R of ``additive-ng`` and ``oak`` (default
            :data:`DEFAULT_MAX_DEGREE`: all orders); must be ``None`` for the other kernels.
        num_projections: number of projections J of the projected kernels (default
            :func:`~lazykern.kernel_names.default_num_projections`); must be ``None`` for the others.

    Example:
        >>> from lazykern.regression import make_kernel
        >>> type(make_kernel("additive-rbf", 26).base_kernel).__name__
        'AdditiveStructureKernel'
        >>> make_kernel("oak", 26, max_degree=2).outputscale.shape
        torch.Size([2])
        >>> make_kernel("additive-ng", 8).max_degree   # all orders by default
        8
        >>> projected = make_kernel("dpa-matern52", 8, num_projections=12).base_kernel
        >>> projected.projections.shape, projected.input_lengthscale.shape
        (torch.Size([8, 12]), torch.Size([1, 8]))
    """
    check_positive_int("num_dims", num_dims)
    if name not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}; got {name!r}")
    check_positive_int("num_projections", num_projections, optional=True)
    if num_projections is not None and name not in PROJECTED_KERNELS:
        raise ValueError(f"num_projections applies to the {', '.join(PROJECTED_KERNELS)} kernels only, not {name!r}")
    if name in INTERACTION_KERNELS:
        if max_degree is None:
            degree = num_dims if DEFAULT_MAX_DEGREE is None else min(DEFAULT_MAX_DEGREE, num_dims)
        else:
            degree = max_degree
        if name == "oak":
            return lazy_kernels.OrthogonalAdditiveKernel(num_dims, degree)
        return lazy_kernels.NewtonGirardAdditiveKernel(lazy_kernels.RBFKernel(ard_num_dims=num_dims), num_dims, degree)
    if max_degree is not None:
        raise ValueError(f"max_degree applies to the {' and '.join(INTERACTION_KERNELS)} kernels only, not {name!r}")
    return ScaleKernel(_scaled_base(name, num_dims, num_projections))


def _scaled_base(name: str, num_dims: int, num_projections: int | None) -> Kernel:
    """The kernel inside the ``ScaleKernel`` of a named kernel without interaction orders."""
    if name == "additive-rbf":
        return lazy_kernels.AdditiveStructureKernel(
            lazy_kernels.RBFKernel(ard_num_dims=num_dims), num_dims=num_dims, component_scales=True
        )
    if name == "additive-matern52":
        return lazy_kernels.AdditiveStructureKernel(
            lazy_kernels.MaternKernel(nu=2.5, ard_num_dims=num_dims), num_dims=num_dims, component_scales=True
        )
    if name in PROJECTED_KERNELS:
        learned = name.endswith("-learned")
        construction, family = name.removesuffix("-learned").split("-")
        one_dimensional = lazy_kernels.RBFKernel() if family == "rbf" else lazy_kernels.MaternKernel(nu=2.5)
        one_dimensional.raw_lengthscale.requires_grad_(False)
        count = default_num_projections(num_dims) if num_projections is None else num_projections
        return lazy_kernels.ProjectedAdditiveKernel(one_dimensional, num_dims, count, projections=construction,
                                                    learn_projections=learned, input_lengthscales=not learned)
    if name == "rbf-ard":
        return lazy_kernels.RBFKernel(ard_num_dims=num_dims)
    if name == "matern52-ard":
        return lazy_kernels.MaternKernel(nu=2.5, ard_num_dims=num_dims)
    return gpytorch.kernels.RBFKernel(ard_num_dims=num_dims)


class ExactGPRegressor(gpytorch.models.ExactGP):
    r"""Exact GP with a constant mean and a given covariance: :math:`f \sim \mathcal{GP}(c, k)`.

    Args:
        train_x: ``(n, d)`` training inputs.
        train_y: ``(n,)`` training targets.
        likelihood: a :class:`gpytorch.likelihoods.GaussianLikelihood`.
        kernel: the covariance module (e.g. from :func:`make_kernel`).

    Example:
        >>> import torch, gpytorch
        >>> from lazykern.regression import ExactGPRegressor, make_kernel
        >>> x, y = torch.randn(50, 2), torch.randn(50)
        >>> model = ExactGPRegressor(x, y, gpytorch.likelihoods.GaussianLikelihood(), make_kernel("rbf-ard", 2))
        >>> model(x).mean.shape
        torch.Size([50])
    """

    def __init__(self, train_x: Tensor, train_y: Tensor, likelihood: gpytorch.likelihoods.Likelihood,
                 kernel: Kernel) -> None:
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        """The GP prior at ``x``: constant mean, the model's kernel."""
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def build_model(
    train_x: Tensor, train_y: Tensor, kernel: str | Kernel, max_degree: int | None = None,
    num_projections: int | None = None, noise_floor: float | None = None,
) -> tuple[ExactGPRegressor, gpytorch.likelihoods.GaussianLikelihood]:
    """An :class:`ExactGPRegressor` and its Gaussian likelihood, in the dtype and on the device of ``train_x``.

    A kernel given by name is built by :func:`make_kernel`, initialized by :func:`initialize`, and
    its lengthscales of binary and categorical inputs bounded below by
    :func:`floor_discrete_lengthscales`; a kernel module is used as it is. The noise variance starts at
    :data:`INITIAL_NOISE`, or that much above ``noise_floor`` (its lower bound; GPyTorch's is 1e-4).

    A floor keeps a flexible kernel from explaining the noise: learned projections (:math:`dJ` direction
    parameters, as many as the training points) drive the noise to GPyTorch's bound and predict worse
    than with it held at ARD RBF's (``docs/projected.rst``, "Bounding the noise"; the floor a recipe
    takes is :class:`~lazykern.regression.NoiseFloor`).

    Args:
        train_x: ``(n, d)`` float32/float64 training inputs.
        train_y: ``(n,)`` training targets (same dtype and device).
        kernel: a name from :data:`~lazykern.kernel_names.KERNELS` or a kernel module.
        max_degree: highest interaction order of a named ``additive-ng`` or ``oak`` kernel.
        num_projections: number of projections of a named projected kernel (``dpa-...``, ``rpa-...``).
        noise_floor: lower bound of the noise variance (in the units of ``train_y`` squared), or ``None``.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model
        >>> model, likelihood = build_model(torch.randn(50, 3), torch.randn(50), "additive-rbf")
    """
    check_floating_matrix("train_x", train_x)
    if train_x.dim() != 2:
        raise ValueError(f"train_x must have shape (n, d), got {tuple(train_x.shape)}")
    if not isinstance(train_y, Tensor) or train_y.shape != train_x.shape[:1]:
        got = tuple(train_y.shape) if isinstance(train_y, Tensor) else type(train_y).__name__
        raise ValueError(f"train_y must be a tensor of shape ({train_x.shape[0]},), got {got}")
    if noise_floor is not None:
        noise_floor = check_positive_number("noise_floor", noise_floor)
    if isinstance(kernel, str):
        kernel = make_kernel(kernel, train_x.shape[1], max_degree, num_projections)
        initialize(kernel, train_x.shape[1])
        floor_discrete_lengthscales(kernel, train_x)
    elif max_degree is not None or num_projections is not None:
        flag = "max_degree" if max_degree is not None else "num_projections"
        raise ValueError(f"{flag} applies to kernels given by name; set it on the kernel module instead")
    likelihood = gpytorch.likelihoods.GaussianLikelihood(  # None: GPyTorch's bound, 1e-4
        noise_constraint=None if noise_floor is None else GreaterThan(noise_floor))
    likelihood.noise = INITIAL_NOISE + (noise_floor or 0.0)
    model = ExactGPRegressor(train_x, train_y.to(train_x), likelihood, kernel)
    model.to(dtype=train_x.dtype, device=train_x.device)
    return model, likelihood


def initialize(kernel: Kernel, num_dims: int) -> None:
    r"""Dimension-aware lengthscales: :math:`\sqrt w` for a kernel term over :math:`w` dimensions.

    ARD and other full-dimensional stationary kernels: :math:`w = d`; interaction kernels
    (:class:`~lazykern.kernels.NewtonGirardAdditiveKernel`, OAK): :math:`w = R`, the highest order;
    :class:`~lazykern.kernels.GroupAdditiveKernel`: the largest group; first-order additive
    kernels: :math:`w = 1`, and so :class:`~lazykern.kernels.ProjectedAdditiveKernel` (each term sees one
    projection :math:`u^\top x` of a unit direction, of variance about 1 for standardized inputs).
    A ``ScaleKernel`` is looked through. Inputs are assumed standardized.

    A Newton–Girard kernel also starts with :data:`TOP_ORDER_SHARE` of its variance on the top
    order and the rest spread evenly over the lower ones: with all orders (:math:`R = d`) mostly
    the ARD RBF kernel at ARD's own initialization, plus some of every lower order, so training
    starts near where ARD's does and moves variance down where the data is additive. With equal
    order variances (the kernel's default) the likelihood can be flat towards the interactions, and
    L-BFGS stop at the mean predictor; a share much closer to 1 leaves float32 line searches little
    room before the matrix stops being positive definite (``docs/uci.rst``, "The recipe's choices").

    Args:
        kernel: the covariance module (e.g. from :func:`make_kernel`).
        num_dims: number of input dimensions d.

    Example:
        >>> from lazykern.regression import initialize, make_kernel
        >>> kernel = make_kernel("rbf-ard", 16)
        >>> initialize(kernel, 16)
        >>> kernel.base_kernel.lengthscale.mean().item()
        4.0
    """
    check_positive_int("num_dims", num_dims)
    inner, width, base = _lengthscale_owner(kernel, num_dims)
    base.lengthscale = torch.full_like(base.lengthscale, math.sqrt(width))
    orders = inner.order_variances
    # Orthogonal orders (OAK) are not nested products: its top order is not the ARD kernel.
    if orders is not None and inner.input_measure is None and orders.shape[-1] > 1:
        lower = (1.0 - TOP_ORDER_SHARE) / (orders.shape[-1] - 1)
        variances = torch.full_like(orders, lower)
        variances[..., -1] = TOP_ORDER_SHARE
        inner.order_variances = variances


def _lengthscale_owner(kernel: Kernel, num_dims: int) -> tuple[LazyKernel, int, Kernel]:
    """``(inner, w, base)``: the family of the kernel inside a ``ScaleKernel``
    (:func:`~lazykern.kernels.family_of`), the number of dimensions w its widest term multiplies, and
    the module that holds the lengthscales."""
    inner, _ = lazy_kernels.family_of(kernel)
    base = None if inner is None else inner.lengthscale_kernel
    if base is None:
        raise TypeError(f"initialize knows stationary, additive and interaction kernels, got {type(kernel).__name__}")
    return inner, max(inner.lengthscale_widths(num_dims)), base


def discrete_columns(train_x: Tensor) -> dict[int, float]:
    """The binary and categorical columns of ``train_x`` and the smallest gap between two of each
    one's values: columns with 2 to :data:`DISCRETE_MAX_LEVELS` distinct values, and at most half
    as many as there are rows (so that a handful of continuous points is not taken for categories).

    Example:
        >>> import torch
        >>> from lazykern.regression import discrete_columns
        >>> x = torch.stack([torch.arange(40.0) % 2, torch.randn(40), (torch.arange(40.0) % 4) / 2], -1)
        >>> discrete_columns(x)   # column 0: binary, gap 1; column 2: four levels 0.5 apart
        {0: 1.0, 2: 0.5}
    """
    check_floating_matrix("train_x", train_x)
    found = {}
    for column in range(train_x.shape[-1]):
        levels = torch.unique(train_x[..., column].detach())
        if 2 <= levels.numel() <= min(DISCRETE_MAX_LEVELS, train_x.shape[-2] // 2):
            found[column] = float(levels.diff().min())
    return found


def floor_discrete_lengthscales(kernel: Kernel, train_x: Tensor) -> dict[int, float]:
    r"""Bound the lengthscale of each binary or categorical input (:func:`discrete_columns`) below by
    :data:`DISCRETE_FLOOR` times the smallest gap :math:`\Delta` between its values; returns the floors.

    An input with a few values shows the likelihood the kernel at distances 0 and multiples of
    :math:`\Delta` only. Once the lengthscale is a fraction of :math:`\Delta` the kernel between
    different values is close to 0 and stays so as it shrinks: the likelihood is flat there, and
    the optimizer may drift to lengthscales near 0 (as OAK's did on binary inputs, ``docs/uci.rst``)
    where float32 rounding and the orthogonal kernel's normalizers break down. At :math:`\ell = \Delta / 3` the
    kernel between neighbouring values is already 0.011 (RBF) or 0.027 (Matérn 5/2): the floor
    keeps the model able to treat the values as unrelated and removes only the flat direction.
    The lengthscale starts at twice its floor where :func:`initialize`'s start is below it.

    Applies to kernels with one lengthscale per input: the ARD, additive and interaction kernels, and
    the input lengthscales of a projected kernel (:math:`\ell_i`, divided out before projecting onto
    unit directions: each term's lengthscale along input :math:`i` is :math:`\ell_i / |w_{ij}| \ge
    \ell_i`, so the floor holds in every term). A projected kernel without input lengthscales has
    nothing per input to bound.

    Args:
        kernel: the covariance module (e.g. from :func:`make_kernel`).
        train_x: ``(n, d)`` training inputs.

    Example:
        >>> import torch
        >>> from lazykern.regression import floor_discrete_lengthscales, make_kernel
        >>> x = torch.stack([torch.arange(40.0) % 2, torch.randn(40)], -1)
        >>> kernel = make_kernel("rbf-ard", 2)
        >>> floor_discrete_lengthscales(kernel, x)
        {0: 0.3333333333333333}
        >>> _ = kernel.base_kernel.raw_lengthscale.data.fill_(-50.0)   # as far down as training could go
        >>> [round(v, 4) for v in kernel.base_kernel.lengthscale.squeeze().tolist()]   # the binary input stops at 1/3
        [0.3333, 0.0]
    """
    check_floating_matrix("train_x", train_x)
    inner, _, _ = _lengthscale_owner(kernel, train_x.shape[-1])
    owner, name = inner.per_input_lengthscale()
    columns = discrete_columns(train_x)
    lengthscale = getattr(owner, name)
    if not columns or lengthscale is None or lengthscale.shape[-1] != train_x.shape[-1]:
        return {}
    lengthscale = lengthscale.detach()
    floor = torch.zeros_like(lengthscale)
    for column, gap in columns.items():
        floor[..., column] = DISCRETE_FLOOR * gap
    owner.register_constraint(f"raw_{name}", GreaterThan(floor))
    setattr(owner, name, torch.maximum(lengthscale, 2 * floor))
    return {column: DISCRETE_FLOOR * gap for column, gap in columns.items()}


def hyperparameters(model: torch.nn.Module) -> dict[str, float | list[float]]:
    """The model's constrained hyperparameters by name (lengthscales, scales, noise, mean), as floats:
    a parameter ``raw_x`` under a constraint is reported as ``x``, the constraint's transform of it.

    Args:
        model: a GPyTorch model (its ``named_parameters_and_constraints``).

    Returns:
        a dict from the dotted name (``raw_`` removed) to a float, or a list of floats for a
        parameter of more than one entry.

    Example:
        >>> import torch
        >>> from lazykern.regression import build_model, hyperparameters
        >>> model, _ = build_model(torch.randn(10, 2), torch.randn(10), "rbf-ard")
        >>> sorted(hyperparameters(model))  # doctest: +NORMALIZE_WHITESPACE
        ['covar_module.base_kernel.lengthscale', 'covar_module.outputscale',
         'likelihood.noise_covar.noise', 'mean_module.constant']
    """
    out: dict[str, float | list[float]] = {}
    for name, raw, constraint in model.named_parameters_and_constraints():
        value = raw if constraint is None else constraint.transform(raw)
        prefix, _, leaf = name.rpartition(".")
        values = value.detach().cpu().reshape(-1).tolist()
        out[f"{prefix}.{leaf.removeprefix('raw_')}".lstrip(".")] = values[0] if len(values) == 1 else values
    return out
