r"""First-order additive kernels of one-dimensional terms: products and gradients in O((N + M) d).

.. math::

    \big(K(X, Z)\, V\big)_i = \sum_{d} s_d \sum_j k\big(x_{id} - z_{jd}\big)\, v_j

with inputs divided by their lengthscales, :math:`k` a half-integer Matérn kernel (each
dimension's sum is two recurrences over the merged sorted order of :math:`\{x_{id}\}` and
:math:`\{z_{jd}\}`, exact: :mod:`lazykern.structured.recurrences`) or the Gaussian (a fast Gauss
transform within a stated bound: :mod:`lazykern.structured.gauss`). The backward pass needs one
more pass with the roles of the two sets exchanged:

* :math:`\partial / \partial s_d = \langle G, K_d V \rangle` from the forward pass's per-dimension sums;
* :math:`\partial / \partial x_{id} = s_d \sum_c G_{ic} (K'_d V)_{ic}`, also from the forward walk;
* :math:`\partial / \partial V = \sum_d s_d K_d^\top G` and
  :math:`\partial / \partial z_{jd} = s_d \sum_c V_{jc} \big(\sum_i k'(z_{jd} - x_{id}) G_i\big)_c`
  (:math:`k'` is odd) from the exchanged walk.

Sorting is done once per pair of input sets and checked in :math:`O(N + M)` afterwards: a
training loop divides the same inputs by new lengthscales at every step, which changes the
values but never their order, so a recent order is reused while it still sorts the new values
(:func:`merged_order`).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from typing import Callable

import torch
from torch import Tensor

from ..native import load_file
from .gauss import gauss_reduce
from .recurrences import matern_reduce

__all__ = ["REDUCTIONS", "gradients", "merged_order", "num_sources", "product"]

#: family -> its walks with the reductions over the dimensions
#: (:func:`lazykern.structured.combine.reduce`), called as ``(order, key, num_sources, values,
#: parameter, scales, **uses)``, the parameter being Matérn's nu or the Gaussian's error bound.
REDUCTIONS: dict[str, Callable[..., tuple[Tensor | None, Tensor | None, Tensor | None]]] = {
    "matern": matern_reduce, "rbf": gauss_reduce,
}

#: Recent merged orders by the shapes and device of (sources, targets): a training step needs
#: K(X, Z) and, backward, K(Z, X) (the same shapes when N = M), forward and backward. At most
#: _RECENT_SLOTS shapes are kept, the least recently used dropped, so that a program that sees many
#: shapes (test batches, cross-validation) does not keep an order for each.
_RECENT: OrderedDict[tuple, list[Tensor]] = OrderedDict()
_RECENT_PER_SLOT = 8
_RECENT_SLOTS = 8
_LOCK = threading.Lock()


#: ``lk_sorted_key``, the check of a recent order, in C.
_SORTED_KEY_SOURCE = os.path.join(os.path.dirname(__file__), "additive.c")
_SORTED_KEY_ARGTYPES = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 4


def _sorts(values: Tensor, order: Tensor, num_sources: int) -> tuple[bool, Tensor]:
    """Whether ``order`` still sorts ``values`` (``(D, M + N)`` float64) as :func:`merged_order`
    promises, and the values in that order."""
    key, ok = torch.empty_like(values), torch.zeros(1, dtype=torch.int64)
    fn = load_file(_SORTED_KEY_SOURCE, "lk_sorted_key", _SORTED_KEY_ARGTYPES)
    fn(values.shape[0], values.shape[1], num_sources, values.data_ptr(), order.data_ptr(), key.data_ptr(),
       ok.data_ptr())
    return bool(ok), key


def merged_order(targets: Tensor, sources: Tensor) -> tuple[Tensor, Tensor]:
    """The merged sorted order of each dimension of ``sources`` ``(M, D)`` and ``targets``
    ``(N, D)``, sources first among equal values, and the sorted float64 values: ``(D, M + N)``
    each; when ``targets is sources``, the order of the one set, ``(D, N)`` (see
    :func:`num_sources`). A recent order computed for sets of these shapes is reused when it still
    sorts them (checked in O(M + N) per dimension).

    Example:
        >>> key, order = merged_order(torch.tensor([[2.0], [0.0]]), torch.tensor([[0.0], [1.0]]))
        >>> order.tolist(), key.tolist()                  # source 0 (0.0) before target 1 (0.0)
        ([[0, 3, 1, 2]], [[0.0, 0.0, 1.0, 2.0]])
    """
    one_set = num_sources(targets, sources) < 0
    # (D, M + N) float64 in one copy from each set, whatever their dtype and layout
    values = torch.empty(sources.shape[-1], sources.shape[0] + (0 if one_set else targets.shape[0]), dtype=torch.float64)
    values[:, :sources.shape[0]].copy_(sources.detach().T)
    if not one_set:
        values[:, sources.shape[0]:].copy_(targets.detach().T)
    slot = (sources.shape, targets.shape, sources.device, one_set)
    with _LOCK:
        recent = list(_RECENT.get(slot, ()))
        if recent:
            _RECENT.move_to_end(slot)
    for order in recent:
        ok, key = _sorts(values, order, num_sources(targets, sources))
        if ok:
            return key.contiguous(), order
    key, order = torch.sort(values, dim=1, stable=True)  # stable: sources, placed first, stay first
    order = order.contiguous()
    with _LOCK:
        _RECENT[slot] = [order, *_RECENT.get(slot, ())][:_RECENT_PER_SLOT]
        _RECENT.move_to_end(slot)
        while len(_RECENT) > _RECENT_SLOTS:
            _RECENT.popitem(last=False)
    return key.contiguous(), order


def num_sources(targets: Tensor, sources: Tensor) -> int:
    """``M``, or ``-1`` when the targets are the sources (``K(X, X)``): the walks then go over the
    one set, half the entries of a merged order."""
    return -1 if targets is sources else sources.shape[0]


def _reduce(family: str, parameter: float, targets: Tensor, sources: Tensor, values: Tensor, scales: Tensor,
            **uses) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The reductions ``uses`` of the sums of ``values`` at ``sources`` for ``targets`` (one sort for
    all dimensions, reused from a recent call where it still holds)."""
    key, order = merged_order(targets, sources)
    return REDUCTIONS[family](order, key, num_sources(targets, sources), values, parameter, scales, **uses)


