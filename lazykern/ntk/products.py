r"""NTK blocks, products, diagonals and entries from per-layer features, on the kernels' engine.

Every pairwise sum runs through :mod:`lazykern.backend` (``pairwise_matmul``, ``pairwise_dense``,
``elementwise``) with an :class:`~lazykern.formulas.ntk.NTKFormula` over concatenated row features;
the NTK backend ``"keops"`` or ``"dense"`` names the engine of the pairwise products
(:data:`BACKEND_ENGINES`, :func:`lazykern.backend.preferred`: symbolic reductions, KeOps or on a GPU
where KeOps fails its health check the Triton engine, or the chunked torch engine), and that engine
says how wide the features are padded (:meth:`lazykern.engine.Engine.padded_width`). Rows are:

* trace mode: (sample, token), features :math:`[a_t \mid \operatorname{vec}_o g_{o,t}]` per term; the
  sum over token pairs is the sum of the row results over each sample's tokens;
* full-mode products: (sample, token) with features :math:`a_t` only; the kernel
  :math:`s(a_t, a'_{t'})` multiplies :math:`u_{t'} = \sum_{o'} v_{o'} g'_{o',t'}`, and
  :math:`(\Theta v)_o = \sum_t \langle g_{o,t}, w_t\rangle`;
* full-mode blocks: (sample, output, token), features :math:`[a_t \mid g_{o,t}]` (one-token terms
  multiply the sample block of :math:`s(a, a')` with the (sample, output) block of
  :math:`\langle g, g'\rangle`, which avoids repeating :math:`s` for every output pair).

Explicit terms are low rank: products are :math:`E_1 (E_2^\top V)`, blocks :math:`E_1 E_2^\top`.
Sparse (embedding) terms group equal tokens: products scatter :math:`g'_{t'} v` into one row per
distinct token and gather it back; blocks visit only the pairs of equal tokens.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import backend
from ..formulas.ntk import NTKFormula, NTKPart
from .features import batch_bytes
from .rules import implicit_matmul_macs
from .terms import Explicit, Implicit, Sparse, Term, index_terms, num_samples

__all__ = ["BACKEND_ENGINES", "dense", "matmul", "diagonal", "entries"]

K = TypeVar("K", Implicit, Explicit, Sparse)

#: The engine an NTK backend's pairwise products ask the chooser for (:func:`lazykern.backend.preferred`):
#: symbolic reductions for ``"keops"``, the chunked torch engine's matrix products (BLAS) for ``"dense"``.
BACKEND_ENGINES = {"keops": "keops", "dense": "torch"}


def _outputs(terms: Sequence[Term]) -> int:
    t = terms[0]
    return (t.e if isinstance(t, Explicit) else t.g).shape[1]


def _pair(kind: type[K], t1: Term, t2: Term) -> tuple[K, K]:
    """The two sides' terms at one index, both of ``kind``: both sides' features come from one
    network, layer by layer, so the kind of one side's term is the other's."""
    assert isinstance(t1, kind) and isinstance(t2, kind)
    return t1, t2


def _pad(t: Tensor, padded: Callable[[int], int] | None) -> Tensor:
    width = t.shape[-1] if padded is None else padded(t.shape[-1])
    return F.pad(t, (0, width - t.shape[-1])) if width != t.shape[-1] else t


def _rows(terms: Sequence[Term], mode: str, padded: Callable[[int], int] | None = None,
          with_g: bool = True) -> tuple[Tensor, NTKFormula]:
    """Row features ``(N, R, T, D)`` of terms sharing a token count, and their formula.

    ``R`` is 1 (trace mode, or ``with_g=False``) or ``k`` (full mode). Explicit terms (one token)
    enter trace-mode rows as parts without first factor. ``padded``: the width each feature block
    is zero-padded to (the engine's :meth:`~lazykern.engine.Engine.padded_width`), if any.
    """
    cols: list[Tensor] = []
    parts: list[NTKPart] = []
    offset = 0

    def add(t: Tensor) -> tuple[int, int]:
        nonlocal offset
        cols.append(t)
        offset += t.shape[-1]
        return (offset - t.shape[-1], offset)

    reps = 1 if mode == "trace" or not with_g else _outputs(terms)
    for term in terms:
        if isinstance(term, Explicit):
            e = _pad(term.e.flatten(1), padded)
            parts.append(NTKPart(None, add(e[:, None, None, :]), "one"))
            continue
        assert isinstance(term, Implicit)  # sparse terms come here as_implicit
        n, k, t, h = term.g.shape
        a = term.a if term.similarity == "equal" else _pad(term.a, padded)
        a_range = add(a[:, None].expand(n, reps, t, a.shape[-1]))
        g_range = None
        if with_g:
            g = term.g.permute(0, 2, 1, 3).reshape(n, 1, t, k * h) if mode == "trace" else term.g
            g_range = add(_pad(g, padded))
        parts.append(NTKPart(a_range, g_range, term.similarity))
    return torch.cat(cols, dim=-1), NTKFormula(tuple(parts))


def _dot(width: int) -> NTKFormula:
    return NTKFormula((NTKPart(None, (0, width), "one"),))


def _chunks(n: int, per_sample_bytes: int) -> Iterator[slice]:
    """Runs of samples whose blocks stay near the block budget."""
    step = max(1, min(batch_bytes() // max(1, per_sample_bytes), n))
    for s in range(0, n, step):
        yield slice(s, min(n, s + step))


def _groups(terms: list[Term]) -> dict[object, list[int]]:
    """Term indices by how they are evaluated: token count (implicit), "explicit", "sparse".

    Explicit terms are evaluated one by one, never concatenated: together they can be most of the
    per-sample Jacobian, and a joined copy would double the memory the features take.
    """
    groups: dict[object, list[int]] = {}
    for i, t in enumerate(terms):
        key: object = "sparse" if isinstance(t, Sparse) else "explicit" if isinstance(t, Explicit) else t.tokens
        groups.setdefault(key, []).append(i)
    return groups


# ------------------------------------------------------------------------------ blocks
#: Row blocks of a symmetric block: row block ``I`` is evaluated against columns from its own first
#: sample on, which skips ``(B - 1) / 2B`` of the pairs (44% with 8), and mirrored at the end.
SYMMETRIC_BLOCKS = 8
#: ... but no fewer result rows per block than this: a product of 16 rows against a long feature
#: axis ran at half the BLAS rate of 64 rows, which cost more than the skipped pairs saved
#: (measured: docs/ntk.rst, "Benchmark").
MIN_BLOCK_ROWS = 64


def split(n: int, blocks: int) -> list[slice]:
    """``n`` samples in (at most) ``blocks`` runs of equal length, the last one shorter."""
    step = -(-n // blocks)
    return [slice(s, min(n, s + step)) for s in range(0, n, step)]


def _block_rows(n: int, rows_per_sample: int, symmetric: bool) -> list[slice]:
    blocks = min(SYMMETRIC_BLOCKS, n * rows_per_sample // MIN_BLOCK_ROWS) if symmetric else 1
    return split(n, max(blocks, 1))


def _runs(blocks: list[slice], per_sample_bytes: int) -> Iterator[tuple[slice, int]]:
    """Runs of rows within the row blocks that stay near the block budget, each with its first
    column: its block's first row (0 unless the block is symmetric, which is one block of all rows)."""
    for block in blocks:
        for rows in _chunks(block.stop - block.start, per_sample_bytes):
            yield slice(block.start + rows.start, block.start + rows.stop), block.start


def dense(f1: list[Term], f2: list[Term], mode: str) -> Tensor:
    r"""The block :math:`\Theta(x^{(1)}, x^{(2)})`: ``(N1, N2)`` (trace) or ``(N1 k, N2 k)`` (full).

    When both sides are the same features (``f1 is f2``) every term fills only row block ``I``
    against the columns from ``I``'s first sample on (:data:`SYMMETRIC_BLOCKS` row blocks, fewer
    for few samples), and the rest is mirrored once at the end. Explicit terms are written by BLAS
    straight into the result (``addmm_`` on its row blocks): no tile is allocated, and with the
    mirror about half of :math:`E E^\top` is computed.
    """
    n1, n2, k = num_samples(f1), num_samples(f2), _outputs(f1)
    symmetric = f1 is f2
    r = k if mode == "full" else 1
    blocks = _block_rows(n1, r, symmetric)
    ref = f1[0].e if isinstance(f1[0], Explicit) else f1[0].g
    item = ref.element_size()
    out = ref.new_zeros(n1, r, n2, r)
    flat = out.view(n1 * r, n2 * r)

    def add(rows: slice, start: int, block: Tensor) -> None:
        """``block``: ``(rows, r, columns from start, r)``."""
        out[rows, :, start:] += block

    for key, idx in _groups(f1).items():
        if key == "sparse":
            for i in idx:
                out += _sparse_dense(*_pair(Sparse, f1[i], f2[i]), mode).reshape(n1, r, n2, r)
        elif key == "explicit":
            for i in idx:  # trace mode: rows are samples, (k P) features; full mode: (sample, output), P
                e1, e2 = (f.e.reshape(f.e.shape[0] * r, -1) for f in _pair(Explicit, f1[i], f2[i]))
                for rows in blocks:  # columns from the block's first row: 0 unless symmetric
                    rs = slice(rows.start * r, rows.stop * r)
                    flat[rs, rows.start * r :].addmm_(e1[rs], e2[rows.start * r :].T)
        elif mode == "full":  # per term: the first factor per token pair, then the cotangents
            for i in idx:
                _dense_full_implicit(*_pair(Implicit, f1[i], f2[i]), blocks, add)
        else:  # trace mode: token rows (sample, token), in blocks of rows: one sample's can be large
            assert isinstance(key, int)  # the token count of implicit terms
            t = key
            x1, formula = _rows([f1[i] for i in idx], mode)
            x2, _ = _rows([f2[i] for i in idx], mode)
            x1, x2 = x1.reshape(n1 * r * t, -1), x2.reshape(n2 * r * t, -1)
            flat_t = out.view(n1 * r, n2, r)
            for rows in _chunks(n1 * r * t, 2 * n2 * r * t * item):
                block = backend.pairwise_dense(formula, x1[rows], x2, {}).view(-1, n2, r, t).sum(-1)
                owner = torch.arange(rows.start, rows.stop, device=block.device) // t  # (sample, output) of each row
                flat_t.index_add_(0, owner, block)
    if symmetric:  # below row block I, its columns: the transpose of what I computed right of itself
        for rows in blocks[:-1]:
            flat[rows.stop * r :, rows.start * r : rows.stop * r] = flat[rows.start * r : rows.stop * r, rows.stop * r :].T
    return out.reshape(n1 * r, n2 * r)


def _dense_full_implicit(t1: Implicit, t2: Implicit, blocks: list[slice], add) -> None:
    r"""Full-mode block of one implicit term: :math:`S = s(a_{it}, a'_{ju})` per token pair (the
    engine), :math:`Y_{it,j} = \sum_u S_{it,ju}\, g'_{j\cdot u}`, then
    :math:`\sum_t \langle g_{iot}, Y_{it,jq}\rangle`: :math:`T^2 F + T^2 k H + T k^2 H` per sample pair
    rather than :math:`k^2 T^2 (F + H)` for rows of (sample, output, token)."""
    n1, k, t, h = t1.g.shape
    n2, f = t2.g.shape[0], t1.a.shape[-1]
    item = t1.g.element_size()
    similarity = NTKFormula((NTKPart((0, f), None, t1.similarity),))
    a2 = t2.a.reshape(n2 * t, f)
    g2 = t2.g.permute(0, 2, 1, 3).reshape(n2, t, k * h)  # (sample, token, output x width)
    for rows, start in _runs(blocks, (t * n2 * t + 3 * t * n2 * k * h) * item):
        m, rest = rows.stop - rows.start, n2 - start
        if t == 1:  # one token: S times the (sample, output) Gram of the cotangents
            s = backend.pairwise_dense(similarity, t1.a[rows, 0], t2.a[start:, 0], {})
            gg = backend.pairwise_dense(_dot(h), t1.g[rows, :, 0].reshape(m * k, h), t2.g[start:, :, 0].reshape(rest * k, h), {})
            add(rows, start, s[:, None, :, None] * gg.view(m, k, rest, k))
            continue
        s = backend.pairwise_dense(similarity, t1.a[rows].reshape(m * t, f), a2[start * t :], {})
        y = torch.bmm(s.view(m * t, rest, t).transpose(0, 1), g2[start:])  # (j, (i, t), (q, H))
        y = y.view(rest, m, t, k, h).permute(1, 2, 4, 0, 3).reshape(m, t * h, rest * k)
        add(rows, start, torch.bmm(t1.g[rows].reshape(m, k, t * h), y).view(m, k, rest, k))


# ------------------------------------------------------------------------------ products
def matmul(f1: list[Term], f2: list[Term], rhs: Tensor, mode: str, engine_name: str) -> Tensor:
    r""":math:`\Theta V` with ``rhs`` ``(N2, C)`` (trace) or ``(N2 k, C)`` (full, row ``j k + o``).

    Implicit terms run pairwise (always with the backend ``engine_name="keops"``) on the engine of
    the backend (:data:`BACKEND_ENGINES`), or factored through the layer's weight-gradient space,
    whichever :func:`~lazykern.ntk.rules.implicit_matmul_macs` predicts cheaper; explicit and sparse
    terms are low rank.
    """
    n1, n2, k, c = num_samples(f1), num_samples(f2), _outputs(f1), rhs.shape[-1]
    out = rhs.new_zeros(n1, k, c) if mode == "full" else rhs.new_zeros(n1, c)
    pairwise: list[tuple[Implicit, Implicit]] = []
    for t1, t2 in zip(f1, f2):
        if isinstance(t1, Explicit):  # low rank: E1 (E2^T V)
            e1, e2 = (t.e.flatten(1) if mode == "trace" else t.e.reshape(-1, t.e.shape[-1])
                      for t in _pair(Explicit, t1, t2))
            out = out + (e1 @ (e2.T @ rhs)).view(out.shape)
        elif isinstance(t1, Sparse):
            out = out + _sparse_matmul(*_pair(Sparse, t1, t2), rhs, mode)
        else:
            t1, t2 = _pair(Implicit, t1, t2)
            n, kk, t, h = t1.g.shape
            costs = implicit_matmul_macs(mode, n1, n2, t, t1.a.shape[-1], h, kk, c, t1.similarity == "equal")
            if engine_name == "keops" or costs["pairwise"] < costs["factored"]:
                pairwise.append((t1, t2))
            elif t1.similarity == "equal":
                out = out + _sparse_matmul(_as_sparse(t1), _as_sparse(t2), rhs, mode)
            else:
                out = out + _factored_matmul(t1, t2, rhs, mode)
    # the engine of the pairwise products, asked only where there are some (on a GPU: KeOps' health check)
    choice = backend.preferred(BACKEND_ENGINES[engine_name], rhs.device) if pairwise else None
    padded = None if choice is None else choice.engine.padded_width
    if mode == "trace":
        by_tokens: dict[int, list[tuple[Implicit, Implicit]]] = {}
        for pair in pairwise:
            by_tokens.setdefault(pair[0].tokens, []).append(pair)
        for t, pairs in by_tokens.items():
            x1, formula = _rows([t1 for t1, _ in pairs], mode, padded)
            x2, _ = _rows([t2 for _, t2 in pairs], mode, padded)
            w = backend.pairwise_matmul(
                formula, x1.reshape(n1 * t, -1), x2.reshape(n2 * t, -1), {}, rhs.repeat_interleave(t, dim=0), choice
            )
            out = out + w.view(n1, t, c).sum(1)
        return out
    v = rhs.view(n2, k, c)
    for t1, t2 in pairwise:
        t, h = t1.g.shape[2], t1.g.shape[3]
        u = torch.einsum("jotH,joc->jtHc", t2.g, v).reshape(n2 * t, h * c)
        a1, formula = _rows([t1], mode, padded, with_g=False)
        a2, _ = _rows([t2], mode, padded, with_g=False)
        w = backend.pairwise_matmul(formula, a1.reshape(n1 * t, -1), a2.reshape(n2 * t, -1), {}, u, choice)
        out = out + torch.einsum("iotH,itHc->ioc", t1.g, w.view(n1, t, h, c))
    return out.reshape(n1 * k, c)


def _as_sparse(term: Implicit) -> Sparse:
    return Sparse(term.a[..., 0].round().long(), term.g)


def _factored_matmul(t1: Implicit, t2: Implicit, rhs: Tensor, mode: str) -> Tensor:
    r"""One implicit term's product through its weight-gradient space: :math:`M = \sum_{j,t}
    u_{jt} \otimes \tilde a_{jt}` (:math:`u_{jt} = \sum_o v_{jo} g_{jot}` in full mode, one per output
    in trace mode), then :math:`(\Theta V)_{io} = \sum_t \langle g_{iot}, M \tilde a_{it}\rangle`.
    Columns and samples run in blocks that keep :math:`M` and the intermediates near the block budget."""
    n1, k, t, h = t1.g.shape
    n2, f, c = t2.g.shape[0], t1.a.shape[-1], rhs.shape[-1]
    item = rhs.element_size()
    reps = k if mode == "trace" else 1
    blocks = []
    for cols in _chunks(c, 2 * reps * h * f * item):
        r = rhs[:, cols]
        cc = r.shape[-1]
        if mode == "trace":
            m = sum(
                torch.einsum("jotH,jc,jtF->ocHF", t2.g[j], r[j], t2.a[j]) for j in _chunks(n2, t * k * h * cc * item)
            )
            blocks.append(torch.cat([
                torch.einsum("iotH,ocHF,itF->ic", t1.g[i], m, t1.a[i]) for i in _chunks(n1, t * k * h * cc * item)
            ]))
            continue
        v = r.view(n2, k, cc)
        m = sum(
            torch.einsum("jtHc,jtF->cHF", torch.einsum("jotH,joc->jtHc", t2.g[j], v[j]), t2.a[j])
            for j in _chunks(n2, t * h * cc * item)
        )
        blocks.append(torch.cat([
            torch.einsum("iotH,itHc->ioc", t1.g[i], torch.einsum("cHF,itF->itHc", m, t1.a[i]))
            for i in _chunks(n1, t * h * cc * item)
        ]))
    return torch.cat(blocks, dim=-1)


# ------------------------------------------------------------------------------ diagonal, entries
def _pairs_within(terms1: list[Term], terms2: list[Term], mode: str, k_index: tuple[Tensor, Tensor] | None) -> Tensor:
    """Per row, the kernel between row ``i`` of side 1 and row ``i`` of side 2 (all token pairs)."""
    total = None
    for t1, t2 in zip(terms1, terms2):
        if not isinstance(t1, Explicit):
            continue
        e1, e2 = (t.e for t in _pair(Explicit, t1, t2))
        if k_index is not None:
            e1, e2 = e1[torch.arange(e1.shape[0]), k_index[0]], e2[torch.arange(e2.shape[0]), k_index[1]]
            value = (e1 * e2).sum(-1)
        else:
            value = (e1 * e2).sum(-1) if mode == "full" else (e1 * e2).sum((-1, -2))
        total = value if total is None else total + value
    rest1 = [t.as_implicit() if isinstance(t, Sparse) else t for t in terms1 if not isinstance(t, Explicit)]
    rest2 = [t.as_implicit() if isinstance(t, Sparse) else t for t in terms2 if not isinstance(t, Explicit)]
    by_tokens: dict[int, list[int]] = {}
    for i, t in enumerate(rest1):
        by_tokens.setdefault(t.tokens, []).append(i)
    for idx in by_tokens.values():
        x1, formula = _rows([rest1[i] for i in idx], mode)
        x2, _ = _rows([rest2[i] for i in idx], mode)
        if k_index is not None:  # one output per row
            x1, x2 = x1[torch.arange(x1.shape[0]), k_index[0]], x2[torch.arange(x2.shape[0]), k_index[1]]
        else:
            x1, x2 = (x.squeeze(1) if mode == "trace" else x for x in (x1, x2))
        value = backend.elementwise(formula, x1.unsqueeze(-2), x2.unsqueeze(-3), {}).sum((-1, -2))
        total = value if total is None else total + value
    assert total is not None  # a network has a trainable layer: one term at least
    return total


def _by_sample(n: int, terms: list[Term], mode: str, fn) -> Tensor:
    """``fn`` over runs of rows whose token-pair blocks fit the block budget, joined."""
    reps = _outputs(terms) if mode == "full" else 1
    per_row = sum(reps * t.g.shape[2] ** 2 * t.g.element_size() for t in terms if not isinstance(t, Explicit))
    return torch.cat([fn(rows) for rows in _chunks(n, per_row)])


def diagonal(f1: list[Term], f2: list[Term], mode: str) -> Tensor:
    r""":math:`\Theta(x^{(1)}_i, x^{(2)}_i)` for each ``i``: ``(N k,)`` (full) or ``(N,)`` (trace)."""
    n = num_samples(f1)
    return _by_sample(
        n, f1, mode, lambda rows: _pairs_within(index_terms(f1, rows), index_terms(f2, rows), mode, None).reshape(-1)
    )


def entries(f1: list[Term], f2: list[Term], rows: Tensor, cols: Tensor, mode: str) -> Tensor:
    """Gathered entries ``Theta[rows, cols]`` (broadcast index tensors of operator positions)."""
    k = _outputs(f1) if mode == "full" else 1
    shape = rows.shape
    rows, cols = rows.reshape(-1), cols.reshape(-1)

    def part(sel: slice) -> Tensor:
        r, c = rows[sel], cols[sel]
        t1, t2 = index_terms(f1, r // k), index_terms(f2, c // k)
        return _pairs_within(t1, t2, mode, (r % k, c % k) if mode == "full" else None)

    return _by_sample(rows.shape[0], f1, mode, part).reshape(shape)


# ------------------------------------------------------------------------------ sparse (embedding)
def _token_rows(s: Sparse) -> tuple[Tensor, Tensor]:
    n, k, t, h = s.g.shape
    return s.ids.reshape(-1), s.g.permute(0, 2, 1, 3).reshape(n * t, k, h)


def _sparse_dense(s1: Sparse, s2: Sparse, mode: str) -> Tensor:
    r"""Only the pairs of equal tokens: :math:`\sum_{t,t': \text{tok}_t = \text{tok}'_{t'}} \langle g_t, g'_{t'}\rangle`."""
    n1, k, t1, _ = s1.g.shape
    n2, t2 = s2.g.shape[0], s2.g.shape[2]
    ids1, g1 = _token_rows(s1)
    ids2, g2 = _token_rows(s2)
    order = torch.argsort(ids2)
    sorted2 = ids2[order]
    lo = torch.searchsorted(sorted2, ids1)
    counts = torch.searchsorted(sorted2, ids1, right=True) - lo
    width = k * k if mode == "full" else 1
    acc = g1.new_zeros(n1 * n2, width)
    starts = torch.cumsum(counts, 0) - counts
    # visit token rows of side 1 in runs whose matched pairs fit the block budget
    budget = max(1, batch_bytes() // (g1.element_size() * 2 * g1[0].numel()))
    r = 0
    total_rows = ids1.shape[0]
    cum = torch.cumsum(counts, 0)
    while r < total_rows:
        base = 0 if r == 0 else int(cum[r - 1])
        stop = int(torch.searchsorted(cum, torch.tensor(base + budget, device=cum.device), right=True))
        stop = min(total_rows, max(stop, r + 1))
        cnt = counts[r:stop]
        m = int(cnt.sum())
        if m:
            local = torch.repeat_interleave(torch.arange(r, stop, device=ids1.device), cnt)
            offs = torch.arange(m, device=ids1.device) - (starts[local] - base)
            other = order[lo[local] + offs]
            a, b = g1[local], g2[other]
            vals = torch.einsum("mkh,mqh->mkq", a, b).reshape(m, width) if mode == "full" else (a * b).sum((1, 2))[:, None]
            dest = (local // t1) * n2 + other // t2
            acc = acc.index_add(0, dest, vals) if vals.requires_grad else acc.index_add_(0, dest, vals)
        r = stop
    if mode == "trace":
        return acc.view(n1, n2)
    return acc.view(n1, n2, k, k).permute(0, 2, 1, 3)


def _sparse_matmul(s1: Sparse, s2: Sparse, rhs: Tensor, mode: str) -> Tensor:
    """Scatter :math:`g'_{t'} v` into one row per distinct token of side 2, gather at side 1's tokens."""
    n1, k, t1, h = s1.g.shape
    n2, t2 = s2.g.shape[0], s2.g.shape[2]
    ids1, g1 = _token_rows(s1)
    ids2, g2 = _token_rows(s2)
    distinct, inverse = torch.unique(ids2, return_inverse=True)
    pos = torch.searchsorted(distinct, ids1).clamp(max=distinct.shape[0] - 1)
    found = (distinct[pos] == ids1).to(rhs.dtype)
    width = k * h if mode == "trace" else h
    per_column = (ids1.shape[0] + ids2.shape[0] + distinct.shape[0]) * width * rhs.element_size()
    blocks = []
    for cols in _chunks(rhs.shape[-1], per_column):
        r = rhs[:, cols]
        c = r.shape[-1]
        if mode == "trace":  # table[u] = sum over rows with token u of g (k, H) times v of their sample
            u = torch.einsum("rkh,rc->rkhc", g2, r.repeat_interleave(t2, dim=0)).reshape(-1, width, c)
        else:  # table[u] = sum over rows with token u of sum_o' v_o' g_o' (H)
            u = torch.einsum("rkh,rkc->rhc", g2, r.view(n2, k, c).repeat_interleave(t2, dim=0))
        table = u.new_zeros(distinct.shape[0], width, c).index_add(0, inverse, u)
        gathered = table[pos] * found[:, None, None]
        if mode == "trace":
            blocks.append(torch.einsum("rw,rwc->rc", g1.reshape(-1, width), gathered).view(n1, t1, c).sum(1))
        else:
            blocks.append(torch.einsum("rkh,rhc->rkc", g1, gathered).view(n1, t1, k, c).sum(1))
    return torch.cat(blocks, dim=-1)
