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

import torch
from torch import Tensor

from .gauss import gauss_sums
from .recurrences import matern_sums

__all__ = ["SUMS", "gradients", "merged_order", "num_sources", "product"]

#: family -> per-dimension sums ``(order, key, num_sources, values, derivative, parameter)``, the
#: parameter being Matérn's nu or the Gaussian's error bound.
SUMS = {"matern": matern_sums, "rbf": gauss_sums}

#: Recent merged orders by the shapes and device of (sources, targets): a training step needs
#: K(X, Z) and, backward, K(Z, X) (the same shapes when N = M), forward and backward.
_RECENT: dict[tuple, list[Tensor]] = {}
_RECENT_PER_SLOT = 4
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
    for order in recent:
        ok, key = _sorts(values, order, num_sources(targets, sources))
        if ok:
            return key.contiguous(), order
    key, order = torch.sort(values, dim=1, stable=True)  # stable: sources, placed first, stay first
    order = order.contiguous()
    with _LOCK:
        _RECENT[slot] = [order, *_RECENT.get(slot, ())][:_RECENT_PER_SLOT]
    return key.contiguous(), order


def num_sources(targets: Tensor, sources: Tensor) -> int:
    """``M``, or ``-1`` when the targets are the sources (``K(X, X)``): the walks then go over the
    one set, half the entries of a merged order."""
    return -1 if targets is sources else sources.shape[0]


def product(family: str, parameter: float, x1: Tensor, x2: Tensor, v: Tensor, scales: Tensor,
            derivative: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    r""":math:`\sum_d s_d K_d(x_{1,d}, x_{2,d})\, V` for one batch element, in float64, with the
    per-dimension sums the gradients need.

    Args:
        family: ``"matern"`` or ``"rbf"``.
        parameter: Matérn's nu (0.5, 1.5 or 2.5), or the Gaussian's error bound per unit of
            :math:`\sum_j |v_j|` (:func:`lazykern.structured.gauss.gauss_plan`).
        x1: ``(N, D)`` rows, divided by the lengthscales; ``x1 is x2`` for ``K(X, X)``.
        x2: ``(M, D)`` columns, divided by the lengthscales.
        v: ``(M, C)`` right-hand side.
        scales: ``(D,)`` per-dimension scales.
        derivative: also form :math:`K'_d V`, which the gradient for ``x1`` needs.

    Returns:
        The ``(N, C)`` product and the ``(D, N, C)`` sums :math:`K_d V` and :math:`K'_d V`
        (``None`` without ``derivative``).

    Example:
        >>> x, v = torch.randn(50, 3, dtype=torch.float64), torch.randn(50, 2, dtype=torch.float64)
        >>> r = (x[:, None, :] - x[None, :, :]).abs()
        >>> dense = ((1 + 3**0.5 * r) * torch.exp(-3**0.5 * r)).sum(-1)
        >>> out, _, _ = product("matern", 1.5, x, x, v, torch.ones(3), derivative=False)
        >>> torch.allclose(out, dense @ v, rtol=1e-12)
        True
    """
    key, order = merged_order(x1, x2)
    a, b = SUMS[family](order, key, num_sources(x1, x2), v, derivative, parameter)
    return torch.einsum("d,dnc->nc", scales.detach().to(torch.float64), a), a, b


def gradients(family: str, parameter: float, x1: Tensor, x2: Tensor, v: Tensor, scales: Tensor, grad: Tensor,
              a: Tensor, b: Tensor | None, wanted: tuple[bool, bool, bool, bool]) -> list[Tensor | None]:
    r"""The float64 gradients of :math:`\langle G, \sum_d s_d K_d V \rangle` for ``x1``, ``x2``,
    ``v`` and ``scales`` where ``wanted`` (else ``None``), from :func:`product`'s sums ``a`` and
    ``b`` (``b`` required when the gradient for ``x1`` is wanted) and one more pass with the sets'
    roles exchanged (for ``x2`` and ``v``). With ``x1 is x2`` the gradient for the one set is
    returned as ``x1``'s and ``x2``'s is ``None``."""
    want_x1, want_x2, want_v, want_scales = wanted
    if x1 is x2:
        want_x1, want_x2 = want_x1 or want_x2, False
    s, g = scales.detach().to(torch.float64), grad.detach().to(torch.float64)
    gx1 = gx2 = gv = gs = None
    if want_scales:
        gs = torch.einsum("nc,dnc->d", g, a)
    if want_x1 and x1 is x2:
        # One walk for both sides: the values [V, G] give K'V and K'G at once.
        key, order = merged_order(x1, x1)
        _, both = SUMS[family](order, key, -1, torch.cat([v.detach().to(torch.float64), g], -1), True, parameter)
        kv, kg = both.split(v.shape[-1], dim=-1)
        gx1 = (s[:, None] * (torch.einsum("nc,dnc->dn", g, kv) + torch.einsum("nc,dnc->dn", v.detach().double(), kg))).T
    elif want_x1:
        gx1 = (s[:, None] * torch.einsum("nc,dnc->dn", g, b)).T
    if want_x2 or want_v:
        key, order = merged_order(x2, x1)
        at, bt = SUMS[family](order, key, num_sources(x2, x1), g, want_x2, parameter)
        if want_v:
            gv = torch.einsum("d,dmc->mc", s, at)
        if want_x2:
            gx2 = (s[:, None] * torch.einsum("mc,dmc->dm", v.detach().to(torch.float64), bt)).T
    return [gx1, gx2, gv, gs]
