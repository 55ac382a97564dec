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
"""

from __future__ import annotations

from .trace import Graph, Unsupported

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
        op, args = node.op, node.args
        b = graph.binary
        if op == "add":
            give(args[0], g)
            give(args[1], g)
        elif op == "sub":
            give(args[0], g)
            give(args[1], graph.unary("neg", g))
        elif op == "mul":
            give(args[0], b("mul", g, args[1]))
            give(args[1], b("mul", g, args[0]))
        elif op == "div":
            give(args[0], b("div", g, args[1]))
            give(args[1], graph.unary("neg", b("div", b("mul", g, z), args[1])))
        elif op == "neg":
            give(args[0], graph.unary("neg", g))
        elif op == "exp":
            give(args[0], b("mul", g, z))
        elif op == "expm1":  # e^u = expm1(u) + 1: no second exponential per pair
            give(args[0], b("mul", g, b("add", z, graph.const(1.0))))
        elif op == "log":
            give(args[0], b("div", g, args[0]))
        elif op == "sin":
            give(args[0], b("mul", g, graph.unary("cos", args[0])))
        elif op == "cos":
            give(args[0], graph.unary("neg", b("mul", g, graph.unary("sin", args[0]))))
        elif op == "sqrt":
            give(args[0], b("div", b("mul", graph.const(0.5), g), z))
        elif op == "rsqrt":  # d a^(-1/2) = -a^(-1/2) / (2 a)
            give(args[0], b("div", b("mul", graph.const(-0.5), b("mul", g, z)), args[0]))
        elif op == "abs":
            give(args[0], b("mul", g, graph.unary("sign", args[0])))
        elif op == "relu":
            give(args[0], b("mul", g, graph.unary("step", args[0])))
        elif op == "pow":
            p = node.attr
            give(args[0], b("mul", b("mul", graph.const(p), g), graph.power(args[0], p - 1.0)))
        elif op == "esym":
            give(args[0], graph.elementary_symmetric_vjp(args[0], g, node.attr))
        elif op == "esym_vjp":
            raise Unsupported("second derivatives of elementary symmetric polynomials")
        elif op == "sum":
            give(args[0], g)
        elif op == "expand":
            give(args[0], graph.sum(g))
        elif op == "slice":
            give(args[0], g, node.attr, node.width)
        elif op == "concat":
            offset = 0
            for part in args:
                w = graph.width(part)
                give(part, g if graph.width(g) == 1 else graph.slice(g, offset, w))
                offset += w
        # sign, step: derivative zero almost everywhere; leaves and constants: nothing to pass on
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
