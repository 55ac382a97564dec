"""Linear operators users hold: lazy kernel matrices (one operator per file)."""

from .kernel_operator import LazyKernelOperator

__all__ = ["LazyKernelOperator"]
