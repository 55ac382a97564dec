r"""The passes over pairs that every target of lazykern's compiler generates, planned once.

A :class:`Reduction` says what one pass computes for every *outer* row :math:`i` (one side of the
pair) as a reduction over the *inner* points :math:`j` (the other side):

* ``sums``: :math:`\sum_j e(i, j)` for vector expressions :math:`e` (gradients, per-row parameter
  partials), written side by side into one ``(rows, total width)`` output;
* ``matmul``: :math:`\sum_j k(i, j)\, v_{jc}` for a runtime number of columns :math:`c`;
* ``store``: :math:`k(i, j)` itself, one dense row per :math:`i`.

:func:`program` plans the pass of a job (a product, a dense block, a backward pass, the fused
symmetric gradient): it traces the formula (:mod:`lazykern.compiler.trace`), differentiates it
(:mod:`lazykern.compiler.grad`) and chooses the outputs. Nothing here depends on the device: the C
target (:mod:`lazykern.cpu.codegen`) and the Triton target (:mod:`lazykern.triton.codegen`) turn
the same :class:`Reduction` into their code, both reading it through the same :func:`analyze`
(the buffer of each leaf, the nodes the outputs need, which are row values and which pair values),
and ``dtype`` is a name (``"float"``, ``"double"``) each target maps to its own type.

Example:
    >>> from lazykern.formulas import StationaryFormula
    >>> red = program(StationaryFormula("rbf"), "gradA", 3, 3, (), "double", ("x",))
    >>> red.sums_width, red.weights
    (3, (('w0', 'dot', 0, 0),))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Hashable, Mapping

import torch
from torch import Tensor

from ..formulas import Formula, declared
from .grad import adjoints
from .trace import Graph, Node, Unsupported, reachable, trace

__all__ = ["DTYPES", "Analysis", "Reduction", "analyze", "compact", "product_plan", "unsupported"]

#: The element types the targets compile for, by the plan's names (``Reduction.dtype``).
DTYPES = {torch.float32: "float", torch.float64: "double"}


@dataclass(frozen=True)
class Reduction:
    """One pass over pairs, as every target generates it (see the module docstring); hashable, and its
    ``repr`` is the targets' cache key.

    Leaves of ``nodes`` are bound by name: ``outer`` names are ``(rows, width)`` row-major inputs of
    the outer side, ``inner`` names ``(width, Mp)`` dimension-major inputs of the inner side,
    ``params`` per-batch vectors, and ``weights`` pair weights, each ``(name, "dot", a, b)`` (the dot
    product of outer vector array ``a`` with inner vector array ``b`` over the runtime column count)
    or ``(name, "pair")`` (entry ``(i, j)`` of a dense ``(rows, M)`` array).
    ``outer_vecs``/``inner_vecs`` count the ``(rows, C)`` and ``(C, Mp)`` column arrays.
    ``matmul`` is ``(node, inner vector index)``.
    """

    nodes: tuple[Node, ...]
    outer: tuple[str, ...]
    inner: tuple[str, ...]
    params: tuple[str, ...]
    weights: tuple[tuple, ...]
    outer_vecs: int
    inner_vecs: int
    sums: tuple[int, ...]
    matmul: tuple[int, int] | None
    store: int | None
    dtype: str

    def operands(self) -> list[str]:
        """The buffer roles, in the order of the generated function's pointer array."""
        roles = [f"outer:{n}" for n in self.outer] + [f"inner:{n}" for n in self.inner]
        roles += [f"param:{n}" for n in self.params]
        roles += [f"ovec:{a}" for a in range(self.outer_vecs)] + [f"ivec:{a}" for a in range(self.inner_vecs)]
        roles += [f"pair:{w[0]}" for w in self.weights if w[1] == "pair"]
        if self.sums:
            roles.append("out:sums")
        if self.matmul is not None:
            roles.append("out:matmul")
        if self.store is not None:
            roles.append("out:store")
        return roles

    @property
    def sums_width(self) -> int:
        return sum(self.nodes[n].width for n in self.sums)


@dataclass(frozen=True)
class Analysis:
    """What every target reads off a :class:`Reduction` before it writes code: the buffer of each
    leaf, the nodes the outputs need and which of them are *row values*.

    ``role`` maps each leaf name to ``(kind, index)``: ``kind`` is ``"outer"``, ``"inner"``,
    ``"param"`` or ``"weight"``, ``index`` its position among the reduction's names of that kind
    (``Reduction.outer``, ``inner``, ``params``, ``weights``). ``needed`` lists the nodes the
    outputs depend on, in topological order. ``row[z]`` is true for a node that depends on the outer
    row only (outer inputs, parameters, constants and what is computed from them alone): a target
    computes it once per row; the others are *pair values*, computed for every pair. ``leaf_widths``
    gives the width of each leaf the nodes read.
    """

    role: Mapping[str, tuple[str, int]]
    needed: tuple[int, ...]
    row: Mapping[int, bool]
    leaf_widths: Mapping[str, int]

    def leaf_width(self, name: str) -> int:
        """The width of leaf ``name``; 1 for a leaf the reduction binds but its expressions never
        read (any row stride works for it: nothing is loaded)."""
        return self.leaf_widths.get(name, 1)


