r"""NTK products, blocks and entries from per-layer features (the ``"keops"`` and ``"dense"`` backends).

With features ``(A, G)`` per term (:class:`~lazykern.ntk.features.Features`):

* trace mode, :math:`(\Theta V)_i = \sum_j \langle A_i, A_j\rangle \langle \operatorname{vec} G_i, \operatorname{vec} G_j\rangle V_j`;
* full mode, :math:`U_j = \sum_{o'} V_{jo'} G_{jo'}`, :math:`W_i = \sum_j \langle A_i, A_j\rangle U_j`,
  :math:`(\Theta V)_{io} = \langle G_{io}, W_i \rangle`.

The pairwise sums over :math:`j` run as one KeOps reduction per term (nothing N1 x N2 is stored)
or as BLAS products of row blocks, :math:`(A_I A^\top) \odot (G_I G^\top)`, at most
:class:`lazykern.settings.chunk_bytes` per block. The explicit term (``A`` is ``None``, the
constant 1) is low rank, :math:`G_1 (G_2^\top V)`, and never pairwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..backend import rows_per_chunk
from ..formulas.ntk import factored_entry, factored_weights
from ..keops import keops_lazy_tensor, keops_session, padded_size
from .features import Features

__all__ = ["pairwise_matmul", "dense_blocks", "diagonal", "entries"]


def _pad(t: Tensor) -> Tensor:
    return F.pad(t, (0, padded_size(t.shape[-1]) - t.shape[-1]))


def _keops_weights(a1: Tensor, a2: Tensor, u: Tensor) -> Tensor:
    a1, a2, up = _pad(a1), _pad(a2), _pad(u)
    with keops_session():
        w = factored_weights(
            keops_lazy_tensor(a1[:, None, :]), keops_lazy_tensor(a2[None, :, :]), keops_lazy_tensor(up[None, :, :])
        ).sum(dim=1)
    return w[:, : u.shape[1]]


def _keops_trace(a1: Tensor, a2: Tensor, g1: Tensor, g2: Tensor, v: Tensor) -> Tensor:
    a1, a2, g1, g2, vp = _pad(a1), _pad(a2), _pad(g1), _pad(g2), _pad(v)
    with keops_session():
        k = factored_entry(
            keops_lazy_tensor(a1[:, None, :]),
            keops_lazy_tensor(a2[None, :, :]),
            keops_lazy_tensor(g1[:, None, :]),
            keops_lazy_tensor(g2[None, :, :]),
        )
        out = (k * keops_lazy_tensor(vp[None, :, :])).sum(dim=1)
    return out[:, : v.shape[1]]


def _dense_weights(a1: Tensor, a2: Tensor, u: Tensor) -> Tensor:
    step = rows_per_chunk(a2.shape[0], 1, a1.element_size())
    return torch.cat([(a1[s : s + step] @ a2.T) @ u for s in range(0, a1.shape[0], step)])


def _dense_trace(a1: Tensor, a2: Tensor, g1: Tensor, g2: Tensor, v: Tensor) -> Tensor:
    step = rows_per_chunk(a2.shape[0], 2, a1.element_size())
    blocks = []
    for s in range(0, a1.shape[0], step):
        tile = a1[s : s + step] @ a2.T
        tile.mul_(g1[s : s + step] @ g2.T)
        blocks.append(tile @ v)
    return torch.cat(blocks)


def pairwise_matmul(f1: Features, f2: Features, rhs: Tensor, mode: str, engine: str) -> Tensor:
    r""":math:`\Theta V` with ``rhs`` ``(N2 * k, C)`` (full) or ``(N2, C)`` (trace); ``engine`` is ``"keops"`` or ``"dense"``."""
    n1, n2, c = f1.terms[0][1].shape[0], f2.terms[0][1].shape[0], rhs.shape[-1]
    if mode == "full":
        k = f1.terms[0][1].shape[1]
        v = rhs.reshape(n2, k, c)
        out = rhs.new_zeros(n1, k, c)
        weights = _keops_weights if engine == "keops" else _dense_weights
        for (a1, g1), (a2, g2) in zip(f1.terms, f2.terms):
            u = torch.einsum("jkh,jkc->jhc", g2, v)
            if a1 is None:
                out += torch.einsum("ikh,hc->ikc", g1, u.sum(0))
            else:
                w = weights(a1, a2, u.reshape(n2, -1)).reshape(n1, -1, c)
                out += torch.einsum("ikh,ihc->ikc", g1, w)
        return out.reshape(n1 * k, c)
    out = rhs.new_zeros(n1, c)
    trace = _keops_trace if engine == "keops" else _dense_trace
    for (a1, g1), (a2, g2) in zip(f1.terms, f2.terms):
        g1, g2 = g1.flatten(1), g2.flatten(1)
        if a1 is None:
            out += g1 @ (g2.T @ rhs)
        else:
            out += trace(a1, a2, g1, g2, rhs)
    return out


def dense_blocks(f1: Features, f2: Features, mode: str) -> Tensor:
    """The whole matrix, assembled from row blocks of :math:`(A_I A^\\top) \\odot (G_I G^\\top)`."""
    n1, k = f1.terms[0][1].shape[:2]
    n2 = f2.terms[0][1].shape[0]
    width = 2 * k * k if mode == "full" else 2
    step = rows_per_chunk(n2, width, f1.terms[0][1].element_size())
    blocks = []
    for s in range(0, n1, step):
        rows = slice(s, s + step)
        if mode == "full":
            b = min(n1, s + step) - s
            block = torch.zeros(b, k, n2, k, dtype=f1.terms[0][1].dtype, device=f1.terms[0][1].device)
            for (a1, g1), (a2, g2) in zip(f1.terms, f2.terms):
                gg = (g1[rows].reshape(b * k, -1) @ g2.reshape(n2 * k, -1).T).reshape(b, k, n2, k)
                block += gg if a1 is None else (a1[rows] @ a2.T)[:, None, :, None] * gg
            blocks.append(block.reshape(b * k, n2 * k))
        else:
            block = 0
            for (a1, g1), (a2, g2) in zip(f1.terms, f2.terms):
                gg = g1[rows].flatten(1) @ g2.flatten(1).T
                block = block + (gg if a1 is None else (a1[rows] @ a2.T) * gg)
            blocks.append(block)
    return torch.cat(blocks)


def _entry(a1: Tensor | None, a2: Tensor | None, g1: Tensor, g2: Tensor) -> Tensor:
    if a1 is None:
        return (g1 * g2).sum(-1)
    return factored_entry(a1, a2, g1, g2).squeeze(-1)


def diagonal(f1: Features, f2: Features, mode: str) -> Tensor:
    r""":math:`\Theta(x^{(1)}_i, x^{(2)}_i)` for each i, O(N * features): ``(N * k,)`` or ``(N,)``."""
    total = 0
    for (a1, g1), (a2, g2) in zip(f1.terms, f2.terms):
        if mode == "full":
            a1, a2 = (None, None) if a1 is None else (a1[:, None, :], a2[:, None, :])
            total = total + _entry(a1, a2, g1, g2)
        else:
            total = total + _entry(a1, a2, g1.flatten(1), g2.flatten(1))
    return total.reshape(-1)


def entries(f1: Features, f2: Features, rows: Tensor, cols: Tensor, mode: str) -> Tensor:
    """Gathered entries ``Theta[rows, cols]`` (broadcast index tensors), O(len * features)."""
    total = 0
    for (a1, g1), (a2, g2) in zip(f1.terms, f2.terms):
        if mode == "full":
            k = g1.shape[1]
            i, o, j, p = rows // k, rows % k, cols // k, cols % k
            total = total + _entry(None if a1 is None else a1[i], None if a2 is None else a2[j], g1[i, o], g2[j, p])
        else:
            total = total + _entry(
                None if a1 is None else a1[rows], None if a2 is None else a2[cols], g1[rows].flatten(-2), g2[cols].flatten(-2)
            )
    return total
