"""GPyTorch kernels backed by lazy KeOps formulas."""

from .additive_structure import AdditiveStructureKernel
from .base_kernels import MaternKernel, PeriodicKernel, RBFKernel, RQKernel
from .combination import ProductKernel
from .interactions import GroupAdditiveKernel, NewtonGirardAdditiveKernel, OrthogonalAdditiveKernel

__all__ = [
    "AdditiveStructureKernel",
    "GroupAdditiveKernel",
    "MaternKernel",
    "NewtonGirardAdditiveKernel",
    "OrthogonalAdditiveKernel",
    "PeriodicKernel",
    "ProductKernel",
    "RBFKernel",
    "RQKernel",
]
