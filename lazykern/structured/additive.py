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

__all__ = ["SUMS", "additive_matmul", "merged_order", "num_sources"]

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


class _Additive(torch.autograd.Function):
    @staticmethod
    def forward(ctx, family: str, parameter: float, x1: Tensor, x2: Tensor, v: Tensor, scales: Tensor) -> Tensor:
        key, order = merged_order(x1, x2)
        a, b = SUMS[family](order, key, num_sources(x1, x2), v, ctx.needs_input_grad[2], parameter)
        ctx.family, ctx.parameter = family, parameter
        ctx.save_for_backward(x1, x2, v, scales, a, b if b is not None else torch.empty(0))
        return torch.einsum("d,dnc->nc", scales.to(torch.float64), a).to(v.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x1, x2, v, scales, a, b = ctx.saved_tensors
        need_x1, need_x2, need_v, need_scales = ctx.needs_input_grad[2:]
        s, g = scales.to(torch.float64), grad.to(torch.float64)
        dx1 = dx2 = dv = ds = None
        if need_scales:
            ds = torch.einsum("nc,dnc->d", g, a).to(scales.dtype)
        if need_x1:
            dx1 = (s[:, None] * torch.einsum("nc,dnc->dn", g, b)).T.to(x1.dtype)
        if need_x2 or need_v:
            key, order = merged_order(x2, x1)
            at, bt = SUMS[ctx.family](order, key, num_sources(x2, x1), g, need_x2, ctx.parameter)
            if need_v:
                dv = torch.einsum("d,dmc->mc", s, at).to(v.dtype)
            if need_x2:
                dx2 = (s[:, None] * torch.einsum("mc,dmc->dm", v.to(torch.float64), bt)).T.to(x2.dtype)
        return None, None, dx1, dx2, dv, ds


def additive_matmul(family: str, parameter: float, x1: Tensor, x2: Tensor, v: Tensor, scales: Tensor) -> Tensor:
    r""":math:`\sum_d s_d K_d(x_{1,d}, x_{2,d})\, V` for one batch element.

    Args:
        family: ``"matern"`` or ``"rbf"``.
        parameter: Matérn's nu (0.5, 1.5 or 2.5), or the Gaussian's error bound per unit of
            :math:`\sum_j |v_j|` (:func:`lazykern.structured.gauss.gauss_plan`).
        x1: ``(N, D)`` rows, divided by the lengthscales.
        x2: ``(M, D)`` columns, divided by the lengthscales.
        v: ``(M, C)`` right-hand side.
        scales: ``(D,)`` per-dimension scales.

    Returns:
        ``(N, C)`` in ``v``'s dtype (computed in float64), differentiable in every tensor argument.

    Example:
        >>> x, v = torch.randn(50, 3, dtype=torch.float64), torch.randn(50, 2, dtype=torch.float64)
        >>> r = (x[:, None, :] - x[None, :, :]).abs()
        >>> dense = ((1 + 3**0.5 * r) * torch.exp(-3**0.5 * r)).sum(-1)
        >>> torch.allclose(additive_matmul("matern", 1.5, x, x, v, torch.ones(3)), dense @ v, rtol=1e-12)
        True
    """
    return _Additive.apply(family, parameter, x1, x2, v, scales)
