r"""Empirical neural tangent kernels from per-layer features, lazy and exact.

:func:`empirical_ntk` returns :math:`\Theta(x, x') = J(x) J(x')^\top` as a ``linear_operator``
``LinearOperator`` built from per-layer features (:mod:`lazykern.ntk.features`); products run on
KeOps, tiled BLAS, or through the network itself (:mod:`lazykern.ntk.linearized`).
:class:`NTKKernel` wraps the trace NTK of a fixed network as a GPyTorch kernel.
"""

from .features import NTKFallbackWarning
from .kernel import NTKKernel
from .operator import BACKENDS, MODES, NTKOperator, choose_backend, empirical_ntk

__all__ = ["BACKENDS", "MODES", "NTKFallbackWarning", "NTKKernel", "NTKOperator", "choose_backend", "empirical_ntk"]
