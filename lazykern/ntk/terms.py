r"""The per-layer NTK features of a batch of samples, in three shapes.

Each layer contributes one or more *terms*; the NTK is their sum (parameters partition by layer,
so there are no cross-layer terms). With ``N`` samples, ``k`` outputs, ``T`` tokens:

* :class:`Implicit` ``(a, g)``: :math:`\sum_{t,t'} s(a_t, a'_{t'}) \langle g_{o,t}, g'_{o',t'}\rangle`,
  ``a`` ``(N, T, F)``, ``g`` ``(N, k, T, H)``, :math:`s` a dot product or token equality;
* :class:`Explicit` ``e``: :math:`\langle e_o, e'_{o'}\rangle`, ``e`` ``(N, k, P)`` (per-sample gradients);
* :class:`Sparse` ``(tokens, g)``: an embedding's per-sample gradient
  :math:`\sum_t \mathbb 1_{\text{tok}_t} \otimes g_{o,t}`, kept as its ``T`` non-zero rows (never a
  vocabulary-sized vector): the same kernel as an ``"equal"`` implicit term, evaluated by grouping
  equal tokens instead of visiting every token pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Implicit", "Explicit", "Sparse", "Term", "num_samples", "terms_bytes", "map_terms", "write_terms", "index_terms", "cat_terms", "terms_numel"]


@dataclass
class Implicit:
    r"""A pair-formula term, :math:`\sum_{t,t'} s(a_t, a'_{t'}) \langle g_{o,t}, g'_{o',t'}\rangle`.

    Attributes:
        a: ``(N, T, F)`` first factors (layer inputs, a 1 appended for a trainable bias), or
            ``(N, T, 1)`` token ids stored as floats when ``similarity`` is ``"equal"``.
        g: ``(N, k, T, H)`` output cotangents.
        similarity: :math:`s`, ``"dot"`` or ``"equal"``.

    Example:
        >>> import torch
        >>> Implicit(torch.randn(2, 5, 3), torch.randn(2, 4, 5, 6)).tokens
        5
    """

    a: Tensor  # (N, T, F); token ids as floats (N, T, 1) when similarity == "equal"
    g: Tensor  # (N, k, T, H)
    similarity: str = "dot"

    @property
    def tokens(self) -> int:
        return self.a.shape[1]


@dataclass
class Explicit:
    r"""A per-sample-gradient term, :math:`\langle e_o, e'_{o'}\rangle`.

    Attributes:
        e: ``(N, k, P)`` per-sample gradients of the layer's parameters, one per output.

    Example:
        >>> import torch
        >>> Explicit(torch.randn(2, 4, 10)).e.shape
        torch.Size([2, 4, 10])
    """

    e: Tensor  # (N, k, P)


@dataclass
class Sparse:
    r"""An embedding's per-sample gradient :math:`\sum_t \mathbb 1_{\text{tok}_t} \otimes g_{o,t}`,
    kept as its ``T`` non-zero rows.

    Attributes:
        ids: ``(N, T)`` int64 token ids.
        g: ``(N, k, T, H)`` output cotangents.

    Example:
        >>> import torch
        >>> s = Sparse(torch.tensor([[1, 7, 1]]), torch.randn(1, 2, 3, 4))
        >>> s.as_implicit().similarity, s.as_implicit().a.shape
        ('equal', torch.Size([1, 3, 1]))
    """

    ids: Tensor  # (N, T) int64
    g: Tensor  # (N, k, T, H)

    def as_implicit(self) -> Implicit:
        """The same kernel as an implicit term (for diagonals and gathered entries, O(T^2) per sample)."""
        return Implicit(self.ids.to(self.g.dtype).unsqueeze(-1), self.g, "equal")


Term = Implicit | Explicit | Sparse


def _fields(term: Term) -> dict[str, Tensor]:
    if isinstance(term, Implicit):
        return {"a": term.a, "g": term.g}
    if isinstance(term, Explicit):
        return {"e": term.e}
    return {"ids": term.ids, "g": term.g}


def _rebuild(term: Term, fields: dict[str, Tensor]) -> Term:
    if isinstance(term, Implicit):
        return Implicit(fields["a"], fields["g"], term.similarity)
    if isinstance(term, Explicit):
        return Explicit(fields["e"])
    return Sparse(fields["ids"], fields["g"])


def num_samples(terms: list[Term]) -> int:
    """The number of samples ``N`` the features of ``terms`` describe (every field's first axis).

    Example:
        >>> num_samples([Explicit(torch.randn(3, 2, 5))])
        3
    """
    return next(iter(_fields(terms[0]).values())).shape[0]


def terms_bytes(terms: list[Term]) -> int:
    """Bytes held by every tensor of ``terms`` (what a cache of features charges to its budget).

    Example:
        >>> terms_bytes([Explicit(torch.zeros(3, 2, 5, dtype=torch.float64))])
        240
    """
    return sum(v.numel() * v.element_size() for t in terms for v in _fields(t).values())


def map_terms(terms: list[Term], fn) -> list[Term]:
    """``fn`` applied to every tensor of every term."""
    return [_rebuild(t, {n: fn(v) for n, v in _fields(t).items()}) for t in terms]


def write_terms(dest: list[Term] | None, rows: slice, src: list[Term], total: int) -> list[Term]:
    """Copy the features of a sample batch into ``dest`` (allocated for ``total`` samples on the first call).

    Writing into one preallocation, rather than concatenating batch outputs, keeps the small
    outputs from interleaving with the large freed temporaries of each batch, which fragments the C
    heap (the peak resident set grew with the number of samples). A single batch of all ``total``
    samples is kept as it is, copying only tensors that are views into larger storage (which would
    keep it alive): the copy was a noticeable part of a small block (docs/ntk.rst, "Benchmark").
    """
    if dest is None and rows.stop - rows.start == total:  # one batch: its own tensors are the features
        return map_terms(src, lambda v: v if _owns_storage(v) else v.clone(memory_format=torch.contiguous_format))
    if dest is None:
        dest = map_terms(src, lambda v: v.new_empty((total, *v.shape[1:])))
    for d, s in zip(dest, src):
        for name, value in _fields(s).items():
            _fields(d)[name][rows] = value
    return dest


def _owns_storage(v: Tensor) -> bool:
    return bool(v.is_contiguous() and v.storage_offset() == 0
                and v.untyped_storage().nbytes() == v.numel() * v.element_size())


def index_terms(terms: list[Term], idx: slice | Tensor) -> list[Term]:
    """The features of a subset of the samples."""
    return map_terms(terms, lambda v: v[idx])


def cat_terms(parts: list[list[Term]]) -> list[Term]:
    """Features of consecutive sample batches, joined."""
    return [
        _rebuild(first, {n: torch.cat([_fields(p[i])[n] for p in parts]) for n in _fields(first)})
        for i, first in enumerate(parts[0])
    ]


def terms_numel(terms: list[Term]) -> int:
    """Numbers stored per sample (what the plan reports as the feature size)."""
    total = 0
    for t in terms:
        total += sum(v[0].numel() for v in _fields(t).values())
    return total
