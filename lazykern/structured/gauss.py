r"""Products with one-dimensional Gaussian kernels by a fast Gauss transform, in C, with a bound.

:math:`a_i = \sum_j e^{-(x_i - z_j)^2/2}\, v_j` (inputs divided by the lengthscale) and its
derivative sums :math:`b_i = \sum_j k'(x_i - z_j)\, v_j`, :math:`k'(t) = -t\,e^{-t^2/2}`, in
:math:`O((N + M)\,p)` per dimension and column (Greengard & Strain 1991, in one dimension).

Sources and targets are grouped in boxes of width :math:`h` on one grid. With the Hermite
functions :math:`h_n(t) = (-1)^n \frac{d^n}{dt^n} e^{-t^2}`, a source box of centre :math:`s` and a
target box of centre :math:`t`, :math:`\beta = (z - s)/\sqrt2`, :math:`y = (x - t)/\sqrt2` and
:math:`c = (t - s)/\sqrt2`, Taylor's theorem gives

.. math::

    e^{-(x - z)^2/2} = \sum_{n, m \ge 0} \frac{(-1)^m}{m!\, n!}\, h_{n+m}(c)\, \beta^n y^m .

A source box keeps its Hermite moments :math:`A_n = \sum_j \beta_j^n v_j / n!`, :math:`n < p`; a
target box gathers :math:`L_m = \frac{(-1)^m}{m!} \sum_{\text{boxes}} \sum_{n < p} A_n\, h_{n+m}(c)`,
:math:`m < p`, from the source boxes within reach and evaluates :math:`\sum_m L_m y^m` (and its
derivative) at each of its targets by Horner's rule. Boxes with at most :math:`p` points are summed
point by point instead: a small source box enters :math:`L_m` through :math:`h_m((t - z)/\sqrt2)`
for each of its sources, a small target box sums each source box at each target (directly, or
through :math:`\sum_n A_n h_n((x - s)/\sqrt2)`).

Error, for every target: Cramér's inequality :math:`|h_n(t)| \le K\, 2^{n/2} \sqrt{n!}\,
e^{-t^2/2}` (:math:`K < 1.0865`) bounds each dropped term of the double series by
:math:`K (h/2)^{n+m} \sqrt{(n+m)!} / (n!\, m!)` per unit of :math:`|v_j|` (:math:`2m/h` times that
for the derivative), and boxes beyond reach hold only sources more than :math:`R` from the target,
each of whose terms is below :math:`R\,e^{-R^2/2}`. :func:`gauss_plan` picks :math:`p`, :math:`h`
and :math:`R` so that each part is at most ``tol / 2``:

.. math::

    |\hat a_i - a_i|,\ |\hat b_i - b_i| \;\le\; \mathrm{tol} \sum_j |v_j| .

The transform is C, ``gauss.c`` next to this module (with ``combine.h``), compiled by
:func:`lazykern.native.load_file`.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os

import torch
from torch import Tensor

from ..native import load_file
from .combine import USES_ARGTYPES, reduce

__all__ = ["gauss_plan", "gauss_reduce"]

#: Cramér's constant, rounded up: |H_n(t)| e^{-t^2/2} <= K 2^{n/2} sqrt(n!) for every n and t.
_CRAMER = 1.0865
#: Box widths tried by :func:`gauss_plan` (in lengthscales): wider boxes need more terms, narrower
#: ones put more boxes within reach of each target.
_WIDTHS = (0.125, 0.25, 0.5, 1.0, 2.0)
#: Points per lengthscale assumed where the data's is not given: 64 points in a box of half a lengthscale.
_DENSITY = 128.0


def _truncation_bound(p: int, h: float) -> float:
    """The largest truncation error of the expansions for ``p`` terms in boxes of width ``h``, per
    unit of :math:`|v_j|`, for the values and the derivatives (see the module docstring). The
    double series is summed over 60 more orders than kept, as one tensor (a plan is made once per
    bound and density, but a Python loop over its terms took most of a second)."""
    n, k = torch.meshgrid(torch.arange(p + 60, dtype=torch.float64), torch.arange(p + 60, dtype=torch.float64),
                          indexing="ij")
    outside = (n >= p) | (k >= p)
    log_terms = (math.log(_CRAMER) + (n + k) * math.log(h / 2) + 0.5 * torch.lgamma(n + k + 1)
                 - torch.lgamma(n + 1) - torch.lgamma(k + 1))  # log of K (h/2)^(n+k) sqrt((n+k)!) / (n! k!)
    terms = torch.where(outside, log_terms.exp(), 0.0)
    value, slope = float(terms.sum()), float((2 * k / h * terms).sum())
    direct = sum(_CRAMER * (h / 2) ** q * math.sqrt((q + 1) / math.factorial(q)) for q in range(p, p + 60))
    return max(value, slope, direct)


@functools.lru_cache(maxsize=None)
def _terms(tol: float, h: float) -> int:
    """The fewest terms whose truncation error in boxes of width ``h`` is within ``tol / 2``."""
    p = 1
    while _truncation_bound(p, h) > tol / 2:
        p += 1
    return p


@functools.lru_cache(maxsize=None)
def gauss_plan(tol: float, density: float = _DENSITY) -> tuple[int, float, float]:
    r"""``(p, h, reach)``: terms, box width and the reach ``R + h/2`` of the box centres a target
    sums, for the error bound ``tol`` (per unit of :math:`\sum_j |v_j|`): of the box widths
    ``_WIDTHS``, the one of least work per point when there are ``density`` points per
    lengthscale. Each point costs :math:`2p` (its moments, its Horner steps) and each pair of boxes
    within reach :math:`p^2`, shared by the points of a box: dense data takes narrow boxes and
    few terms, sparse data wide boxes.

    Example:
        >>> p, h, reach = gauss_plan(1e-10)
        >>> 8 <= p <= 40 and reach > 7
        True
        >>> gauss_plan(1e-10, density=1e5)[1] < gauss_plan(1e-10, density=10.0)[1]
        True
    """
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    cutoff = 1.0
    while cutoff * math.exp(-cutoff * cutoff / 2) > tol / 2:
        cutoff += 0.01
    best = None
    for h in _WIDTHS:
        p = _terms(tol, h)
        cost = 2 * p + p * p * (2 * (cutoff + h) / h + 1) / max(1.0, density * h)
        if best is None or cost < best[0]:
            best = (cost, p, h, cutoff + h / 2)
    assert best is not None  # _WIDTHS is not empty
    return best[1], best[2], best[3]


def _density(key: Tensor) -> float:
    """Points per lengthscale of sorted rows ``key`` (inputs divided by the lengthscale), rounded
    down to a power of two so that a training loop's plans come from a few cached ones."""
    spread = float((key[:, -1] - key[:, 0]).max()) if key.shape[-1] > 1 else 0.0
    return 2.0 ** math.floor(math.log2(max(1.0, key.shape[-1] / max(spread, 1e-300))))