def product(family: str, parameter: float, x1: Tensor, x2: Tensor, v: Tensor, scales: Tensor) -> Tensor:
    r""":math:`\sum_d s_d K_d(x_{1,d}, x_{2,d})\, V` for one batch element, in float64.

    Args:
        family: ``"matern"`` or ``"rbf"``.
        parameter: Matérn's nu (0.5, 1.5 or 2.5), or the Gaussian's error bound per unit of
            :math:`\sum_j |v_j|` (:func:`lazykern.structured.gauss.gauss_plan`).
        x1: ``(N, D)`` rows, divided by the lengthscales; ``x1 is x2`` for ``K(X, X)``.
        x2: ``(M, D)`` columns, divided by the lengthscales.
        v: ``(M, C)`` right-hand side.
        scales: ``(D,)`` per-dimension scales.

    Example:
        >>> x, v = torch.randn(50, 3, dtype=torch.float64), torch.randn(50, 2, dtype=torch.float64)
        >>> r = (x[:, None, :] - x[None, :, :]).abs()
        >>> dense = ((1 + 3**0.5 * r) * torch.exp(-3**0.5 * r)).sum(-1)
        >>> torch.allclose(product("matern", 1.5, x, x, v, torch.ones(3)), dense @ v, rtol=1e-12)
        True
    """
    result = _reduce(family, parameter, x1, x2, v, scales, out=True)[0]
    assert result is not None  # asked for with out=True
    return result


def gradients(family: str, parameter: float, x1: Tensor, x2: Tensor, v: Tensor, scales: Tensor, grad: Tensor,
              wanted: tuple[bool, bool, bool, bool]) -> list[Tensor | None]:
    r"""The float64 gradients of :math:`\langle G, \sum_d s_d K_d V \rangle` for ``x1``, ``x2``,
    ``v`` and ``scales`` where ``wanted`` (else ``None``).

    Two sets: one walk as the product's (with the derivative sums :math:`K'_d V` when ``x1``'s
    gradient is wanted) for ``x1`` and the scales, one with the sets' roles exchanged
    (:math:`K_d^\top G`, :math:`K'_d{}^\top G`) for ``x2`` and ``v``. One set (``x1 is x2``): one
    walk with the values :math:`[V, G]`, whose sums give :math:`K'V`, :math:`K'G` and :math:`KV` at
    once; the gradient for the set is returned as ``x1``'s and ``x2``'s is ``None``.
    """
    want_x1, want_x2, want_v, want_scales = wanted
    if x1 is x2:
        want_x1, want_x2 = want_x1 or want_x2, False
    g, v64 = grad.detach().to(torch.float64), v.detach().to(torch.float64)
    gx1 = gx2 = gv = gs = None
    if x1 is x2 and (want_x1 or want_v):
        # K(X, X) is symmetric: K^T G = K G, so [V, G] in one walk serves every gradient: the first
        # C columns of its sums are K_d V (the scales), the last K_d G (V); its derivative sums
        # K'_d [V, G] weighted by [G, V] give the inputs'.
        cols = v.shape[-1]
        out, gs, gx1 = _reduce(family, parameter, x1, x1, torch.cat([v64, g], -1), scales, out=want_v,
                               grad=torch.cat([g, torch.zeros_like(g)], -1) if want_scales else None,
                               weights=torch.cat([g, v64], -1) if want_x1 else None)
        return [gx1, None, None if out is None else out[:, cols:], gs]
    if want_x1 or want_scales:
        _, gs, gx1 = _reduce(family, parameter, x1, x2, v64, scales, grad=g if want_scales else None,
                             weights=g if want_x1 else None)
    if want_x2 or want_v:
        gv, _, gx2 = _reduce(family, parameter, x2, x1, g, scales, out=want_v, weights=v64 if want_x2 else None)
    return [gx1, gx2, gv, gs]
