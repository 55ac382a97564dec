"""GPyTorch kernels, each one lazy formula for whichever engine :mod:`lazykern.backend` picks (not
only KeOps): :class:`~lazykern.kernels.base.LazyKernel` is their base."""

from .additive_structure import AdditiveStructureKernel
from .base_kernels import MaternKernel, PeriodicKernel, RBFKernel, RQKernel
from .combination import ProductKernel
from .families import family_of
from .interactions import GroupAdditiveKernel, NewtonGirardAdditiveKernel, OrthogonalAdditiveKernel
from .projected import ProjectedAdditiveKernel

__all__ = [
    "AdditiveStructureKernel",
    "GroupAdditiveKernel",
    "MaternKernel",
    "NewtonGirardAdditiveKernel",
    "OrthogonalAdditiveKernel",
    "PeriodicKernel",
    "ProductKernel",
    "ProjectedAdditiveKernel",
    "RBFKernel",
    "RQKernel",
    "family_of",
]
