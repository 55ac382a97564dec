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

import threading
from collections import OrderedDict

import torch
from torch import Tensor

from .gauss import gauss_sums
from .recurrences import matern_sums

__all__ = ["BLOCK_BYTES", "SUMS", "dimension_blocks", "gradients", "merged_order", "num_sources", "product"]

#: family -> per-dimension sums ``(order, key, num_sources, values, derivative, parameter)``, the
#: parameter being Matérn's nu or the Gaussian's error bound.
SUMS = {"matern": matern_sums, "rbf": gauss_sums}

#: Recent merged orders by the shapes and device of (sources, targets): a training step needs
#: K(X, Z) and, backward, K(Z, X) (the same shapes when N = M), forward and backward. At most
#: _RECENT_SLOTS shapes are kept, the least recently used dropped, so that a program that sees many
#: shapes (test batches, cross-validation) does not keep an order for each.
_RECENT: OrderedDict[tuple, list[Tensor]] = OrderedDict()
_RECENT_PER_SLOT = 8
_RECENT_SLOTS = 8
_LOCK = threading.Lock()


def _sorts(values: Tensor, order: Tensor, num_sources: int) -> tuple[bool, Tensor]:
    key = values.gather(1, order)
    ascending = bool((key[:, 1:] >= key[:, :-1]).all())
    if not ascending or num_sources < 0:
        return ascending, key
    # among equal values, no target may come before a source
    misplaced = (key[:, 1:] == key[:, :-1]) & (order[:, :-1] >= num_sources) & (order[:, 1:] < num_sources)
    return not bool(misplaced.any()), key


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
    values = (sources if one_set else torch.cat([sources, targets])).detach().to(torch.float64).T.contiguous()
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


#: The most bytes of per-dimension sums held at once. The dimensions are summed in blocks of this
#: size, so a product over many terms (a projected kernel's hundreds) holds O(N C) of them, not O(N C d).
BLOCK_BYTES = 8 * 2**20


def dimension_blocks(dims: int, rows: int, cols: int, arrays: int) -> list[slice]:
    """Blocks of dimensions whose ``arrays`` float64 sums of ``(rows, cols)`` each fit
    :data:`BLOCK_BYTES` (at least one dimension a block).

    Example:
        >>> dimension_blocks(26, 1000, 1, 2), len(dimension_blocks(26, 13500, 12, 2))
        ([slice(0, 26, None)], 9)
    """
    step = max(1, BLOCK_BYTES // (8 * rows * cols * arrays))
    return [slice(d, min(d + step, dims)) for d in range(0, dims, step)]


def _sums(family: str, parameter: float, targets: Tensor, sources: Tensor, values: Tensor, derivative: bool):
    """Per block of dimensions, the sums ``(block, a, b)`` of ``values`` at ``sources`` for
    ``targets`` (one sort for all dimensions, reused from the last call where it still holds)."""
    key, order = merged_order(targets, sources)
    m = num_sources(targets, sources)
    for block in dimension_blocks(key.shape[0], targets.shape[0], values.shape[-1], 2 if derivative else 1):
        a, b = SUMS[family](order[block], key[block], m, values, derivative, parameter)
        yield block, a, b


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
    s = scales.detach().to(torch.float64)
    out = torch.zeros(x1.shape[0], v.shape[-1], dtype=torch.float64)
    for block, a, _ in _sums(family, parameter, x1, x2, v, False):
        out += torch.einsum("d,dnc->nc", s[block], a)
    return out


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
    one_set = x1 is x2
    if one_set:
        want_x1, want_x2 = want_x1 or want_x2, False
    s, g, v64 = scales.detach().to(torch.float64), grad.detach().to(torch.float64), v.detach().to(torch.float64)
    gx1 = torch.zeros(x1.shape, dtype=torch.float64) if want_x1 else None
    gx2 = torch.zeros(x2.shape, dtype=torch.float64) if want_x2 else None
    gv = torch.zeros(v.shape, dtype=torch.float64) if want_v else None
    gs = torch.zeros(scales.shape, dtype=torch.float64) if want_scales else None
    cols = v.shape[-1]
    if one_set and (want_x1 or want_v):
        # K(X, X) is symmetric: K^T G = K G, so [V, G] in one walk serves every gradient.
        for block, a, b in _sums(family, parameter, x1, x1, torch.cat([v64, g], -1), want_x1):
            if want_scales:
                gs[block] = torch.einsum("nc,dnc->d", g, a[..., :cols])
            if want_v:
                gv += torch.einsum("d,dnc->nc", s[block], a[..., cols:])
            if want_x1:
                kv, kg = b[..., :cols], b[..., cols:]
                gx1[:, block] = (s[block, None] * (torch.einsum("nc,dnc->dn", g, kv)
                                                   + torch.einsum("nc,dnc->dn", v64, kg))).T
        return [gx1, gx2, gv, gs]
    if want_x1 or want_scales:
        for block, a, b in _sums(family, parameter, x1, x2, v64, want_x1):
            if want_scales:
                gs[block] = torch.einsum("nc,dnc->d", g, a)
            if want_x1:
                gx1[:, block] = (s[block, None] * torch.einsum("nc,dnc->dn", g, b)).T
    if want_x2 or want_v:
        for block, a, b in _sums(family, parameter, x2, x1, g, want_x2):
            if want_v:
                gv += torch.einsum("d,dmc->mc", s[block], a)
            if want_x2:
                gx2[:, block] = (s[block, None] * torch.einsum("mc,dmc->dm", v64, b)).T
    return [gx1, gx2, gv, gs]
