r"""What each dimension's sums feed, summed over the dimensions inside the C walks.

A walk over dimension :math:`d` yields, for every target :math:`i`, the sums
:math:`a_{d,i} = \sum_j k_d(x_{id} - z_{jd})\, v_j` and, where asked, the derivative sums
:math:`b_{d,i} = \sum_j k'_d(x_{id} - z_{jd})\, v_j` (rows of :math:`C` columns). Every product and
gradient of an additive kernel needs only three reductions of them over the dimensions:

.. math::

    \text{out}_i = \sum_d s_d\, a_{d,i}, \qquad
    \text{dots}_d = \sum_i \langle G_i, a_{d,i} \rangle, \qquad
    \text{point}_{d,i} = s_d\, \langle W_i, b_{d,i} \rangle

(the product, or :math:`\sum_d s_d K_d^\top G` for :math:`V`'s gradient; the scales' gradient; the
inputs' gradient, :math:`W` being the row weights of the chain rule). Reducing them row by row as
the walk produces them keeps :math:`O((N + M) C)` numbers per thread instead of the
:math:`(D, N, C)` sums, and reads each dimension's sums once, while they are in cache.

``combine.h`` (:data:`COMBINE_SOURCE`), next to this module, is the C that every family's walks
include: the ``lk_uses`` record, the row step ``lk_use_row`` and ``lk_each_dimension``, which runs
a family's per-dimension function over the dimensions in parallel with one accumulator of ``out``
per thread. :func:`reduce` is the Python side: it allocates what is asked for and calls a
family's compiled entry point, whose trailing arguments are :data:`USES_ARGTYPES`.
"""

from __future__ import annotations

import ctypes
import pathlib
from typing import Callable, Sequence, overload

import torch
from torch import Tensor

__all__ = ["COMBINE_SOURCE", "USES_ARGTYPES", "reduce"]

#: The text of ``combine.h``, next to this module, the C that every family's walks include (the
#: families' files include it by name; it includes ``lazykern.h``, which
#: :func:`lazykern.native.load_source` finds).
COMBINE_SOURCE = (pathlib.Path(__file__).parent / "combine.h").read_text(encoding="utf-8")

#: The ctypes of the trailing arguments of every family's entry point (D, n, m, order, key, values,
#: single (the values are float32), C, scales, out, G, dots, W, point).
USES_ARGTYPES = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 6


def _pointer(t: Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


@overload
def _rows(t: Tensor) -> Tensor: ...


@overload
def _rows(t: Tensor | None) -> Tensor | None: ...


def _rows(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().to(torch.float64).contiguous()


def reduce(fn: Callable, leading: Sequence, order: Tensor, key: Tensor, num_sources: int, values: Tensor,
           scales: Tensor, *, out: bool = False, grad: Tensor | None = None,
           weights: Tensor | None = None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    r"""``(out, dots, point)`` of a family's walks (``None`` where not asked): :math:`\sum_d s_d K_d V`
    ``(N, C)`` with ``out``, :math:`\langle G, K_d V \rangle` ``(D,)`` with ``grad`` :math:`G`, and
    :math:`s_d \sum_c W_{ic} (K'_d V)_{ic}` ``(N, D)`` with ``weights`` :math:`W`, all float64.

    Args:
        fn: the family's compiled entry point, ``leading`` its first arguments.
        order, key: ``(D, M + N)`` merged order and sorted values (``(D, N)`` for one set).
        num_sources: ``M``, or ``-1`` for one set.
        values: ``(M, C)`` the sources' values (float32 read as they are, any other dtype as float64).
        scales: ``(D,)`` per-dimension scales.
        grad, weights: ``(N, C)`` each, or ``None``.
    """
    dims, total = order.shape
    n, cols = total - max(num_sources, 0), values.shape[-1]
    single = values.dtype == torch.float32  # read as they are: float32 rows convert exactly, in C
    v = values.detach().contiguous() if single else _rows(values)
    s, g, w = _rows(scales), _rows(grad), _rows(weights)
    order, key = order.contiguous(), key.detach().to(torch.float64).contiguous()
    result = torch.empty(n, cols, dtype=torch.float64) if out else None  # every entry is written
    dots = torch.zeros(dims, dtype=torch.float64) if g is not None else None
    point = torch.empty(dims, n, dtype=torch.float64) if w is not None else None  # every entry is written
    fn(*leading, dims, n, num_sources, order.data_ptr(), key.data_ptr(), v.data_ptr(), int(single), cols, s.data_ptr(),
       _pointer(result), _pointer(g), _pointer(dots), _pointer(w), _pointer(point))
    return result, dots, None if point is None else point.T
