"""GPyTorch kernels backed by lazy KeOps formulas."""

from .additive_structure import AdditiveStructureKernel
from .base_kernels import MaternKernel, PeriodicKernel, RBFKernel, RQKernel
from .combination import ProductKernel

__all__ = ["AdditiveStructureKernel", "MaternKernel", "PeriodicKernel", "ProductKernel", "RBFKernel", "RQKernel"]
