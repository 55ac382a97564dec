r"""Empirical neural tangent kernels of real architectures, lazy and exact.

:func:`empirical_ntk` returns :math:`\Theta(x, x') = J(x) J(x')^\top` as a ``linear_operator``
``LinearOperator`` (:class:`NTKOperator`) built from per-layer features: one rule per layer type
(:mod:`lazykern.ntk.rules`), each layer in the implicit or explicit form its cost rule picks
(:mod:`lazykern.ntk.plan`, reported by ``empirical_ntk(..., plan=True)``); pairwise sums run on the
kernels' engine (:mod:`lazykern.backend`), products also through the network itself
(:mod:`lazykern.ntk.linearized`). :class:`NTKKernel` wraps the trace NTK of a fixed network as a
GPyTorch kernel.
"""

from .kernel import NTKKernel
from .operator import BACKENDS, MODES, NTKOperator, empirical_ntk
from .plan import NTKPlan, choose_backend, choose_form
from .rules import FORMS, NTKFallbackWarning

__all__ = [
    "BACKENDS",
    "FORMS",
    "MODES",
    "NTKFallbackWarning",
    "NTKKernel",
    "NTKOperator",
    "NTKPlan",
    "choose_backend",
    "choose_form",
    "empirical_ntk",
]
