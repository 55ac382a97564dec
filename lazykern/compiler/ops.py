r"""The operations of lazykern's compiler, each declared once: arity, constant folding, derivative.

Every node of a :class:`~lazykern.compiler.trace.Graph` names one of the operations of :data:`OPS`
(keopscore's style: one small class per operation, its math beside it). The tracer builds nodes
through this table (which constants fold, which identities simplify), the symbolic
differentiation of :mod:`lazykern.compiler.grad` asks it for the derivative rule, and each target
keeps one code table keyed by its names: ``CODE`` of :mod:`lazykern.cpu.codegen` (C) and of
:mod:`lazykern.triton.codegen` (Triton). A new elementwise operation is one class here and one
entry in each target's table; ``tests/test_compiler_ops.py`` fails until all of them are there.

Operations come in four kinds:

* ``"leaf"``: named inputs and constants (``in``, ``const``);
* ``"elementwise"``: one value per feature index (``add`` ... ``relu``, ``pow``), the ones the
  targets' code tables spell;
* ``"axis"``: structure of the feature axis (``sum``, ``expand``, ``slice``, ``concat``), which
  each target's writer lays out itself (a sum is a loop in C, a chain of adds in Triton);
* ``"recurrence"``: loops over the feature axis as one node (``esym``, ``esym_vjp``).

A derivative rule receives the graph, the node's index ``z``, the node, its adjoint ``g`` (a node)
and ``give(arg, expr, start=0, length=None)``, which adds ``expr`` to the adjoint of argument node
``arg`` (over ``[start, start + length)`` of its feature axis). An operation not in the table is
an error (:class:`UnknownOp`), never a zero derivative.

Example:
    >>> OPS["exp"].arity, OPS["exp"].fold(0.0), OPS["log"].fold(1.0) is None
    (1, 1.0, True)
    >>> sorted(op.name for op in OPS.values() if op.kind == "recurrence")
    ['esym', 'esym_vjp']
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Mapping

__all__ = ["OPS", "Op", "Unsupported", "UnknownOp", "lookup"]


class Unsupported(Exception):
    """The formula uses something the compiler does not generate code for."""


class UnknownOp(LookupError):
    """A graph node names an operation that the table does not have, or whose derivative rule or
    target code is missing: a bug of lazykern, not a property of the formula (so neither
    :class:`Unsupported`, which sends the formula to another engine, nor a ``RuntimeError``, which
    the planner treats as a formula it cannot plan)."""


Give = Callable[..., None]


class Op:
    """One operation of the graph. Subclasses set ``name``, ``arity`` (number of argument nodes;
    ``None``: any) and ``kind``, and define :meth:`adjoint`; elementwise ones may fold constants."""

    name: ClassVar[str]
    arity: ClassVar[int | None]
    kind: ClassVar[str]
    #: The ``LazyTensor`` method the tracer's placeholders define for it (``None``: an operator).
    method: ClassVar[str | None] = None
    #: ``a op b`` is ``b op a``: one node for both orders.
    commutative: ClassVar[bool] = False

    def fold(self, *values: float) -> float | None:
        """The value of the operation on constants, or ``None`` where it is not folded."""
        return None

    def simplify(self, graph: Any, args: tuple[int, ...], width: int) -> int | None:
        """An existing or simpler node equal to the operation on ``args`` (identities such as
        ``x + 0``), or ``None``."""
        return None

    def adjoint(self, graph: Any, z: int, node: Any, g: int, give: Give) -> None:
        """Pass the adjoint ``g`` of node ``z`` on to its arguments through ``give`` (see the module
        docstring); every operation defines its own, an empty one where nothing passes on."""
        raise UnknownOp(f"operation {self.name!r} has no derivative rule")


def _is(graph: Any, a: int, value: float) -> bool:
    return graph.const_value(a) == value


def _full_width(graph: Any, a: int, width: int) -> bool:
    """``a`` alone is as wide as the result (an identity may return it without a broadcast)."""
    return graph.width(a) == width


# ---------------------------------------------------------------------------- leaves
class Input(Op):
    """A named input of the reduction (one side of the pair, a parameter, a pair weight); ``attr``
    is the name. Its adjoint is what differentiation returns."""

    name, arity, kind = "in", 0, "leaf"

    def adjoint(self, graph, z, node, g, give):
        pass


class Const(Op):
    """A constant of the formula (``attr``: the value), the same at every feature index."""

    name, arity, kind = "const", 0, "leaf"

    def adjoint(self, graph, z, node, g, give):
        pass


# ---------------------------------------------------------------------------- elementwise, binary
class Add(Op):
    r""":math:`a + b`; :math:`\bar a = \bar b = g`."""

    name, arity, kind, commutative = "add", 2, "elementwise", True

    def fold(self, a, b):
        return a + b

    def simplify(self, graph, args, width):
        a, b = args
        if _is(graph, b, 0.0) and _full_width(graph, a, width):
            return a
        if _is(graph, a, 0.0) and _full_width(graph, b, width):
            return b
        return None

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], g)
        give(node.args[1], g)


class Sub(Op):
    r""":math:`a - b`; :math:`\bar a = g,\ \bar b = -g`."""

    name, arity, kind = "sub", 2, "elementwise"

    def fold(self, a, b):
        return a - b

    def simplify(self, graph, args, width):
        a, b = args
        if _is(graph, b, 0.0) and _full_width(graph, a, width):
            return a
        if _is(graph, a, 0.0) and _full_width(graph, b, width):
            return graph.unary("neg", b)
        return None

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], g)
        give(node.args[1], graph.unary("neg", g))


class Mul(Op):
    r""":math:`a b`; :math:`\bar a = g b,\ \bar b = g a`."""

    name, arity, kind, commutative = "mul", 2, "elementwise", True

    def fold(self, a, b):
        return a * b

    def simplify(self, graph, args, width):
        a, b = args
        if _is(graph, a, 0.0) or _is(graph, b, 0.0):
            return graph.const(0.0, width)
        for one, other in ((b, a), (a, b)):
            if _is(graph, one, 1.0) and _full_width(graph, other, width):
                return other
        for one, other in ((b, a), (a, b)):
            if _is(graph, one, -1.0) and _full_width(graph, other, width):
                return graph.unary("neg", other)
        return None

    def adjoint(self, graph, z, node, g, give):
        a, b = node.args
        give(a, graph.binary("mul", g, b))
        give(b, graph.binary("mul", g, a))


class Div(Op):
    r""":math:`a / b`; :math:`\bar a = g / b,\ \bar b = -g (a / b) / b` (the node :math:`a/b` reused)."""

    name, arity, kind = "div", 2, "elementwise"

    def fold(self, a, b):
        return None if b == 0.0 else a / b

    def simplify(self, graph, args, width):
        a, b = args
        if _is(graph, b, 1.0) and _full_width(graph, a, width):
            return a
        if _is(graph, a, 0.0):
            return graph.const(0.0, width)
        return None

    def adjoint(self, graph, z, node, g, give):
        a, b = node.args
        give(a, graph.binary("div", g, b))
        give(b, graph.unary("neg", graph.binary("div", graph.binary("mul", g, z), b)))


# ---------------------------------------------------------------------------- elementwise, unary
class Neg(Op):
    r""":math:`-a`; :math:`\bar a = -g`."""

    name, arity, kind = "neg", 1, "elementwise"

    def fold(self, a):
        return -a

    def simplify(self, graph, args, width):
        inner = graph.nodes[args[0]]
        return inner.args[0] if inner.op == "neg" else None

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.unary("neg", g))


class Exp(Op):
    r""":math:`e^a`; :math:`\bar a = g e^a` (the node itself: one exponential per pair)."""

    name, arity, kind, method = "exp", 1, "elementwise", "exp"

    def fold(self, a):
        return math.exp(a)

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.binary("mul", g, z))


class Expm1(Op):
    r""":math:`e^a - 1`, accurate near 0 (C's ``expm1``; not a ``LazyTensor`` method);
    :math:`\bar a = g\,(\operatorname{expm1}(a) + 1)`: no second exponential per pair."""

    name, arity, kind, method = "expm1", 1, "elementwise", "expm1"

    def fold(self, a):
        return math.expm1(a)

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.binary("mul", g, graph.binary("add", z, graph.const(1.0))))


class Log(Op):
    r""":math:`\log a`; :math:`\bar a = g / a`."""

    name, arity, kind, method = "log", 1, "elementwise", "log"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.binary("div", g, node.args[0]))


class Sin(Op):
    r""":math:`\sin a`; :math:`\bar a = g \cos a`."""

    name, arity, kind, method = "sin", 1, "elementwise", "sin"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.binary("mul", g, graph.unary("cos", node.args[0])))


class Cos(Op):
    r""":math:`\cos a`; :math:`\bar a = -g \sin a`."""

    name, arity, kind, method = "cos", 1, "elementwise", "cos"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.unary("neg", graph.binary("mul", g, graph.unary("sin", node.args[0]))))


class Sqrt(Op):
    r""":math:`\sqrt a`; :math:`\bar a = \tfrac12 g / \sqrt a` (the node itself)."""

    name, arity, kind, method = "sqrt", 1, "elementwise", "sqrt"

    def fold(self, a):
        return math.sqrt(a)

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.binary("div", graph.binary("mul", graph.const(0.5), g), z))


class Rsqrt(Op):
    r""":math:`a^{-1/2}`; :math:`\bar a = -\tfrac12 g\, a^{-1/2} / a`."""

    name, arity, kind, method = "rsqrt", 1, "elementwise", "rsqrt"

    def adjoint(self, graph, z, node, g, give):
        b = graph.binary
        give(node.args[0], b("div", b("mul", graph.const(-0.5), b("mul", g, z)), node.args[0]))


class Abs(Op):
    r""":math:`|a|`; :math:`\bar a = g \operatorname{sign}(a)`."""

    name, arity, kind, method = "abs", 1, "elementwise", "abs"

    def fold(self, a):
        return abs(a)

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.binary("mul", g, graph.unary("sign", node.args[0])))


class Sign(Op):
    r""":math:`\operatorname{sign}(a) \in \{-1, 0, 1\}`; derivative zero almost everywhere."""

    name, arity, kind, method = "sign", 1, "elementwise", "sign"

    def adjoint(self, graph, z, node, g, give):
        pass


class Step(Op):
    r""":math:`1` for :math:`a \ge 0`, else :math:`0` (KeOps' ``step``); derivative zero almost everywhere."""

    name, arity, kind, method = "step", 1, "elementwise", "step"

    def adjoint(self, graph, z, node, g, give):
        pass


class Relu(Op):
    r""":math:`\max(a, 0)`; :math:`\bar a = g \operatorname{step}(a)`."""

    name, arity, kind, method = "relu", 1, "elementwise", "relu"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.binary("mul", g, graph.unary("step", node.args[0])))


class Pow(Op):
    r""":math:`a^p` for a constant, non-integer exponent ``p = attr`` (the tracer multiplies out
    small integer powers and writes :math:`p = \pm\tfrac12` as ``sqrt``/``rsqrt``);
    :math:`\bar a = p\, g\, a^{p-1}`."""

    name, arity, kind = "pow", 1, "elementwise"

    def adjoint(self, graph, z, node, g, give):
        p = node.attr
        b = graph.binary
        give(node.args[0], b("mul", b("mul", graph.const(p), g), graph.power(node.args[0], p - 1.0)))


# ---------------------------------------------------------------------------- feature axis
class Sum(Op):
    r""":math:`\sum_d a_d`, width 1; :math:`\bar a_d = g`."""

    name, arity, kind = "sum", 1, "axis"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], g)


