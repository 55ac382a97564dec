r"""Symbolic reverse-mode differentiation of a :class:`~lazykern.compiler.trace.Graph`.

Given roots :math:`k_r` with seeds :math:`s_r` (expressions too: the pair weights of a gradient
pass), :func:`adjoints` builds expressions for :math:`\bar v = \sum_r s_r\, \partial k_r / \partial v`
for the requested leaves :math:`v`, as new nodes of the same graph. The derivative nodes reuse the
forward ones (the adjoint of :math:`e^u` multiplies by the node :math:`e^u` itself), so the
generated code of a gradient pass evaluates each exponential once per pair.

Broadcasting follows the forward pass: a width-1 operand of a width-:math:`D` operation receives
the sum over the feature axis of its adjoint; slices scatter their adjoints into the sliced range
(adjoints of disjoint slices of one input become one concatenation, not a sum of zero-padded
pieces).

The rule of each operation is declared with the operation, in :mod:`lazykern.compiler.ops`; a node
whose operation the table lacks raises :class:`~lazykern.compiler.ops.UnknownOp`.
"""

from __future__ import annotations

from .ops import OPS, lookup
from .trace import Graph

__all__ = ["adjoints"]


def adjoints(graph: Graph, seeded: list[tuple[int, int]], wrt: list[int]) -> dict[int, int | None]:
    """Adjoint expressions of the leaves ``wrt`` for the ``(root, seed)`` pairs ``seeded``.

    Returns, for each leaf, a node of the leaf's width (``None`` where the roots do not depend on
    it).

    Example:
        >>> g = Graph()
        >>> x, w = g.leaf("x", 1), g.leaf("w", 1)
        >>> k = g.unary("exp", x)
        >>> d = adjoints(g, [(k, w)], [x])[x]
        >>> g.nodes[d].op  # w * exp(x)
        'mul'
    """
    # node -> list of (start, length, expression); the expression is `length` wide or broadcasts (1).
    pieces: dict[int, list[tuple[int, int, int]]] = {}

    def give(a: int, expr: int, start: int = 0, length: int | None = None) -> None:
        width = graph.width(a)
        if length is None:
            length = width
        if graph.width(expr) > length:  # a width-1 operand broadcast in the forward pass
            expr = graph.sum(expr)
        if graph.const_value(expr) == 0.0:
            return
        pieces.setdefault(a, []).append((start, length, expr))

    done: dict[int, int] = {}
    for root, seed in seeded:
        give(root, seed)
    needed = set(graph.reachable([r for r, _ in seeded]))
    for z in sorted(needed, reverse=True):
        if z not in pieces:
            continue
        g = done[z] = _gather(graph, z, pieces.pop(z))
        node = graph.nodes[z]
        lookup(OPS, node.op).adjoint(graph, z, node, g, give)
    return {leaf: None if leaf not in done else graph.expand(done[leaf], graph.width(leaf)) for leaf in wrt}


def _gather(graph: Graph, a: int, found: list[tuple[int, int, int]]) -> int:
    """One expression from the pieces of ``a``'s adjoint: a sum where they all span ``a``, else a
    concatenation over the ranges they cover (zeros where none does)."""
    width = graph.width(a)

    def total(exprs: list[int]) -> int:
        acc = exprs[0]
        for e in exprs[1:]:
            acc = graph.binary("add", acc, e)
        return acc

    if all(start == 0 and length == width for start, length, _ in found):
        return total([e for _, _, e in found])
    cuts = sorted({0, width} | {s for s, _, _ in found} | {s + n for s, n, _ in found})
    segments = []
    for lo, hi in zip(cuts, cuts[1:]):
        covering = []
        for start, length, e in found:
            if start <= lo and hi <= start + length:
                covering.append(e if graph.width(e) == 1 else graph.slice(e, lo - start, hi - lo))
        segments.append(graph.expand(total(covering), hi - lo) if covering else graph.const(0.0, hi - lo))
    return graph.concat(segments)