#: The transform and its reductions, in C.
_SOURCE = os.path.join(os.path.dirname(__file__), "gauss.c")

_ARGTYPES = [ctypes.c_int64, ctypes.c_double, ctypes.c_double] + USES_ARGTYPES


def gauss_reduce(order: Tensor, key: Tensor, num_sources: int, values: Tensor, tol: float, scales: Tensor,
                 **uses) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The reductions of :func:`lazykern.structured.combine.reduce` of the Gaussian kernel's sums
    :math:`a_d = K_d V` and :math:`b_d = K'_d V`, each within ``tol`` times :math:`\\sum_j |v_j|`
    of the exact sums.

    Args and returns as :func:`lazykern.structured.recurrences.matern_reduce`, with ``tol`` the bound.

    Example:
        >>> x = torch.linspace(0, 30, 400, dtype=torch.float64)[None]
        >>> key, order = torch.sort(torch.cat([x, x], 1), stable=True)
        >>> out, _, _ = gauss_reduce(order, key, 400, torch.ones(400, 1), 1e-10, torch.ones(1), out=True)
        >>> exact = torch.exp(-0.5 * (x[0, :, None] - x[0, None, :]) ** 2).sum(1)
        >>> bool((out[:, 0] - exact).abs().max() <= 1e-10 * 400)
        True
    """
    fn = load_file(_SOURCE, "lk_gauss_additive", _ARGTYPES)
    return reduce(fn, gauss_plan(tol, _density(key)), order, key, num_sources, values, scales, **uses)
