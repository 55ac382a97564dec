r"""Products with one-dimensional half-integer Matérn kernels by two linear recurrences, in C.

For :math:`\nu = p + \tfrac12` (:math:`p = 0, 1, 2`) the one-dimensional Matérn kernel is a
polynomial of degree :math:`p` times an exponential of the scaled distance :math:`u = c\,|t|`
(:math:`c = 1, \sqrt3, \sqrt5`; inputs arrive divided by the lengthscale):

.. math::

    k(t) = \pi(u)\, e^{-u}, \qquad
    \pi(u) = 1,\quad 1 + u,\quad 1 + u + u^2/3 .

Its derivative is :math:`k'(t) = \operatorname{sign}(t)\, c\, (\pi' - \pi)(u)\, e^{-u}`, of the same
form. So both :math:`a_i = \sum_j k(x_i - z_j)\, v_j` and :math:`b_i = \sum_j k'(x_i - z_j)\, v_j`
are combinations of the moments

.. math::

    S_q(i) = \sum_{z_j \le x_i} e^{-u_{ij}}\, \frac{u_{ij}^q}{q!}\, v_j, \qquad
    u_{ij} = c\,(x_i - z_j), \quad q = 0, \dots, p,

and of their mirror images over :math:`z_j > x_i`. Walking the points of both sets in sorted
order, the binomial theorem moves the moments from one point to the next, a gap
:math:`\delta = c\,(x_{(k)} - x_{(k-1)}) \ge 0` apart:

.. math::

    S_q \leftarrow \sum_{r \le q} e^{-\delta} \frac{\delta^{q-r}}{(q-r)!}\, S_r ,

and a source point adds its value to :math:`S_0`. Every coefficient lies in :math:`[0, 1]`
(:math:`e^{-\delta}\delta^k/k! \le 1`), so no state can overflow however short or long the
lengthscale, and a gap too wide for :math:`e^{-\delta}` to be represented zeroes it instead of
forming :math:`0 \cdot \infty`. This is the state-space (Kalman) form of a Matérn process
(Hartikainen & Särkkä 2010) written for exact products instead of filtering: :math:`O((N + M) p)`
per dimension and column, exact up to rounding.

Ties: the merged order puts sources before targets of equal value, so the ascending walk counts a
coincident source (:math:`k(0) = 1`) and the descending walk does not. For :math:`K(X, X)` the
walks go over the one set, each point adding its value before it reads the moments when
ascending and after when descending, which again counts every coincident pair once. The derivative at
:math:`t = 0` is 0 (the convention of the pairwise engines, whose :math:`\sqrt{q + \epsilon}`
has a zero derivative there); only :math:`\nu = \tfrac12` has :math:`(\pi' - \pi)(0) \ne 0`, and its
ascending walk subtracts the coincident sources' part, summed in the walk itself.

Everything accumulates in float64 whatever the inputs' dtype: float32 recurrences lose about
1e-4 relative at :math:`10^6` points. The walks are C, ``recurrences.c`` next to this module
(with ``combine.h``), compiled by :func:`lazykern.native.load_file`.
"""

from __future__ import annotations

import ctypes
import os

import torch
from torch import Tensor

from ..native import load_file
from .combine import USES_ARGTYPES, reduce

__all__ = ["MATERN_POLYNOMIALS", "matern_reduce"]

#: nu -> (c, coefficients of pi(u) times q!, coefficients of (pi' - pi)(u) times q!), q = 0..p:
#: the factors q! turn the moments S_q (which carry u^q / q!) into the polynomials.
MATERN_POLYNOMIALS: dict[float, tuple[float, tuple[float, ...], tuple[float, ...]]] = {
    0.5: (1.0, (1.0,), (-1.0,)),
    1.5: (3.0**0.5, (1.0, 1.0), (0.0, -1.0)),
    2.5: (5.0**0.5, (1.0, 1.0, 2.0 / 3.0), (0.0, -1.0 / 3.0, -2.0 / 3.0)),
}

#: The walks and their reductions, in C.
_SOURCE = os.path.join(os.path.dirname(__file__), "recurrences.c")

_ARGTYPES = [ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p] + USES_ARGTYPES


def matern_reduce(order: Tensor, key: Tensor, num_sources: int, values: Tensor, nu: float, scales: Tensor,
                  **uses) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The reductions of :func:`lazykern.structured.combine.reduce` (``out``, ``grad``, ``weights``) of
    the Matérn sums :math:`a_d = K_d V` and :math:`b_d = K'_d V`, for ``nu`` 0.5, 1.5 or 2.5.

    Args:
        order: ``(D, M + N)`` int64, the merged order of each dimension (an entry below
            ``num_sources`` is that source, else target ``entry - num_sources``), sources first
            among equal values.
        key: ``(D, M + N)`` float64, the sorted values.
        num_sources: ``M``, or ``-1`` when the sources are the targets (``K(X, X)``: ``order``
            is then ``(D, N)``, the order of the one set).
        values: ``(M, C)`` the sources' values (any float dtype; summed in float64).
        nu: 0.5, 1.5 or 2.5.
        scales: ``(D,)`` the per-dimension scales.

    Example:
        >>> x = torch.tensor([[0.0, 1.0]], dtype=torch.float64)      # sources 0 and 1 ...
        >>> key, order = torch.sort(torch.cat([x, x], 1), stable=True)  # ... and the same as targets
        >>> out, _, _ = matern_reduce(order, key, 2, torch.ones(2, 1), 0.5, torch.ones(1), out=True)
        >>> torch.allclose(out[:, 0], torch.full((2,), 1 + torch.e ** -1, dtype=torch.float64))
        True
    """
    c, pc, dc = MATERN_POLYNOMIALS[nu]
    coefficients = torch.tensor([pc, dc], dtype=torch.float64)
    fn = load_file(_SOURCE, "lk_matern_additive", _ARGTYPES)
    leading = (len(pc) - 1, c, coefficients[0].data_ptr(), coefficients[1].data_ptr())
    return reduce(fn, leading, order, key, num_sources, values, scales, **uses)
