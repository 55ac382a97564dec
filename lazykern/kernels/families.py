"""GPyTorch's own kernels described by lazykern's kernel families: the one place that knows them.

Initialisations, priors and the component analysis ask a kernel what its family knows (its
lengthscales and the widths of its terms, the weights that share its variance, its first-order
components: :class:`~lazykern.kernels.base.LazyKernel`'s family methods). :func:`family_of` answers
for whatever kernel a model holds: a lazykern kernel answers itself, and GPyTorch's ``ScaleKernel``,
``AdditiveStructureKernel`` and stationary kernels are described here, so that no caller keeps a
list of kernel classes.
"""

from __future__ import annotations

import gpytorch
from gpytorch.kernels import Kernel, ScaleKernel

from .additive_structure import AdditiveStructureKernel
from .base import LazyKernel
from .stationary import SUPPORTED_BASES

__all__ = ["family_of"]


def family_of(kernel: Kernel) -> tuple[LazyKernel | None, ScaleKernel | None]:
    r"""The lazykern kernel whose family methods describe ``kernel``, and the GPyTorch
    ``ScaleKernel`` around it (``None`` where there is none):

    * ``ScaleKernel(k)``: what ``k`` gives, and the ``ScaleKernel``;
    * a lazykern kernel (:class:`~lazykern.kernels.base.LazyKernel`): itself;
    * GPyTorch's ``AdditiveStructureKernel(base, D)`` of an RBF, Matérn, RQ or periodic ``base``:
      lazykern's :class:`~lazykern.kernels.AdditiveStructureKernel` on the same ``base``, with unit
      term weights;
    * any other kernel with a lengthscale of its own (GPyTorch's ``RBFKernel``, ...): one
      full-dimensional term whose lengthscales that kernel holds (the base class's defaults);
    * anything else: ``None``.

    A description of a GPyTorch kernel shares its hyperparameters: a lengthscale (or a prior on it)
    set through :attr:`~lazykern.kernels.base.LazyKernel.lengthscale_kernel` is the given kernel's.

    Args:
        kernel: a GPyTorch kernel (a model's ``covar_module``).

    Returns:
        ``(family, scale_kernel)``.

    Example:
        >>> import gpytorch, lazykern
        >>> rbf = gpytorch.kernels.RBFKernel(ard_num_dims=3)
        >>> family, scale = lazykern.kernels.family_of(gpytorch.kernels.ScaleKernel(rbf))
        >>> family.lengthscale_kernel is rbf, family.lengthscale_widths(3), type(scale).__name__
        (True, (3, 3, 3), 'ScaleKernel')
    """
    scale = kernel if isinstance(kernel, ScaleKernel) else None
    inner = kernel if scale is None else kernel.base_kernel
    if isinstance(inner, LazyKernel):
        return inner, scale
    if isinstance(inner, gpytorch.kernels.AdditiveStructureKernel) and isinstance(inner.base_kernel, SUPPORTED_BASES):
        return AdditiveStructureKernel(inner.base_kernel, inner.num_dims, active_dims=inner.active_dims), scale
    if getattr(inner, "has_lengthscale", False):
        return _OwnLengthscale(inner), scale
    return None, scale


class _OwnLengthscale(LazyKernel):
    """One full-dimensional term (the base class's answers) whose lengthscales a GPyTorch kernel
    holds: a description, never evaluated."""

    def __init__(self, kernel: Kernel) -> None:
        super().__init__()
        # In a tuple, not a submodule: the description owns nothing of the kernel it describes.
        self._described = (kernel,)

    @property
    def lengthscale_kernel(self) -> Kernel:
        return self._described[0]
