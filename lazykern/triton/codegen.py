r"""Triton source for one pass over pairs, generated from the same plan as the C target's.

The input is a :class:`lazykern.compiler.plan.Reduction` (what to compute for every *outer* row
:math:`i` as a reduction over the *inner* points :math:`j`); the output is one ``@triton.jit``
kernel. Where the C target (:mod:`lazykern.cpu.codegen`) vectorizes across pairs in loops over a
tile, a Triton program owns a block of ``BLOCK_N`` outer rows and walks the inner points in tiles
of ``BLOCK_M``; every pair expression is one ``[BLOCK_N, BLOCK_M]`` block of registers:

* the feature axis is unrolled when the source is generated (widths are structure, as in the
  graph): a width-:math:`D` node is :math:`D` blocks, a sum over the feature axis is a chain of
  adds in a fixed order, slices and concatenations only rename blocks;
* values of the row only (outer inputs, parameters, what is computed from them) are computed once
  per program, as ``[BLOCK_N, 1]`` blocks, before the loop over tiles;
* pair weights that are dot products of column arrays (:math:`\langle \bar Y_i, V_j\rangle`) and the
  product :math:`\sum_j k_{ij} V_{jc}` are ``tl.dot`` calls over column blocks of ``BLOCK_C``;
* sums over :math:`j` are one ``[BLOCK_N]`` accumulator per output lane; entries of a tile past
  the last row or point are masked to zero before anything is summed or stored;
* the recurrence nodes (``esym``: normalized elementary symmetric polynomials, ``esym_vjp``: their
  vector-Jacobian product) are unrolled as well: the summation recurrence of
  :func:`lazykern.formulas.interactions.elementary_symmetric_reference` in the C target's order of
  operations, its states kept as blocks, the reverse mode over the inputs backwards (tested against
  the specification in ``tests/test_elementary_symmetric.py``). The source grows as :math:`D R`, which suits the small orders of interaction
  kernels.

Nothing of the size of the problem is compiled in (``N``, ``M``, ``C`` and the batch are runtime
arguments, and Triton is told not to specialize on them or on the batch strides), so one compiled
kernel serves every size. Buffer layouts (batch strides in elements, 0 for a
tensor shared by the batch): outer inputs ``(rows, width)``, inner inputs dimension-major
``(width, M)`` (loads along :math:`j` are contiguous), parameters ``(width,)``, outer column arrays
``(rows, C)``, inner ones ``(M, C)``, pair weights and dense outputs ``(rows, M)``, sums
``(rows, total width)``, products ``(rows, C)``.

Example:
    >>> from lazykern.compiler.plan import program
    >>> from lazykern.formulas import StationaryFormula
    >>> red = program(StationaryFormula("rbf"), "mm", 3, 3, (), "double")
    >>> "tl.dot" in generate(red)
    True
"""

from __future__ import annotations

from typing import Any, cast

from ..compiler.ops import OPS, lookup
from ..compiler.plan import Reduction, analyze
from ..compiler.trace import Node

__all__ = ["generate"]

#: The smallest normal number of each type: dense entries below it are stored as zeros (see
#: :func:`lazykern.backend.pairwise_dense`).
_TINY = {"float": "1.1754943508222875e-38", "double": "2.2250738585072014e-308"}


def _expm1(var: str, args: list[str], attr: Any) -> list[str]:
    r"""Statements setting ``var`` to :math:`e^x - 1`, accurate near 0 from ``exp`` and ``log`` alone
    (Kahan: the rounding error of :math:`u = e^x` cancels in :math:`(u - 1) x / \log u`); Triton has
    no ``expm1`` on every backend. Inline, not a helper kernel: the interpreter patches the language
    at every call of one."""
    (x,) = args
    return [
        f"{var}_u = tl.exp({x})",
        f"{var}_n = (tl.abs({x}) < 1.0) & ({var}_u != 1.0)",
        f"{var}_w = tl.where({var}_n, {var}_u, 2.0)  # (where the quotient is not used: no 0 / 0, no inf / inf)",
        f"{var} = tl.where({var}_u == 1.0, {x},"
        f" tl.where({var}_n, ({var}_w - 1.0) * {x} / tl.log({var}_w), {var}_u - 1.0))",
    ]


