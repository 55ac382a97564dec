"""Linear operators users hold: lazy kernel matrices (one operator per file), their dense cache,
and the view of any operator that iterative solvers (lazykern's, SciPy's) apply."""

from .dense_cache import DENSE_CACHE, DenseCache
from .kernel_operator import LazyKernelOperator
from .preconditioning import GridPreconditionerOperator, attach_grid_preconditioner, expire_reused, grid_preconditioner
from .scipy_view import as_scipy, evaluate_kernels, operator_matmul

__all__ = [
    "DENSE_CACHE", "DenseCache", "GridPreconditionerOperator", "LazyKernelOperator", "as_scipy", "attach_grid_preconditioner",
    "evaluate_kernels", "expire_reused", "grid_preconditioner", "operator_matmul",
]
