"""Solvers on lazy kernels: batched preconditioned CG, preconditioners, kernel ridge regression.

Everything here needs only ``A @ X``, the diagonal and a few rows of an operator, so a lazykern
kernel operator is never formed as an N x N matrix.
"""

from .cg import CGResult, cg, lanczos_logdet
from .kernel_ridge import KernelRidge
from .preconditioners import GridPreconditioner, JacobiPreconditioner, PivotedCholeskyPreconditioner, Preconditioner

__all__ = [
    "CGResult",
    "GridPreconditioner",
    "JacobiPreconditioner",
    "KernelRidge",
    "PivotedCholeskyPreconditioner",
    "Preconditioner",
    "cg",
    "lanczos_logdet",
]
