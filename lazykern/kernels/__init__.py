"""GPyTorch kernels backed by lazy KeOps formulas."""

from .additive_structure import AdditiveStructureKernel
from .base_kernels import MaternKernel, PeriodicKernel, RBFKernel, RQKernel

__all__ = ["AdditiveStructureKernel", "MaternKernel", "PeriodicKernel", "RBFKernel", "RQKernel"]
