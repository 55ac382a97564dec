"""lazykern: lazy symbolic kernels on KeOps.

Additive GP kernels and empirical neural tangent kernels as symbolic reductions that never form
N x M x d (nor, unless it fits a memory budget, N x M).
"""

from . import components, data, formulas, kernels, ntk, operators, regression, settings, solvers
from .kernels import (
    AdditiveStructureKernel,
    GroupAdditiveKernel,
    MaternKernel,
    NewtonGirardAdditiveKernel,
    OrthogonalAdditiveKernel,
    PeriodicKernel,
    RBFKernel,
    RQKernel,
)
from .operators import LazyKernelOperator
from .precompile import precompile
from .solvers import KernelRidge

__version__ = "0.1.0"

__all__ = [
    "AdditiveStructureKernel",
    "GroupAdditiveKernel",
    "KernelRidge",
    "LazyKernelOperator",
    "MaternKernel",
    "NewtonGirardAdditiveKernel",
    "OrthogonalAdditiveKernel",
    "PeriodicKernel",
    "RBFKernel",
    "RQKernel",
    "components",
    "data",
    "formulas",
    "kernels",
    "ntk",
    "precompile",
    "operators",
    "regression",
    "settings",
    "solvers",
]