def analyze(red: Reduction) -> Analysis:
    """The :class:`Analysis` of ``red``; raises :class:`Unsupported` for a leaf no buffer binds.

    Example:
        >>> from lazykern.formulas import StationaryFormula
        >>> red = program(StationaryFormula("rbf"), "gradA", 3, 3, (), "double", ("x",))
        >>> a = analyze(red)
        >>> a.role["o"], a.role["w0"], a.leaf_width("i")
        (('outer', 0), ('weight', 0), 3)
        >>> [red.nodes[z].op for z in a.needed if a.row[z]]  # the row's input and a constant: nothing else
        ['in', 'const']
    """
    role: dict[str, tuple[str, int]] = {}
    for kind, names in (("outer", red.outer), ("inner", red.inner), ("param", red.params),
                        ("weight", [w[0] for w in red.weights])):
        for k, name in enumerate(names):
            role[name] = (kind, k)
    outputs = [*red.sums, *([red.matmul[0]] if red.matmul else []), *([red.store] if red.store is not None else [])]
    needed = tuple(reachable(red.nodes, outputs))
    row: dict[int, bool] = {}
    for z in needed:  # topological: a node's arguments are classified before it
        node = red.nodes[z]
        if node.op == "in":
            if node.attr not in role:
                raise Unsupported(f"leaf {node.attr!r} has no buffer")
            row[z] = role[node.attr][0] in ("outer", "param")
        else:
            row[z] = node.op == "const" or all(row[a] for a in node.args)
    leaf_widths: dict[str, int] = {}
    for node in red.nodes:
        if node.op == "in":
            leaf_widths.setdefault(node.attr, node.width)
    return Analysis(role=role, needed=needed, row=row, leaf_widths=leaf_widths)


def compact(graph: Graph, outputs: list[int]) -> tuple[tuple[Node, ...], dict[int, int]]:
    """The nodes ``outputs`` depend on, renumbered from 0 in topological order (a canonical form:
    two traces of one formula give equal tuples whatever else their graphs hold)."""
    keep = graph.reachable(outputs)
    new = {old: k for k, old in enumerate(keep)}
    nodes = tuple(
        Node(graph.nodes[old].op, tuple(new[a] for a in graph.nodes[old].args), graph.nodes[old].attr, graph.nodes[old].width)
        for old in keep
    )
    return nodes, new



def param_spec(params: Mapping[str, Tensor]) -> tuple[tuple[str, int], ...]:
    return tuple((name, p.shape[-1]) for name, p in params.items())


def program(formula: Formula, job: str, d1: int, d2: int, pspec: tuple, dtype: str, want: tuple[str, ...] = ()) -> Reduction:
    """The reduction of ``job`` (cached per formula when the formula is hashable)."""
    if isinstance(formula, Hashable):
        try:
            return _cached_program(formula, job, d1, d2, pspec, dtype, want)
        except TypeError as err:  # a formula with an unhashable field
            if "unhashable" not in str(err):
                raise
    return _build_program(formula, job, d1, d2, pspec, dtype, want)  # unhashable: built each time (tracing is cheap)


@functools.lru_cache(maxsize=1024)
def _cached_program(formula: Formula, job: str, d1: int, d2: int, pspec: tuple, dtype: str, want: tuple) -> Reduction:
    return _build_program(formula, job, d1, d2, pspec, dtype, want)


