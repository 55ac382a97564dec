r"""The structured engine: first-order additive kernels of one-dimensional terms in O((N + M) d).

A sum of one-dimensional half-integer Matérn kernels is, in each dimension, the covariance of a
Markov process: after one sort, a product is two linear recurrences
(:mod:`lazykern.structured.recurrences`), exact up to rounding. The Gaussian's sums are a fast
Gauss transform with a stated bound (:mod:`lazykern.structured.gauss`). Gradients are one more
pass with the two sets' roles exchanged (:mod:`lazykern.structured.additive`). Each dimension's sums
are reduced over the dimensions inside the walks (:mod:`lazykern.structured.combine`). ``ENGINE`` is the
engine as the chooser lists it (:mod:`lazykern.structured.engine`), whose plan of a formula is its
additive form (:mod:`lazykern.structured.forms`). The preconditioner of solves with these kernels
interpolates each term from a grid (:mod:`lazykern.structured.grid`), and the engine builds it
(:meth:`~lazykern.structured.engine.StructuredEngine.preconditioner`).
"""

from .additive import REDUCTIONS, gradients, merged_order, product
from .engine import ENGINE, StructuredEngine
from .gauss import gauss_plan, gauss_reduce
from .grid import AdditiveGrid, additive_terms
from .recurrences import MATERN_POLYNOMIALS, matern_reduce

__all__ = [
    "AdditiveGrid", "ENGINE", "MATERN_POLYNOMIALS", "REDUCTIONS", "StructuredEngine", "additive_terms", "gauss_plan",
    "gauss_reduce", "gradients", "matern_reduce", "merged_order", "product",
]
