r"""Empirical-NTK pair formulas over concatenated per-sample features.

A layer's share of the NTK is a sum, over its *tokens* (positions of a convolution, tokens of a
sequence; one token for a dense layer), of products of two similarities:

.. math::

    \Theta^{(l)}_{oo'}(x, x') = \sum_{t, t'} s\big(a_t(x), a_{t'}(x')\big)\,
    \big\langle g_{o,t}(x), g_{o',t'}(x') \big\rangle ,

with :math:`a_t` the layer's input at token :math:`t` (a 1 appended for a trainable bias),
:math:`g_{o,t} = \partial f_o / \partial z_t` the cotangent of output :math:`o` at the layer's output,
and :math:`s` a dot product (dense and convolution layers) or the indicator
:math:`[a_t = a'_{t'}]` (embeddings, where :math:`a_t` is the token id). An *explicit* term is the
special case of no first factor: :math:`\langle e_o(x), e_{o'}(x')\rangle` for a per-sample
gradient :math:`e_o`.

:class:`NTKFormula` evaluates a sum of such products over *one* feature vector per row, made by
concatenating every part's features; each part reads its slices. Rows are whatever the caller
chose (samples, samples x tokens, samples x outputs), so one formula serves trace- and full-mode
kernels, products and diagonals. It runs unchanged on pairwise-expanded KeOps ``LazyTensor``
objects (``x1``: ``(N, 1, D)``, ``x2``: ``(1, M, D)``, never stored) and on torch tensors, where a
pairwise dot product is one matrix product (BLAS) rather than an ``N x M x D`` broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .composite import columns

__all__ = ["SIMILARITIES", "NTKPart", "NTKFormula", "dot", "equal"]

#: The first-factor similarities a part can take, ``"dot"`` (:math:`\langle a, a'\rangle`),
#: ``"equal"`` (:math:`[a = a']` for a 1-wide token id) and ``"one"`` (no first factor).
SIMILARITIES = ("dot", "equal", "one")


def _pairwise(x1: Tensor, x2: Tensor) -> bool:
    return x1.dim() >= 3 and x2.dim() >= 3 and x1.shape[-2] == 1 and x2.shape[-3] == 1


def dot(x1: Any, x2: Any) -> Any:
    r""":math:`\langle x_1, x_2 \rangle` over the last dimension, kept as a size-1 dimension.

    KeOps scalars are 1-vectors; keeping the dimension on tensors too lets the same expression
    broadcast against vector-valued factors on both engines. Pairwise-expanded tensors
    (``(..., N, 1, D)`` against ``(..., 1, M, D)``) are multiplied as matrices, so the
    ``N x M x D`` broadcast is never formed.

    Example:
        >>> import torch
        >>> dot(torch.ones(2, 3), torch.ones(2, 3)).shape
        torch.Size([2, 1])
        >>> dot(torch.ones(4, 1, 3), torch.ones(1, 5, 3)).shape
        torch.Size([4, 5, 1])
    """
    if isinstance(x1, Tensor) and isinstance(x2, Tensor):
        if _pairwise(x1, x2):
            return (x1.squeeze(-2) @ x2.squeeze(-3).transpose(-1, -2)).unsqueeze(-1)
        return (x1 * x2).sum(-1, keepdim=True)
    return (x1 * x2).sum(-1)


def equal(t1: Any, t2: Any) -> Any:
    r""":math:`[t_1 = t_2]` for 1-wide token ids stored as floats (exact below :math:`2^{24}` in float32).

    KeOps has no comparison, but :math:`\operatorname{step}(-(t_1 - t_2)^2)` is 1 exactly when the
    difference is zero.

    Example:
        >>> import torch
        >>> equal(torch.tensor([[3.0], [4.0]]), torch.tensor([[3.0], [5.0]])).flatten().tolist()
        [1.0, 0.0]
    """
    if isinstance(t1, Tensor) and isinstance(t2, Tensor):
        return (t1 == t2).to(torch.promote_types(t1.dtype, t2.dtype))
    d = t1 - t2
    return (-(d * d)).step()


@dataclass(frozen=True)
class NTKPart:
    """One product term: similarity of columns ``a`` times the dot product of columns ``g``.

    ``a`` and ``g`` are ``(start, stop)`` column ranges of the concatenated row features, or
    ``None`` (no factor: ``a=None`` is similarity ``"one"``).
    """

    a: tuple[int, int] | None
    g: tuple[int, int] | None
    similarity: str = "dot"

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        if (self.a is None) != (self.similarity == "one"):
            raise ValueError("a part has an 'a' column range exactly when its similarity is not 'one'")
        if self.a is None and self.g is None:
            raise ValueError("a part needs an 'a' or a 'g' column range")


@dataclass(frozen=True)
class NTKFormula:
    r"""The pair formula :math:`\sum_p s_p(x_1[a_p], x_2[a_p]) \, \langle x_1[g_p], x_2[g_p] \rangle`.

    Args:
        parts: the product terms (:class:`NTKPart`), each reading its column ranges.

    Example:
        >>> import torch
        >>> f = NTKFormula((NTKPart((0, 2), (2, 5)),))
        >>> x = torch.randn(4, 5)
        >>> k = f(x[:, None, :], x[None, :, :]).squeeze(-1)
        >>> torch.allclose(k, (x[:, :2] @ x[:, :2].T) * (x[:, 2:] @ x[:, 2:].T))
        True
    """

    parts: tuple[NTKPart, ...]

    #: False, the answer that is always safe, since the fused gradient of K(X, X) is never asked
    #: of NTK blocks.
    symmetric = False
    #: Everything is in the row features, nothing in tensor parameters.
    param_names = ()

    @property
    def pair_width(self) -> int:
        """How many numbers the torch engine holds per pair of a row block, namely each part's
        factors and product, and the running sum (just the result for a single dot product)."""
        return sum(3 if p.a is not None and p.g is not None else 1 for p in self.parts) + len(self.parts) - 1

    def __call__(self, x1: Any, x2: Any) -> Any:
        total = None
        for part in self.parts:
            term = None
            if part.a is not None:
                a1, a2 = columns(x1, *part.a), columns(x2, *part.a)
                term = equal(a1, a2) if part.similarity == "equal" else dot(a1, a2)
            if part.g is not None:
                gg = dot(columns(x1, *part.g), columns(x2, *part.g))
                term = gg if term is None else term * gg
            total = term if total is None else total + term
        return total