def _pow(var: str, args: list[str], attr: Any) -> list[str]:
    r"""``var = a ** p``: :math:`e^{p \log a}`, nan below 0 as C's ``pow`` for a non-integer ``p``;
    for an integer ``p`` (the tracer multiplies out only 2 to 16) C's ``pow`` is defined below 0:
    :math:`|a|^p`, negated for an odd ``p``."""
    (a,) = args
    if not float(attr).is_integer():
        return [f"{var} = tl.exp({attr!r} * tl.log({a}))"]
    magnitude = f"tl.exp({attr!r} * tl.log(tl.abs({a})))"
    return [f"{var} = " + (magnitude if int(attr) % 2 == 0 else f"tl.where({a} < 0, -{magnitude}, {magnitude})")]


#: Triton code of each elementwise operation of :mod:`lazykern.compiler.ops`: an expression
#: (``{0}``, ``{1}`` the arguments), or a function ``(var, args, attr)`` giving the statements
#: that set ``var``.
CODE = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "neg": "(-{0})",
    "exp": "tl.exp({0})", "expm1": _expm1, "log": "tl.log({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})",
    "sqrt": "tl.sqrt({0})", "abs": "tl.abs({0})", "rsqrt": "(1.0 / tl.sqrt({0}))", "pow": _pow,
    "sign": "(({0} > 0).to(DT) - ({0} < 0).to(DT))", "step": "(1.0 - ({0} < 0).to(DT))",
    "relu": "tl.where({0} > 0, {0}, 0.0)",
}


def generate(red: Reduction, name: str = "lk_reduce") -> str:
    """The Python source of a module defining ``@triton.jit`` kernel ``name`` for ``red``, with
    arguments: the buffers in :meth:`~lazykern.compiler.plan.Reduction.operands` order, their batch
    strides (same order), ``N`` (outer rows), ``M`` (inner points), ``C`` (columns of the column
    arrays), then the constexprs ``BLOCK_N``, ``BLOCK_M``, ``BLOCK_C`` and ``DT`` (the element type).
    Grid: ``(cdiv(N, BLOCK_N), batch, cdiv(C, BLOCK_C))`` for a product, else the last axis 1."""
    return _Writer(red, name).source()


