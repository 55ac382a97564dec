"""lazykern: lazy symbolic kernels on KeOps.

Additive GP kernels and empirical neural tangent kernels as symbolic reductions that never form
N x M x d (nor, unless it fits a memory budget, N x M).
"""

from . import data, formulas, kernels, ntk, operators, regression, settings, solvers
from .kernels import AdditiveStructureKernel, MaternKernel, PeriodicKernel, ProductKernel, RBFKernel, RQKernel
from .operators import LazyKernelOperator, as_scipy
from .precompile import precompile
from .solvers import KernelRidge

__version__ = "0.1.0"

__all__ = [
    "AdditiveStructureKernel",
    "KernelRidge",
    "LazyKernelOperator",
    "MaternKernel",
    "PeriodicKernel",
    "ProductKernel",
    "RBFKernel",
    "RQKernel",
    "as_scipy",
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
