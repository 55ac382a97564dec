r"""A kernel formula as an expression graph, by calling it on symbolic placeholders.

A formula (:mod:`lazykern.formulas`) is written in the operator syntax that torch tensors and KeOps
``LazyTensor`` objects share. Called with :class:`Sym` placeholders instead, it records each
operation as a :class:`Node` of a :class:`Graph`: leaves are named inputs (one side of the pair,
the other side, a parameter, a pair weight), every node has a *width* (the size of the feature
axis; 1 broadcasts against any width, as a KeOps scalar does) and identical nodes are stored once
(hash-consing), so common subexpressions are shared. Widths are structure; values never are:
parameters are leaves, and only Python constants written in the formula (``0.5``,
:math:`\sqrt 3`, ...) become constant nodes.

Operations recorded (what the formulas of :mod:`lazykern.formulas` and KeOps' elementwise syntax
use): ``+ - * /``, unary ``-``, ``**`` with a constant exponent, ``exp``, ``expm1``, ``log``,
``sin``, ``cos``, ``sqrt``, ``rsqrt``, ``square``, ``abs``, ``relu``, ``sign``, ``step``,
``.sum(-1)`` (the feature axis), ``|`` (dot product), ``sqnorm2``, ``norm2``, ``sqdist``,
``matvecmult``, indexing and slicing of the feature axis (``x[k]``, ``x[a:b]``, ``x[..., a:b]``,
``elem``, ``extract``) and ``concat``. They become the operations of :mod:`lazykern.compiler.ops`,
which declares each once (arity, constant folding, simplifications, derivative). Anything else
raises :class:`Unsupported`, which :func:`lazykern.compiler.plan.product_plan` turns into no plan
(the compiled engines then decline the formula, and the chooser picks another engine).

Two operations are recurrences over the feature axis, one node each, as KeOps' custom nodes of
:mod:`lazykern.keops.nodes` are: ``elementary_symmetric(R)`` (the normalized elementary
symmetric polynomials of :func:`lazykern.formulas.interactions.elementary_symmetric`, op
``"esym"``) and its vector-Jacobian product (op ``"esym_vjp"``, created by differentiation).
Unrolled into D R scalar nodes instead, the generated C of a gradient pass took a minute to compile
at D = R = 26; as one node it is a loop. The formulas reach these and ``expm1`` (which
``LazyTensor`` lacks) through :attr:`Sym.traced`.

Example:
    >>> from lazykern.formulas import StationaryFormula
    >>> g = Graph()
    >>> root = trace(StationaryFormula("rbf", additive=True), g, "o", "i", {"scales": 3}, width=3)
    >>> g.nodes[root].op, g.nodes[root].width
    ('sum', 1)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..formulas import Formula
from .ops import OPS, UnknownOp, Unsupported, lookup

__all__ = ["Graph", "Node", "Sym", "Unsupported", "reachable", "trace"]


class _UnsupportedAttribute(Unsupported, AttributeError):
    """A ``LazyTensor`` attribute the placeholders lack (an ``AttributeError`` too, for ``getattr``
    with a default)."""


@dataclass(frozen=True)
class Node:
    """One operation: ``op`` applied to the nodes ``args`` (indices into the graph).

    ``attr`` holds the structural constants of the operation: the leaf's name (``"in"``), the value
    (``"const"``), the exponent (``"pow"``), the first index (``"slice"``); ``width`` is the size of
    its feature axis.
    """

    op: str
    args: tuple[int, ...]
    attr: Any
    width: int


class Graph:
    """Hash-consed expression nodes with light algebraic simplification (constants folded, ``x + 0``,
    ``x * 1``, ``x * 0``, slices of slices, concats and constants), so derivative graphs stay small."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._ids: dict[Node, int] = {}

    def _add(self, op: str, args: tuple[int, ...], attr: Any, width: int) -> int:
        node = Node(op, args, attr, width)
        found = self._ids.get(node)
        if found is None:
            found = self._ids[node] = len(self.nodes)
            self.nodes.append(node)
        return found

    def width(self, a: int) -> int:
        return self.nodes[a].width

    def const_value(self, a: int) -> float | None:
        node = self.nodes[a]
        return node.attr if node.op == "const" else None

    # ------------------------------------------------------------------ leaves
    def leaf(self, name: str, width: int) -> int:
        return self._add("in", (), name, width)

    def const(self, value: float, width: int = 1) -> int:
        value = float(value)
        if not math.isfinite(value):
            raise Unsupported(f"non-finite constant {value!r} in the formula")
        return self._add("const", (), value + 0.0, width)  # + 0.0: one node for 0.0 and -0.0

    # ------------------------------------------------------------------ elementwise
    def unary(self, op: str, a: int) -> int:
        return self._elementwise(op, (a,), self.width(a))

    def binary(self, op: str, a: int, b: int) -> int:
        wa, wb = self.width(a), self.width(b)
        if wa != wb and 1 not in (wa, wb):
            raise Unsupported(f"cannot broadcast widths {wa} and {wb}")
        if lookup(OPS, op).commutative and b < a:  # one node for a + b and b + a
            a, b = b, a
        return self._elementwise(op, (a, b), max(wa, wb))

    def _elementwise(self, op: str, args: tuple[int, ...], width: int) -> int:
        """The node of elementwise ``op`` on ``args``: a folded constant, a simpler node the op's
        identities give, or a new node (:mod:`lazykern.compiler.ops` declares each)."""
        rule = lookup(OPS, op)
        if rule.kind != "elementwise" or rule.arity != len(args):
            raise UnknownOp(f"{op!r} is not an elementwise operation of {len(args)} arguments")
        values = [self.const_value(a) for a in args]
        if None not in values:
            folded = rule.fold(*values)
            if folded is not None:
                return self.const(folded, width)
        simpler = rule.simplify(self, args, width)
        if simpler is not None:
            return simpler
        return self._add(op, args, None, width)

    def power(self, a: int, p: float) -> int:
        if p == 0.0:
            return self.const(1.0, self.width(a))
        if p == 1.0:
            return a
        if p == 2.0:
            return self.binary("mul", a, a)
        if p == 0.5:
            return self.unary("sqrt", a)
        if p == -0.5:
            return self.unary("rsqrt", a)
        if p == int(p) and 2 <= abs(p) <= 16:
            # Integer powers (power sums, polynomial profiles) by squaring: a few multiplies, exact
            # at negative bases, where pow() would be a library call.
            k, result, base = int(abs(p)), None, a
            while k:
                if k & 1:
                    result = base if result is None else self.binary("mul", result, base)
                k >>= 1
                if k:
                    base = self.binary("mul", base, base)
            assert result is not None  # k >= 2 has a set bit
            return result if p > 0 else self.binary("div", self.const(1.0), result)
        return self._add("pow", (a,), float(p), self.width(a))

    # ------------------------------------------------------------------ feature axis
    def sum(self, a: int) -> int:
        node = self.nodes[a]
        if node.width == 1:
            return a
        if node.op == "const":
            return self.const(node.attr * node.width)
        if node.op == "expand":
            return self.binary("mul", node.args[0], self.const(float(node.width)))
        return self._add("sum", (a,), None, 1)

    def expand(self, a: int, width: int) -> int:
        node = self.nodes[a]
        if node.width == width:
            return a
        if node.width != 1:
            raise Unsupported(f"cannot expand width {node.width} to {width}")
        if node.op == "const":
            return self.const(node.attr, width)
        return self._add("expand", (a,), None, width)

    def slice(self, a: int, start: int, length: int) -> int:
        node = self.nodes[a]
        if not (0 <= start and length >= 1 and start + length <= node.width):
            raise Unsupported(f"slice [{start}:{start + length}] of a width-{node.width} value")
        if start == 0 and length == node.width:
            return a
        if node.op == "const":
            return self.const(node.attr, length)
        if node.op == "expand":
            return self.expand(node.args[0], length)
        if node.op == "slice":
            return self.slice(node.args[0], node.attr + start, length)
        if node.op == "concat":
            offset = 0
            for part in node.args:
                w = self.width(part)
                if offset <= start and start + length <= offset + w:
                    return self.slice(part, start - offset, length)
                offset += w
        return self._add("slice", (a,), start, length)

    def concat(self, parts: list[int]) -> int:
        flat: list[int] = []
        for p in parts:
            node = self.nodes[p]
            flat.extend(node.args if node.op == "concat" else (p,))
        merged: list[int] = []
        for p in flat:  # adjacent constants of one value, and adjacent slices of one node, merge
            if merged:
                q = self.nodes[merged[-1]]
                n = self.nodes[p]
                if q.op == n.op == "const" and q.attr == n.attr:
                    merged[-1] = self.const(q.attr, q.width + n.width)
                    continue
                if q.op == n.op == "slice" and q.args == n.args and q.attr + q.width == n.attr:
                    merged[-1] = self.slice(q.args[0], q.attr, q.width + n.width)
                    continue
            merged.append(p)
        if len(merged) == 1:
            return merged[0]
        return self._add("concat", tuple(merged), None, sum(self.width(p) for p in merged))

    # ------------------------------------------------------------------ recurrences
    def elementary_symmetric(self, a: int, max_degree: int) -> int:
        r"""Node ``"esym"``: :math:`\tilde e_1(a), \dots, \tilde e_R(a)`, ``R = max_degree`` wide."""
        if not 1 <= max_degree <= self.width(a):
            raise Unsupported(f"max_degree {max_degree} for {self.width(a)} inputs")
        return self._add("esym", (a,), max_degree, max_degree)

    def elementary_symmetric_vjp(self, a: int, g: int, max_degree: int) -> int:
        r"""Node ``"esym_vjp"``: :math:`\big(\sum_r g_r\, \partial \tilde e_r(a) / \partial a_d\big)_d`,
        as wide as ``a``."""
        return self._add("esym_vjp", (a, self.expand(g, max_degree)), max_degree, self.width(a))

    # ------------------------------------------------------------------ queries
    def reachable(self, roots: list[int]) -> list[int]:
        """Nodes the ``roots`` depend on, in topological (creation) order."""
        return reachable(self.nodes, roots)


