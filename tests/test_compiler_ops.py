"""The table of operations of lazykern's compiler (lazykern.compiler.ops) and its targets' code tables.

Every operation has a derivative rule, every elementwise one has code in the C target
(lazykern.cpu.codegen.CODE) and the Triton target (lazykern.triton.codegen.CODE), and both
targets generate a pass for every operation of the table; an operation the table does not know is
an error wherever it is met (tracer, differentiation, code generation), never a zero derivative.
Nothing here compiles: code generation is pure Python.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lazykern.compiler import ops
from lazykern.compiler.grad import adjoints
from lazykern.compiler.plan import analyze, param_spec, program
from lazykern.compiler.trace import Graph, Node, Unsupported
from lazykern.cpu import codegen as c_target
from lazykern.formulas import InteractionFormula, StationaryFormula
from lazykern.formulas.interactions import elementary_symmetric
from lazykern.triton import codegen as triton_target

TARGETS = {"C": c_target, "Triton": triton_target}
D = 3


def every_elementwise_op(x1, x2, a):
    """A formula that uses every elementwise operation of the table, and slices and sums."""
    z = x1 - x2
    u = z * z + 1
    return (
        (z.abs() + 1).log() * a + z.sin() * z.cos() + u.sqrt() + u.rsqrt() + z.relu() + z.sign() * z.step()
        + u ** 1.3 + (-z).expm1() + z.exp() / a + z[0:2].sum(-1) * z[1]
    ).sum(-1)


def one_sided_orders(x1, x2, w):
    """The recurrence of one side only: a row value in passes over rows of x1."""
    return elementary_symmetric(x1 * w, D).sum(-1) * (-0.5 * (x2 * x2).sum(-1)).exp()


#: (formula, its parameters' widths): between them every operation of the table, pair and row values.
FORMULAS = [
    (every_elementwise_op, {"a": 1}),
    (InteractionFormula(StationaryFormula("rbf"), 2), {"scales": D, "order_variances": 2}),
    (one_sided_orders, {"w": D}),
]
JOBS = ("mm", "dense", "gradA", "gradB", "sym-pair")


def reductions():
    for formula, widths in FORMULAS:
        for job in JOBS:
            want = () if job in ("mm", "dense") else ("x", *widths)
            yield program(formula, job, D, D, tuple(widths.items()), "double", want)


def missing() -> list[str]:
    """What the table and the targets lack: derivative rules, elementwise code, stale entries."""
    problems = []
    for name, op in ops.OPS.items():
        if type(op).adjoint is ops.Op.adjoint:
            problems.append(f"{name}: no derivative rule")
        for target, module in TARGETS.items():
            if op.kind == "elementwise" and name not in module.CODE:
                problems.append(f"{name}: no {target} code")
    for target, module in TARGETS.items():
        problems += [f"{name}: {target} code for an operation not in the table" for name in module.CODE
                     if ops.OPS.get(name) is None or ops.OPS[name].kind != "elementwise"]
    return problems


def test_every_op_has_a_derivative_rule_and_code_in_every_target():
    assert missing() == []


def test_every_target_generates_every_op_of_the_table():
    """The operations the targets' writers lay out themselves (leaves, the feature axis, the
    recurrences) are covered too: the passes of FORMULAS hold every operation of the table, and
    both targets generate each pass."""
    seen = set()
    for red in reductions():
        seen |= {node.op for node in red.nodes}
        for module in TARGETS.values():
            assert module.generate(red)
    assert seen == set(ops.OPS)


@pytest.mark.parametrize("target", TARGETS)
def test_removing_a_code_entry_fails(target, monkeypatch):
    monkeypatch.delitem(TARGETS[target].CODE, "sin")
    assert missing() == [f"sin: no {target} code"]
    red = program(every_elementwise_op, "mm", D, D, (("a", 1),), "double")
    with pytest.raises(ops.UnknownOp, match="'sin'"):
        TARGETS[target].generate(red)


def test_removing_a_derivative_rule_fails(monkeypatch):
    monkeypatch.setattr(ops.Sin, "adjoint", ops.Op.adjoint)
    assert missing() == ["sin: no derivative rule"]
    with pytest.raises(ops.UnknownOp, match="'sin' has no derivative rule"):
        program(every_elementwise_op, "gradA", D, D, (("a", 1),), "double", ("x",))


def test_a_new_op_without_code_fails(monkeypatch):
    class Tanh(ops.Op):
        name, arity, kind, method = "tanh", 1, "elementwise", "tanh"

        def adjoint(self, graph, z, node, g, give):
            give(node.args[0], graph.binary("mul", g, graph.binary("sub", graph.const(1.0), graph.binary("mul", z, z))))

    monkeypatch.setitem(ops.OPS, "tanh", Tanh())
    assert missing() == ["tanh: no C code", "tanh: no Triton code"]


def _with_unknown_op():
    """The product pass of an RBF kernel with its exponential renamed to an operation nobody knows."""
    red = program(StationaryFormula("rbf"), "mm", D, D, (), "double")
    nodes = tuple(dataclasses.replace(n, op="frobnicate") if n.op == "exp" else n for n in red.nodes)
    assert nodes != red.nodes
    return dataclasses.replace(red, nodes=nodes)


@pytest.mark.parametrize("target", TARGETS)
def test_an_unknown_op_is_an_error_in_every_target(target):
    with pytest.raises(ops.UnknownOp, match="'frobnicate'"):
        TARGETS[target].generate(_with_unknown_op())


def test_an_unknown_op_is_an_error_in_differentiation_and_tracing():
    g = Graph()
    x, w = g.leaf("x", 1), g.leaf("w", 1)
    g.nodes.append(Node("frobnicate", (x,), None, 1))  # as if an operation had been added without a rule
    with pytest.raises(ops.UnknownOp, match="'frobnicate'"):
        adjoints(g, [(len(g.nodes) - 1, w)], [x])
    with pytest.raises(ops.UnknownOp, match="'frobnicate'"):
        g.unary("frobnicate", x)
    with pytest.raises(ops.UnknownOp, match="'sum'"):
        g.unary("sum", x)  # not elementwise: the feature axis has its own builder


@pytest.mark.parametrize("target", TARGETS)
def test_targets_read_the_plan_s_analysis(target, monkeypatch):
    """Both writers take the row/pair classification from lazykern.compiler.plan.analyze, so a
    leaf no buffer binds fails there, for both alike."""
    red = program(StationaryFormula("rbf"), "mm", D, D, (), "double")
    layout = analyze(red)
    assert {red.nodes[z].attr: layout.row[z] for z in layout.needed if red.nodes[z].op == "in"} == {"o": True, "i": False}
    assert not layout.row[red.matmul[0]]  # the kernel value is a pair value
    unbound = dataclasses.replace(red, inner=())
    with pytest.raises(Unsupported, match="leaf 'i' has no buffer"):
        TARGETS[target].generate(unbound)


def test_folding_and_identities_follow_the_table():
    g = Graph()
    x = g.leaf("x", 3)
    two, zero, one = g.const(2.0), g.const(0.0), g.const(1.0)
    assert g.const_value(g.unary("exp", zero)) == 1.0
    assert g.nodes[g.unary("log", one)].op == "log"  # log is not folded: the table says so
    assert g.const_value(g.binary("div", two, two)) == 1.0
    assert g.binary("add", x, zero) == x and g.binary("mul", one, x) == x
    assert g.binary("mul", x, two) == g.binary("mul", two, x)  # commutative: one node
    assert g.nodes[g.binary("sub", zero, x)].op == "neg"
    assert g.unary("neg", g.unary("neg", x)) == x
    assert g.const_value(g.binary("div", zero, zero)) == 0.0  # 0 / 0 not folded; 0 / b is 0


def test_the_tracer_methods_come_from_the_table():
    from lazykern.compiler.trace import Sym

    for name, op in ops.OPS.items():
        if op.method is not None:
            assert getattr(Sym, op.method).__doc__ == type(op).__doc__, name
    g = Graph()
    s = Sym(g, g.leaf("x", 2))
    assert g.nodes[s.relu().node].op == "relu"
    assert param_spec({"a": torch.ones(1, 4)}) == (("a", 4),)