def _build_program(formula: Formula, job: str, d1: int, d2: int, pspec: tuple, dtype: str, want: tuple) -> Reduction:
    """Jobs: ``"mm"`` (:math:`K V`), ``"dense"`` (rows of K),
    ``"gradA"``/``"gradB"`` (backward passes over rows of ``x1``/``x2``, weights from dot products
    of column arrays), ``"gradA-pair"``/``"gradB-pair"`` (weights from a dense gradient matrix),
    ``"sym"`` (the fused gradient of :math:`\\sum_{ij} \\langle l_i, r_j\\rangle k(x_i, x_j)`),
    ``"sym-pair"`` (the same with weights from a dense gradient matrix :math:`G` and its transpose).
    ``want`` names the gradients a backward pass computes: ``"x"`` (its outer input), parameter
    names, ``"rhs"`` (``gradB`` only: :math:`K^\\top \\bar Y`)."""
    g = Graph()
    params = dict(pspec)
    names = tuple(f"p:{n}" for n in params)
    transposed = job in ("gradB", "gradB-pair")
    if transposed:  # outer rows are x2: the formula's first input is the inner side
        root = trace(formula, g, "i", "o", params, d1, d2)
        d_outer = d2
    else:
        root = trace(formula, g, "o", "i", params, d1, d2)
        d_outer = d1
    base: dict[str, Any] = dict(outer=("o",), inner=("i",), params=names, dtype=dtype)
    if job == "mm":
        nodes, new = compact(g, [root])
        return Reduction(nodes=nodes, weights=(), outer_vecs=0, inner_vecs=1, sums=(), matmul=(new[root], 0), store=None, **base)
    if job == "dense":
        nodes, new = compact(g, [root])
        return Reduction(nodes=nodes, weights=(), outer_vecs=0, inner_vecs=0, sums=(), matmul=None, store=new[root], **base)
    o = g.leaf("o", d_outer)
    leaves = {"x": o, **{n: g.leaf(f"p:{n}", w) for n, w in params.items()}}
    w0 = g.leaf("w0", 1)
    if job in ("sym", "sym-pair"):
        w1 = g.leaf("w1", 1)
        pair = job == "sym-pair"
        weights: tuple[tuple, ...] = (("w0", "pair"), ("w1", "pair")) if pair else (("w0", "dot", 0, 0), ("w1", "dot", 1, 1))
        if declared(formula).symmetric:  # dk(x_j, x_i)/dx_i = dk(x_i, x_j)/dx_i
            seeds_x = [(root, g.binary("add", w0, w1))]
        else:
            seeds_x = [(root, w0), (trace(formula, g, "i", "o", params, d1, d2), w1)]
        adjoint_nodes = []
        if "x" in want:
            adjoint_nodes.append(adjoints(g, seeds_x, [o])[o])
        pgrads = adjoints(g, [(root, w0)], [leaves[n] for n in params])
        adjoint_nodes += [pgrads[leaves[n]] for n in params if n in want]
        ovecs = ivecs = 0 if pair else 2
    else:
        pair = job.endswith("-pair")
        weights = (("w0", "pair"),) if pair else (("w0", "dot", 0, 0),)
        grads = adjoints(g, [(root, w0)], [leaves[n] for n in ("x", *params)])
        adjoint_nodes = [grads[leaves[n]] for n in ("x", *params) if n in want]
        ovecs = ivecs = 0 if pair else 1
    # A leaf the kernel does not depend on gets an explicit zero: the output layout stays fixed.
    outs = [g.const(0.0, g.width(leaves[n])) if e is None else g.expand(e, g.width(leaves[n]))
            for e, n in zip(adjoint_nodes, [n for n in ("x", *params) if n in want])]
    matmul_root = root if (job == "gradB" and "rhs" in want) else None
    nodes, new = compact(g, outs + ([matmul_root] if matmul_root is not None else []))
    return Reduction(
        nodes=nodes,
        weights=weights,
        outer_vecs=ovecs,
        inner_vecs=ivecs,
        sums=tuple(new[e] for e in outs),
        matmul=None if matmul_root is None else (new[matmul_root], 0),
        store=None,
        **base,
    )


def product_plan(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Reduction | None:
    """The product pass (job ``"mm"``) of ``formula`` on these tensors, where the compiler plans it
    whatever the target: all tensors of one dtype of ``DTYPES``, at least two-dimensional, with
    broadcastable batch shapes, and a formula that traces into operations the targets generate,
    with one value per pair; else ``None``. Nothing is compiled (the devices are each target's
    business).

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> x = torch.randn(10, 3, dtype=torch.float64)
        >>> type(product_plan(StationaryFormula("rbf"), x, x, {})).__name__, product_plan(StationaryFormula("rbf"), x, x.float(), {})
        ('Reduction', None)
    """
    tensors = [x1, x2, *params.values()]
    if x1.dtype not in DTYPES or not all(isinstance(t, Tensor) and t.dtype == x1.dtype and t.dim() >= 2 for t in tensors):
        return None
    try:
        torch.broadcast_shapes(*(t.shape[:-2] for t in tensors))
        return program(formula, "mm", x1.shape[-1], x2.shape[-1], param_spec(params), DTYPES[x1.dtype])
    except (Unsupported, RuntimeError):
        return None


def unsupported(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str | None:
    """What ``formula`` does that the compiler does not generate (the ``Unsupported`` message),
    or ``None`` when it traces: for the error of a target that declines it."""
    try:
        _build_program(formula, "mm", x1.shape[-1], x2.shape[-1], param_spec(params), DTYPES.get(x1.dtype, "double"), ())
    except Unsupported as err:
        return str(err)
    return None