class Expand(Op):
    r"""A width-1 value repeated ``width`` times; :math:`\bar a = \sum_d g_d`."""

    name, arity, kind = "expand", 1, "axis"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.sum(g))


class Slice(Op):
    r""":math:`(a_{s}, \dots, a_{s + w - 1})` for ``s = attr``; the adjoint scatters into that range."""

    name, arity, kind = "slice", 1, "axis"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], g, node.attr, node.width)


class Concat(Op):
    r"""The arguments side by side on the feature axis; each receives its range of the adjoint."""

    name, arity, kind = "concat", None, "axis"

    def adjoint(self, graph, z, node, g, give):
        offset = 0
        for part in node.args:
            w = graph.width(part)
            give(part, g if graph.width(g) == 1 else graph.slice(g, offset, w))
            offset += w


# ---------------------------------------------------------------------------- recurrences
class ElementarySymmetric(Op):
    r""":math:`\tilde e_1(a), \dots, \tilde e_R(a)` (``R = attr``), the normalized elementary
    symmetric polynomials of :func:`lazykern.formulas.interactions.elementary_symmetric_reference`;
    :math:`\bar a` is the ``esym_vjp`` node of :math:`(a, g)`."""

    name, arity, kind = "esym", 1, "recurrence"

    def adjoint(self, graph, z, node, g, give):
        give(node.args[0], graph.elementary_symmetric_vjp(node.args[0], g, node.attr))


class ElementarySymmetricVJP(Op):
    r""":math:`\big(\sum_r g_r\, \partial \tilde e_r(a) / \partial a_d\big)_d` for arguments
    :math:`(a, g)`, by reverse mode through the recurrence. Not differentiated again: second
    derivatives of interaction kernels go to another engine."""

    name, arity, kind = "esym_vjp", 2, "recurrence"

    def adjoint(self, graph, z, node, g, give):
        raise Unsupported("second derivatives of elementary symmetric polynomials")


#: Every operation of the compiler, by name.
OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Input(), Const(),
        Add(), Sub(), Mul(), Div(),
        Neg(), Exp(), Expm1(), Log(), Sin(), Cos(), Sqrt(), Rsqrt(), Abs(), Sign(), Step(), Relu(), Pow(),
        Sum(), Expand(), Slice(), Concat(),
        ElementarySymmetric(), ElementarySymmetricVJP(),
    )
}


def lookup(table: Mapping[str, Any], op: str, where: str = "lazykern.compiler.ops.OPS") -> Any:
    """``table[op]``, or :class:`UnknownOp` naming the table (``where``) that lacks it."""
    try:
        return table[op]
    except KeyError:
        raise UnknownOp(f"operation {op!r} is not in {where}") from None