def reachable(nodes: list[Node] | tuple[Node, ...], roots: list[int]) -> list[int]:
    """Indices of the ``nodes`` (of a graph, or of a compacted pass) the ``roots`` depend on, in
    topological (creation) order."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        a = stack.pop()
        if a not in seen:
            seen.add(a)
            stack.extend(nodes[a].args)
    return sorted(seen)


class Sym:
    """A placeholder standing for a KeOps ``LazyTensor`` while a formula is traced."""

    __array_priority__ = 1000  # numpy scalars defer to Sym's reflected operators

    #: Marks a placeholder for the formulas (duck-typed: :mod:`lazykern.formulas` never imports the
    #: engine), which then call its methods that a ``LazyTensor`` lacks or spells otherwise.
    traced = True

    def __init__(self, graph: Graph, node: int) -> None:
        self.graph = graph
        self.node = node

    # ------------------------------------------------------------------ plumbing
    def _wrap(self, node: int) -> "Sym":
        return Sym(self.graph, node)

    def _operand(self, other: Any) -> int:
        if isinstance(other, Sym):
            if other.graph is not self.graph:
                raise Unsupported("operands from two different traces")
            return other.node
        if isinstance(other, bool) or not isinstance(other, numbers.Real):
            raise Unsupported(f"operand of type {type(other).__name__} (only placeholders and Python numbers)")
        return self.graph.const(float(other))

    def _bin(self, op: str, a: Any, b: Any) -> "Sym":
        return self._wrap(self.graph.binary(op, self._operand(a), self._operand(b)))

    @property
    def ndim(self) -> int:
        """The width of the feature axis (as ``LazyTensor.ndim``)."""
        return self.graph.width(self.node)

    def __bool__(self) -> bool:
        raise Unsupported("a formula branched on the value of a symbolic expression")

    def __getattr__(self, name: str) -> Any:
        raise _UnsupportedAttribute(f"LazyTensor method or attribute {name!r}")

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, o: Any) -> "Sym":
        return self._bin("add", self, o)

    def __radd__(self, o: Any) -> "Sym":
        return self._bin("add", o, self)

    def __sub__(self, o: Any) -> "Sym":
        return self._bin("sub", self, o)

    def __rsub__(self, o: Any) -> "Sym":
        return self._bin("sub", o, self)

    def __mul__(self, o: Any) -> "Sym":
        return self._bin("mul", self, o)

    def __rmul__(self, o: Any) -> "Sym":
        return self._bin("mul", o, self)

    def __truediv__(self, o: Any) -> "Sym":
        return self._bin("div", self, o)

    def __rtruediv__(self, o: Any) -> "Sym":
        return self._bin("div", o, self)

    def __neg__(self) -> "Sym":
        return self._wrap(self.graph.unary("neg", self.node))

    def __pos__(self) -> "Sym":
        return self

    def __pow__(self, p: Any) -> "Sym":
        if isinstance(p, Sym) or isinstance(p, bool) or not isinstance(p, numbers.Real):
            raise Unsupported("** with a non-constant exponent")
        return self._wrap(self.graph.power(self.node, float(p)))

    def power(self, p: Any) -> "Sym":
        return self.__pow__(p)

    def __abs__(self) -> "Sym":
        return self.abs()

    def __or__(self, o: Any) -> "Sym":
        return (self * o).sum(-1)

    def __ror__(self, o: Any) -> "Sym":
        return (self * o).sum(-1)

    # ------------------------------------------------------------------ elementwise functions
    # exp, expm1, log, sin, cos, sqrt, rsqrt, abs, sign, step, relu: one method per operation of
    # lazykern.compiler.ops that declares one, defined below the class from that table.

    def square(self) -> "Sym":
        return self * self

    # ------------------------------------------------------------------ feature axis
    def sum(self, dim: Any = None, axis: Any = None, **kwargs: Any) -> "Sym":
        d = dim if axis is None else axis
        if d != -1 or kwargs.get("keepdim", True) is not True:
            raise Unsupported(f"sum over dim={d!r} (only the feature axis, -1, inside a formula)")
        return self._wrap(self.graph.sum(self.node))

    def sqnorm2(self) -> "Sym":
        return (self * self).sum(-1)

    def norm2(self) -> "Sym":
        return self.sqnorm2().sqrt()

    def sqdist(self, o: "Sym") -> "Sym":
        return (self - o).sqnorm2()

    def matvecmult(self, v: "Sym") -> "Sym":
        """As ``LazyTensor.matvecmult``: ``self`` holds a row-major matrix of ``self.ndim // v.ndim``
        rows, times the vector ``v``."""
        if not isinstance(v, Sym):
            raise Unsupported(f"matvecmult by {type(v).__name__}")
        n = v.ndim
        if self.ndim % n:
            raise Unsupported(f"matvecmult of a width-{self.ndim} matrix by a width-{n} vector")
        rows = [(self.extract(k * n, n) * v).sum(-1) for k in range(self.ndim // n)]
        return self._wrap(self.graph.concat([r.node for r in rows]))

    def elementary_symmetric(self, max_degree: int) -> "Sym":
        """The R normalized elementary symmetric polynomials of the feature axis (one node)."""
        return self._wrap(self.graph.elementary_symmetric(self.node, int(max_degree)))

    def elem(self, k: int) -> "Sym":
        return self.extract(k, 1)

    def extract(self, start: int, length: int) -> "Sym":
        w = self.ndim
        if start < 0:
            start += w
        return self._wrap(self.graph.slice(self.node, int(start), int(length)))

    def __getitem__(self, key: Any) -> "Sym":
        if isinstance(key, tuple):  # x[..., k] or x[:, :, k]: only the last (feature) axis
            *lead, key = key
            if not all(k is Ellipsis or k == slice(None) for k in lead):
                raise Unsupported("indexing other than along the feature axis")
        w = self.ndim
        if isinstance(key, bool) or not isinstance(key, (int, slice)):
            raise Unsupported(f"index {key!r} (only integers and unit-step slices of the feature axis)")
        if isinstance(key, int):
            if not -w <= key < w:
                raise Unsupported(f"index {key} out of range for width {w}")
            return self.elem(key % w)
        start, stop, step = key.indices(w)
        if step != 1 or stop <= start:
            raise Unsupported(f"slice {key!r} of a width-{w} value")
        return self.extract(start, stop - start)

    def concat(self, o: "Sym") -> "Sym":
        return self._wrap(self.graph.concat([self.node, self._operand(o)]))

    cat = concatenate = concat


def _method(name: str, op: str, doc: str | None) -> Callable[[Sym], Sym]:
    """``Sym.<name>()``: the unary operation ``op`` of the placeholder."""

    def method(self: Sym) -> Sym:
        return self._wrap(self.graph.unary(op, self.node))

    method.__name__, method.__qualname__, method.__doc__ = name, f"Sym.{name}", doc
    return method


for _op in OPS.values():
    if _op.method is not None:
        setattr(Sym, _op.method, _method(_op.method, _op.name, type(_op).__doc__))


def trace(
    formula: Formula,
    graph: Graph,
    first: str,
    second: str,
    params: Mapping[str, int],
    width: int,
    second_width: int | None = None,
) -> int:
    """Record ``formula(first, second, **params)`` into ``graph``; returns the root node.

    ``first`` and ``second`` name the leaves passed as the formula's two inputs (of widths
    ``width`` and ``second_width``, default ``width``), ``params`` maps each parameter name to its
    width. Raises :class:`Unsupported` for anything the engine cannot generate, including a result
    wider than one value per pair.
    """
    x1 = Sym(graph, graph.leaf(first, width))
    x2 = Sym(graph, graph.leaf(second, width if second_width is None else second_width))
    kwargs = {name: Sym(graph, graph.leaf(f"p:{name}", w)) for name, w in params.items()}
    try:
        out = formula(x1, x2, **kwargs)
    except Unsupported:
        raise
    except (TypeError, ValueError, AttributeError, IndexError, KeyError, NotImplementedError) as err:
        raise Unsupported(f"tracing the formula failed: {type(err).__name__}: {err}") from err
    if isinstance(out, numbers.Real) and not isinstance(out, bool):
        out = Sym(graph, graph.const(float(out)))
    if not isinstance(out, Sym) or out.graph is not graph:
        raise Unsupported(f"the formula returned {type(out).__name__}, not an expression of its inputs")
    if out.ndim != 1:
        raise Unsupported(f"the formula gives {out.ndim} values per pair; the CPU engine reduces scalar kernels")
    return out.node