class _Writer:
    def __init__(self, red: Reduction, name: str) -> None:
        self.red, self.name, self.nodes = red, name, red.nodes
        self.layout = analyze(red)
        self.role, self.row = self.layout.role, self.layout.row
        self.ptr = {role: k for k, role in enumerate(red.operands())}
        self.pro: list[str] = []  # once per program: the row's values
        self.body: list[str] = []  # once per tile of inner points
        self.memo: dict[tuple[int, int], str] = {}

    def _buf(self, role: str) -> str:
        q = self.ptr[role]
        return f"B{q} + b * S{q}"

    # ------------------------------------------------------------------ expressions
    def ref(self, z: int, k: int) -> str:
        """A Triton expression of node ``z`` at feature index ``k``; the statements it needs are
        emitted once (into the prologue for row values, the tile loop for pair values)."""
        node = self.nodes[z]
        if node.width == 1:
            k = 0
        key = (z, k)
        if key in self.memo:
            return self.memo[key]
        out = self.pro if self.row[z] else self.body
        op = node.op
        if op == "const":
            return repr(node.attr)
        if op == "slice":
            return self.ref(node.args[0], k + node.attr)
        if op == "expand":
            return self.ref(node.args[0], 0)
        if op == "concat":
            for part in node.args:
                w = self.nodes[part].width
                if k < w:
                    return self.ref(part, k)
                k -= w
            raise AssertionError("index past a concatenation")
        var = f"v{z}_{k}"
        if op == "in":
            kind, idx = self.role[node.attr]
            if kind == "outer":
                width = self.layout.leaf_width(node.attr)
                out.append(f"{var} = tl.load({self._buf('outer:' + node.attr)} + rows2 * {width} + {k},"
                           " mask=rmask2, other=0.0)")
            elif kind == "inner":
                out.append(f"{var} = tl.load({self._buf('inner:' + node.attr)} + {k} * M + cols2,"
                           " mask=cmask2, other=0.0)")
            elif kind == "param":
                out.append(f"{var} = tl.load({self._buf('param:' + node.attr)} + {k})")
            else:
                out.extend(self._weight(idx, var))
        elif op == "sum":
            a = node.args[0]
            out.append(f"{var} = " + " + ".join(self.ref(a, j) for j in range(self.nodes[a].width)))
        elif lookup(OPS, op).kind == "recurrence":
            for j, expr in enumerate(self._recurrence(z, out)):
                self.memo[(z, j)] = expr
            return self.memo[key]
        else:
            args = [self.ref(a, k) for a in node.args]
            if len(args) == 1 and self.nodes[node.args[0]].op == "const":  # a function of a literal
                args = [f"tl.full([1, 1], {args[0]}, DT)"]
            out.extend(self._apply(node, var, args))
        self.memo[key] = var
        return var

    def _apply(self, node: Node, var: str, args: list[str]) -> list[str]:
        """The statements setting ``var`` to elementwise ``node`` of ``args``."""
        code = lookup(CODE, node.op, "lazykern.triton.codegen.CODE")
        return code(var, args, node.attr) if callable(code) else [f"{var} = {code.format(*args)}"]

    def _weight(self, idx: int, var: str) -> list[str]:
        """A pair weight: entry (i, j) of a dense array, or the dot product of two column arrays."""
        wt = self.red.weights[idx]
        if wt[1] == "pair":
            return [f"{var} = tl.load({self._buf('pair:' + wt[0])} + rows2 * M + cols2, mask=mask, other=0.0)"]
        _, _, a, b = wt
        return [
            f"{var} = tl.zeros([BLOCK_N, BLOCK_M], DT)",
            "for c0 in range(0, C, BLOCK_C):",
            "    cc = c0 + tl.arange(0, BLOCK_C)",
            f"    lhs = tl.load({self._buf(f'ovec:{a}')} + rows2 * C + cc[None, :],"
            " mask=rmask2 & (cc < C)[None, :], other=0.0)",
            f"    rhs = tl.load({self._buf(f'ivec:{b}')} + cols[:, None] * C + cc[None, :],"
            " mask=cmask[:, None] & (cc < C)[None, :], other=0.0)",
            f"    {var} += {self._dot('lhs', 'tl.trans(rhs)')}",
        ]

    def _dot(self, a: str, b: str) -> str:
        # float32: IEEE products, not TF32 (the engines agree to rounding)
        precision = ', input_precision="ieee"' if self.red.dtype == "float" else ""
        return f"tl.dot({a}, {b}{precision})"

    def _recurrence(self, z: int, out: list[str]) -> list[str]:
        """The blocks of recurrence node ``z``: ``esym`` gives its R orders, ``esym_vjp`` the D entries
        of its vector-Jacobian product (see the module docstring)."""
        node = self.nodes[z]
        r_max, zarg = node.attr, node.args[0]
        d = self.nodes[zarg].width
        inputs = [self.ref(zarg, j) for j in range(d)]
        # states[j][r]: after inputs 1..j, e_r / binom(j, r) (r = 0 is 1, r > j still 0)
        states: list[list[str | None]] = [["1.0"] + [None] * r_max]
        for j in range(1, d + 1):
            prev, cur = states[-1], list(states[-1])
            for r in range(min(j, r_max), 0, -1):
                var = f"e{z}_{j}_{r}"
                lower = inputs[j - 1] if r == 1 else f"{inputs[j - 1]} * {prev[r - 1]}"
                kept = f"{float(j - r)!r} * {prev[r]} + " if prev[r] is not None else ""
                out.append(f"{var} = ({kept}{float(r)!r} * {lower}) * {1.0 / j!r}")
                cur[r] = var
            states.append(cur)
        if node.op == "esym":
            return cast("list[str]", [states[d][r] for r in range(1, r_max + 1)])  # r_max <= d: all set above
        adj: list[str | None] = [None] + [self.ref(node.args[1], r - 1) for r in range(1, r_max + 1)]
        grads: list[str] = [""] * d
        for j in range(d, 0, -1):
            top, prev = min(j, r_max), states[j - 1]
            terms = [f"{adj[1]}"] + [f"{adj[r]} * {float(r)!r} * {prev[r - 1]}" for r in range(2, top + 1)]
            grads[j - 1] = var = f"g{z}_{j}"
            out.append(f"{var} = ({' + '.join(terms)}) * {1.0 / j!r}")
            new = list(adj)
            for r in range(1, top + 1):
                var = f"a{z}_{j}_{r}"
                keep = f"{float(j - r) / j!r} * {adj[r]}"
                nxt = f" + {float(r + 1)!r} * {inputs[j - 1]} * {adj[r + 1]} * {1.0 / j!r}" if r < top else ""
                out.append(f"{var} = {keep}{nxt}")
                new[r] = var
            adj = new
        return grads

    # ------------------------------------------------------------------ the kernel
    def source(self) -> str:
        red = self.red
        tail: list[str] = []  # after the loop over tiles
        lanes = 0
        for z in red.sums:
            for k in range(self.nodes[z].width):
                expr = self.ref(z, k)
                value = "tl.zeros([BLOCK_N], DT)"
                if expr != "0.0":  # (a gradient the kernel does not depend on is an explicit zero)
                    value = f"acc{lanes}"
                    self.pro.append(f"{value} = tl.zeros([BLOCK_N], DT)")
                    self.body.append(f"{value} += tl.sum(tl.where(mask, {expr}, 0.0), axis=1)")
                tail.append(f"tl.store({self._buf('out:sums')} + rows * {red.sums_width} + {lanes}, {value},"
                            " mask=smask)")
                lanes += 1
        if red.matmul:
            node, vec = red.matmul
            kij = self.ref(node, 0)
            self.pro.append("accm = tl.zeros([BLOCK_N, BLOCK_C], DT)")
            self.body += [
                f"kij = tl.where(mask, {kij}, 0.0).to(DT)",
                f"vt = tl.load({self._buf(f'ivec:{vec}')} + cols[:, None] * C + cs[None, :],"
                " mask=cmask[:, None] & (cs < C)[None, :], other=0.0)",
                f"accm += {self._dot('kij', 'vt')}",
            ]
            tail.append(f"tl.store({self._buf('out:matmul')} + rows2 * C + cs[None, :], accm,"
                        " mask=rmask2 & (cs < C)[None, :])")
        if red.store is not None:
            kij = self.ref(red.store, 0)
            self.body += [
                f"kij = tl.where(mask, {kij}, 0.0).to(DT)",
                f"tl.store({self._buf('out:store')} + rows2 * M + cols2,"
                f" tl.where(tl.abs(kij) < {_TINY[red.dtype]}, 0.0, kij), mask=mask)",
            ]
        roles = red.operands()
        args = [f"B{k}" for k in range(len(roles))] + [f"S{k}" for k in range(len(roles))]
        head = [
            "# Generated by lazykern.triton.codegen: one pass over pairs (see its module docstring).",
            f"# Buffers: {', '.join(f'B{k} = {r}' for k, r in enumerate(roles))}",
            "import triton",
            "import triton.language as tl",
        ]
        # Sizes and batch strides are not specialized on: Triton would otherwise compile a variant
        # per value class (equal to 1, divisible by 16) of each, every one a slow compile
        # (docs/triton.rst, "The kernels"): a CG matvec with 11 columns and a prediction with 1
        # would be two compiles of the same pass.
        unspecialized = args[len(roles):] + ["N", "M", "C"]
        lines = head + [
            f"@triton.jit(do_not_specialize={unspecialized!r})",
            f"def {self.name}({', '.join(args)}, N, M, C,",
            "        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, DT: tl.constexpr):",
            "    pid_n = tl.program_id(0)",
            "    b = tl.program_id(1).to(tl.int64)",
            "    pid_c = tl.program_id(2)",
            "    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)",
            "    rmask = rows < N",
            "    rows2 = rows[:, None]",
            "    rmask2 = rmask[:, None]",
            "    cs = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)",
        ]
        lines += ["    " + s for s in self.pro]
        lines += [
            "    for j0 in range(0, M, BLOCK_M):",
            "        cols = j0 + tl.arange(0, BLOCK_M)",
            "        cmask = cols < M",
            "        cols2 = cols[None, :]",
            "        cmask2 = cmask[None, :]",
            "        mask = rmask2 & cmask2",
        ]
        lines += ["        " + s for s in self.body]
        if red.sums:  # one column block of a product writes the sums (the others compute them too)
            lines.append("    smask = rmask & ((rows * 0 + pid_c) == 0)")
        lines += ["    " + s for s in tail]
        return "\n".join(lines) + "\n"

