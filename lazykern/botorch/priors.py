r"""Priors for the terms of additive kernels (:func:`additive_priors`): BoTorch's dimension-scaled
lengthscale prior for the dimensions each term acts on, and priors on the term weights that give
the sum a prior variance of about 1.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.priors import LogNormalPrior
from torch import Tensor

from ..kernels import family_of
from ..kernels.base import LazyKernel

__all__ = ["additive_priors"]


# Hvarfner, Hellsten & Nardi (2024), BoTorch's defaults: lengthscale ~ LogNormal(sqrt(2) + log(d) / 2, sqrt(3))
# for a kernel on d dimensions.
_LENGTHSCALE_LOC, _LENGTHSCALE_SCALE = math.sqrt(2.0), math.sqrt(3.0)
# Term weights and variances: a factor e either way is one standard deviation.
_WEIGHT_SCALE = 1.0


def _register_lognormal(module: gpytorch.Module, name: str, loc: float | Tensor, scale: float,
                        initial: Tensor | float) -> None:
    """A LogNormal prior on the positive hyperparameter ``name`` of ``module`` (read and set through its
    property), and the hyperparameter set to ``initial``."""
    loc = torch.as_tensor(loc, dtype=torch.float64)
    module.register_prior(f"{name}_prior", LogNormalPrior(loc, torch.full_like(loc, scale)),
                          lambda m: getattr(m, name), lambda m, v: setattr(m, name, v))
    setattr(module, name, initial)


def additive_priors(kernel: Kernel) -> Kernel:
    r"""Sets priors suited to an additive kernel's terms on ``kernel`` (in place) and returns it: the
    lengthscale prior BoTorch's ``SingleTaskGP`` uses by default (Hvarfner, Hellsten & Nardi, 2024,
    *Vanilla Bayesian optimization performs great in high dimensions*), applied to the dimensions each
    term acts on rather than to all of them, and priors on the term weights that give the sum a prior
    variance of about 1 (BoTorch standardises the outcomes).

    BoTorch's lengthscale prior for a kernel on :math:`d` dimensions is
    :math:`\log \ell \sim \mathcal N(\sqrt 2 + \tfrac12 \log d,\ 3)`: distances between points of the
    unit cube grow as :math:`\sqrt d`, so the lengthscale does too. A lengthscale gets the prior for
    :math:`d = k`, the dimensions of the widest term it scales
    (:meth:`~lazykern.kernels.base.LazyKernel.lengthscale_widths`):

    * :class:`~lazykern.kernels.AdditiveStructureKernel` (and GPyTorch's) and
      :class:`~lazykern.kernels.ProjectedAdditiveKernel`: one-dimensional terms, :math:`k = 1`
      (median :math:`\ell = e^{\sqrt 2} \approx 4.1`, mode :math:`e^{\sqrt 2 - 3} \approx 0.20`);
    * :class:`~lazykern.kernels.GroupAdditiveKernel`: the largest group the dimension is in;
    * :class:`~lazykern.kernels.NewtonGirardAdditiveKernel` and
      :class:`~lazykern.kernels.OrthogonalAdditiveKernel`: the order-:math:`r` term is a product over
      :math:`r` dimensions of one-dimensional kernels sharing each dimension's lengthscale, so the
      prior is that of the highest order, :math:`k =` ``max_degree``.

    Lengthscales start at the prior's mode, as BoTorch's do. The weights
    (:attr:`~lazykern.kernels.base.LazyKernel.variance_weights`): a sum of :math:`T` terms of
    unit variance has variance :math:`T`, so

    * learned per-term weights ``component_scales`` of an additive, group or projected kernel get
      :math:`\log s_t \sim \mathcal N(-\log T, 1)` and start at :math:`1/T`, and a ``ScaleKernel``
      around the kernel :math:`\log \sigma^2 \sim \mathcal N(0, 1)`, starting at 1; without
      ``component_scales`` the ``ScaleKernel``'s outputscale takes the :math:`1/T` prior instead;
    * the :math:`R` order variances of an interaction kernel get :math:`\log \sigma_r^2 \sim
      \mathcal N(-\log R, 1)`, starting at :math:`1/R` (each order has variance :math:`\sigma_r^2`
      when the per-dimension weights are 1), its per-dimension weights :math:`\log s_d \sim
      \mathcal N(0, 1)` and a ``ScaleKernel`` around it :math:`\log \sigma^2 \sim \mathcal N(0, 1)`.

    An additive kernel with neither learned weights nor a ``ScaleKernel`` keeps its fixed variance
    :math:`T`. The likelihood keeps BoTorch's noise prior. What the priors change in Bayesian
    optimisation is measured in :doc:`/botorch` (``examples/bo_additive.py``).

    Args:
        kernel: a lazykern :class:`~lazykern.kernels.AdditiveStructureKernel`,
            :class:`~lazykern.kernels.GroupAdditiveKernel`,
            :class:`~lazykern.kernels.NewtonGirardAdditiveKernel` (or
            :class:`~lazykern.kernels.OrthogonalAdditiveKernel`),
            :class:`~lazykern.kernels.ProjectedAdditiveKernel`, or GPyTorch's
            ``AdditiveStructureKernel`` of an RBF, Matérn, RQ or periodic kernel; bare or inside a
            ``ScaleKernel``.

    Returns:
        ``kernel``, with the priors registered and the hyperparameters at their starting values.

    Example:
        >>> import torch, gpytorch, lazykern, lazykern.botorch
        >>> from botorch.models import SingleTaskGP
        >>> kernel = lazykern.botorch.additive_priors(gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(
        ...     lazykern.RBFKernel(ard_num_dims=20), num_dims=20, component_scales=True)))
        >>> sorted(name for name, *_ in kernel.named_priors())
        ['base_kernel.base_kernel.lengthscale_prior', 'base_kernel.component_scales_prior', 'outputscale_prior']
        >>> round(float(kernel.base_kernel.base_kernel.lengthscale.detach()[0, 0]), 3)   # the prior's mode
        0.205
        >>> model = SingleTaskGP(torch.rand(8, 20, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64),
        ...                      covar_module=kernel)
    """
    terms, scale = family_of(kernel)
    base = None if terms is None else terms.lengthscale_kernel
    if terms is None or base is None or terms.variance_weights is None:
        inner = f"({type(scale.base_kernel).__name__})" if scale is not None else ""
        raise TypeError(
            "additive_priors: kernel must be an AdditiveStructureKernel (lazykern's or GPyTorch's), GroupAdditiveKernel, "
            "NewtonGirardAdditiveKernel or ProjectedAdditiveKernel whose base kernel has a lengthscale, bare or inside "
            f"ScaleKernel; got {type(kernel).__name__}{inner}")
    _weight_priors(terms, scale)
    widths = torch.tensor(terms.lengthscale_widths(base.lengthscale.shape[-1]), dtype=torch.float64)
    if base.lengthscale.shape[-1] == 1:  # one lengthscale shared by every term: the widest term's prior
        widths = widths.max(dim=0, keepdim=True).values
    loc = _LENGTHSCALE_LOC + 0.5 * widths.log()
    _register_lognormal(base, "lengthscale", loc, _LENGTHSCALE_SCALE,
                        (loc - _LENGTHSCALE_SCALE**2).exp().to(base.lengthscale).expand_as(base.lengthscale))
    return kernel


def _weight_priors(terms: LazyKernel, scale: ScaleKernel | None) -> None:
    """The priors of :func:`additive_priors` on the weights that share the variance of ``terms``
    among its T terms (each 1/T), on per-dimension factors besides them (1), and on the output scale
    of ``scale`` (1, or the terms' 1/T where their weights are fixed)."""
    assert terms.variance_weights is not None  # additive_priors takes only kernels that have them
    name, count = terms.variance_weights
    share, outer_share = 1.0 / count, 1.0
    if hasattr(terms, f"raw_{name}"):
        _register_lognormal(terms, name, math.log(share), _WEIGHT_SCALE,
                            torch.full_like(getattr(terms, name).detach(), share))
    else:
        outer_share = share
    if name != "component_scales" and hasattr(terms, "raw_component_scales"):
        _register_lognormal(terms, "component_scales", 0.0, _WEIGHT_SCALE, 1.0)
    if scale is not None:
        _register_lognormal(scale, "outputscale", math.log(outer_share), _WEIGHT_SCALE, outer_share)
