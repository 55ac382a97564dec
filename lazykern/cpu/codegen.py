r"""C source for one reduction over pairs, generated from an expression graph.

A :class:`Reduction` says what to compute for every *outer* row :math:`i` (one side of the pair)
as a loop over the *inner* points :math:`j` (the other side):

* ``sums``: :math:`\sum_j e(i, j)` for vector expressions :math:`e` (gradients, per-row parameter
  partials), written side by side into one ``(rows, total width)`` output;
* ``matmul``: :math:`\sum_j k(i, j)\, v_{jc}` for a runtime number of columns :math:`c`;
* ``store``: :math:`k(i, j)` itself, one dense row per :math:`i`.

The loop nest (what makes it fast on a CPU):

* OpenMP over rows (dynamic chunks: the machine may be shared), each row owned by one thread,
  so results do not depend on the thread count;
* the inner points in tiles of ``TILE`` (one L1-resident block), their inputs stored
  *dimension-major* (``(width, M)``), so every expression is computed for a whole tile at once in
  ``#pragma omp simd`` loops over :math:`j`: exponentials, logarithms and sines vectorize across
  pairs with glibc's vector math library whatever the feature width (the feature axis of
  :math:`d = 26` fits 8- or 16-wide vectors badly, the tile does not);
* expressions that depend on the row only (the row's inputs, parameters and what is computed from
  them) are computed once per row; expressions of the pair are fused into one loop per feature
  width and dependency level, sharing subexpressions (forward values reused by their derivatives);
* sums over :math:`j` accumulate lane by lane (``acc[q][t]``) and are added up once per row, in a
  fixed order: vectorized without reassociation flags (no ``-ffast-math``);
* subnormal numbers are flushed to zero (x86's FTZ/DAZ, AArch64's FZ) in each thread for the
  loop's duration and the thread's setting restored after: the exponentials of short-lengthscale
  terms and the products of the interaction recurrence pass through subnormals, which the CPU
  computes on a slow path (measured in ``docs/cpu_engine.rst``), and contribute below the
  smallest normal number (1e-38 in float32, 2e-308 in float64) to sums of order one.
  ``-ffast-math`` would flush them for the whole process (``crtfastmath.o``,
  :mod:`lazykern.native`). For the same reason ``exp`` of an argument below the normal range is
  0, its argument clamped before the call.

The flush-to-zero macros and the clamp of ``exp`` are C, in ``lazykern.h``: the header every
program of lazykern includes, generated or written by hand (:data:`lazykern.native.INCLUDE_FOLDER`).

Example:
    >>> from lazykern.compiler.plan import program
    >>> from lazykern.formulas import StationaryFormula
    >>> red = program(StationaryFormula("rbf"), "mm", 3, 3, (), "double")
    >>> "omp simd" in generate(red)
    True
"""

from __future__ import annotations

from typing import Any

from ..compiler.ops import OPS, lookup
from ..compiler.plan import Reduction, analyze, compact
from ..compiler.trace import Node

__all__ = ["Reduction", "compact", "generate", "TILES"]

#: Inner points per tile, by C type: the fastest tile measured (docs/cpu_engine.rst, "How it works").
TILES = {"float": 64, "double": 64}

#: C code of each elementwise operation of :mod:`lazykern.compiler.ops`: ``{0}``, ``{1}`` the
#: arguments, ``{f}`` the suffix of the math library's function for the type (``expf``, ``exp``),
#: ``{p}`` the constant exponent of ``pow``.
CODE = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "neg": "(-{0})",
    "exp": "LK_EXP_CLAMPED(exp{f}, T, {0}, lk_exp_min)",  # see lazykern.h
    "expm1": "expm1{f}({0})", "log": "log{f}({0})", "sin": "sin{f}({0})", "cos": "cos{f}({0})",
    "sqrt": "sqrt{f}({0})", "abs": "fabs{f}({0})", "rsqrt": "((T)1 / sqrt{f}({0}))",
    "pow": "pow{f}({0}, {p})",
    "sign": "({0} > (T)0 ? (T)1 : ({0} < (T)0 ? (T)(-1) : (T)0))", "step": "({0} < (T)0 ? (T)0 : (T)1)",
    "relu": "({0} > (T)0 ? {0} : (T)0)",
}
#: The suffix of the C math library's functions, by type.
_SUFFIX = {"float": "f", "double": ""}
#: Operations that are loops over the feature axis (see :mod:`lazykern.compiler.ops`), not elementwise.
RECURRENCES = tuple(name for name, op in OPS.items() if op.kind == "recurrence")


def generate(red: Reduction, name: str = "lk_reduce") -> str:
    """The C source of ``red`` as ``void <name>(void* const* ptr, const int64_t* bstride,
    int64_t batch, int64_t n, int64_t m, int64_t mp, int64_t c, int64_t threads)``: ``ptr`` holds
    the buffers in :meth:`Reduction.operands` order, ``bstride`` their batch strides (elements),
    ``n`` the outer rows, ``m`` the inner points (``mp``: padded length of dimension-major rows),
    ``c`` the column count of the vector arrays."""
    return _Writer(red, name).source()


class _Writer:
    def __init__(self, red: Reduction, name: str) -> None:
        self.red, self.name = red, name
        self.nodes = red.nodes
        self.tile = TILES[red.dtype]
        self.suffix = _SUFFIX[red.dtype]
        self.layout = analyze(red)
        self.role, self.needed, self.row = self.layout.role, self.layout.needed, self.layout.row
        self.roles = red.operands()
        self.ptr_of = {role: k for k, role in enumerate(self.roles)}  # buffer role -> index in ptr
        # Per-thread lanes (elements) of the sums and of the matmul's columns.
        self.acc_size = f"{red.sums_width} * TILE" if red.sums_width else "0"
        self.mm_size = "c * TILE" if red.matmul else "0"
        # Per-thread scratch (elements, in units of TILE lanes) of the pair recurrences that keep states.
        self.scratch: dict[int, str] = {}
        total = 0
        for z in self.needed:
            if self.nodes[z].op == "esym_vjp" and not self.row[z]:
                self.scratch[z] = f"{total} * TILE"
                total += _scratch_rows(self.nodes, z)
        self.scratch_size = f"{total} * TILE" if total else "0"
        self.consumers: dict[int, list[int]] = {}
        for z in self.needed:
            for a in self.nodes[z].args:
                self.consumers.setdefault(a, []).append(z)

    # ------------------------------------------------------------------ analysis
    def _materialized(self) -> set[int]:
        """Pair nodes kept in tile arrays: sums, concatenations, width-1 values that broadcast into
        wider ones, and the value a matmul or dense store reads."""
        mat = set()
        for z in self.needed:
            if self.row[z]:
                continue
            node = self.nodes[z]
            if node.op in ("sum", "concat") and z in self.consumers:
                mat.add(z)
            elif node.op != "in" and node.width == 1 and any(self.nodes[u].width > 1 for u in self.consumers.get(z, ())):
                mat.add(z)  # (a pair weight is a tile array already)
        for root in ([self.red.matmul[0]] if self.red.matmul else []) + ([self.red.store] if self.red.store is not None else []):
            mat.add(root)
        for z in self.needed:  # a recurrence reads its operands at runtime indices: from tile arrays
            if self.nodes[z].op in RECURRENCES and not self.row[z]:
                mat.add(z)
                mat.update(a for a in self.nodes[z].args if not self.row[a] and self.nodes[a].op != "in")
        return mat

    # ------------------------------------------------------------------ source
    def source(self) -> str:
        mat = self._materialized()
        lines = self._preamble() + self._tile_macro(self._tile(mat)) + self._function()
        return "\n".join(lines) + "\n"

    def _preamble(self) -> list[str]:
        """Headers (``lazykern.h``: flush-to-zero and the clamp of ``exp``), the element type and the
        tile length."""
        return [
            "/* Generated by lazykern.cpu.codegen: one pairwise reduction (see its module docstring). */",
            "#include <float.h>",
            "#include <stdlib.h>",
            "#include <string.h>",
            '#include "lazykern.h"',
            f"typedef {self.red.dtype} T;",
            f"#define TILE {self.tile}",
        ]

    @staticmethod
    def _tile_macro(body: list[str]) -> list[str]:
        """The tile body as the macro ``LK_TILE(j0, tn)``, expanded twice: full tiles with a constant
        trip count (no loop epilogues), then the last, partial tile."""
        width = max(len(line) for line in body) + 2
        return ["#define LK_TILE(j0, tn) do { \\"] + ["  " + line.ljust(width) + "\\" for line in body] + ["} while (0)"]

    def _tile(self, mat: set[int]) -> list[str]:
        """The statements of one tile of ``tn`` inner points from ``j0``: the tile's inputs and pair
        weights, its tile arrays, the fused loops, and the matmul's and dense store's use of them."""
        red, ptr_of = self.red, self.ptr_of
        body: list[str] = []
        t = body.append
        for k, nm in enumerate(red.inner):
            q = ptr_of["inner:" + nm]
            t(f"const T* const __restrict__ in{k} = B{q} + b * bstride[{q}] + (j0);")
        for a in range(red.inner_vecs):
            q = ptr_of[f"ivec:{a}"]
            t(f"const T* const __restrict__ iv{a} = B{q} + b * bstride[{q}] + (j0);")
        read = {self.nodes[z].attr for z in self.needed if self.nodes[z].op == "in"}
        for k, wt in enumerate(red.weights):
            if wt[0] not in read:
                continue
            if wt[1] == "dot":
                _, _, oa, ib = wt
                t(f"T w{k}[TILE] __attribute__((aligned(64)));")
                t("_Pragma(\"omp simd\")")
                t(f"for (int64_t t = 0; t < (tn); ++t) w{k}[t] = 0;")
                t("for (int64_t q = 0; q < c; ++q) {")
                t(f"  const T a = ov{oa}[q];")
                t("  _Pragma(\"omp simd\")")
                t(f"  for (int64_t t = 0; t < (tn); ++t) w{k}[t] += a * iv{ib}[q * mp + t];")
                t("}")
            else:
                t(f"const T* const __restrict__ w{k} = pr{k} + (j0);")
        for z in sorted(mat):
            t(f"T m{z}[{self.nodes[z].width} * TILE] __attribute__((aligned(64)));")
        for (_level, width), group in sorted(self._entries(mat).items()):
            body.extend(self._group(width, group, mat))
        if red.matmul:
            t("for (int64_t q = 0; q < c; ++q) {")
            t("  _Pragma(\"omp simd\")")
            t(f"  for (int64_t t = 0; t < (tn); ++t) accm[q * TILE + t] += m{red.matmul[0]}[t] * iv{red.matmul[1]}[q * mp + t];")
            t("}")
        if red.store is not None:
            # Entries below the normal range are stored as zeros here, in the same pass: they make
            # CPU LAPACK about 10x slower on the dense matrix (see lazykern.backend.pairwise_dense).
            tiny = "FLT_MIN" if red.dtype == "float" else "DBL_MIN"
            t("_Pragma(\"omp simd\")")
            entry = f"m{red.store}[t]"
            t(f"for (int64_t t = 0; t < (tn); ++t) dense[(j0) + t] = {self._apply('abs', [entry])} < {tiny} ? (T)0 : {entry};")
        return body

    def _function(self) -> list[str]:
        """The exported function: its buffers, then each thread's flush-to-zero, lane accumulators
        and scratch around the loop over rows."""
        lines = [
            f"void {self.name}(void* const* ptr, const int64_t* bstride, int64_t batch, int64_t n,",
            "               int64_t m, int64_t mp, int64_t c, int64_t threads) {",
        ]
        w = lines.append
        for k, r in enumerate(self.roles):
            const = "" if r.startswith("out:") else "const "
            w(f"  {const}T* const __restrict__ B{k} = ({const}T*)ptr[{k}];  /* {r} */")
        w("  const int64_t rows = batch * n;")
        w(f"  const T lk_exp_min = lk_exp_min_{self.red.dtype};")
        w("  #pragma omp parallel num_threads(threads)")
        w("  {")
        w("    LK_FTZ_ON")
        alloc = f"{self.acc_size} + {self.mm_size} + {self.scratch_size} + TILE"
        w(f"    T* const __restrict__ acc = (T*)aligned_alloc(64, sizeof(T) * ({alloc}));")
        if self.red.matmul:
            w(f"    T* const __restrict__ accm = acc + {self.acc_size};")
        if self.scratch:
            w(f"    T* const __restrict__ scr = acc + {self.acc_size} + {self.mm_size};")
        lines.extend("    " + s for s in self._row_loop())
        w("    free(acc);")
        w("    LK_FTZ_OFF")
        w("  }")
        w("}")
        return lines

    def _row_loop(self) -> list[str]:
        """The loop over (batch, row) pairs: the row's pointers, its prologue (everything that depends
        on the row only, once per row), the tiles, and the epilogue."""
        red, ptr_of = self.red, self.ptr_of
        lines = ["#pragma omp for schedule(dynamic, 4)", "for (int64_t r = 0; r < rows; ++r) {"]
        w = lines.append
        w("  const int64_t b = r / n, i = r - b * n;")
        for k, nm in enumerate(red.outer):
            q = ptr_of["outer:" + nm]
            w(f"  const T* const __restrict__ o{k} = B{q} + b * bstride[{q}] + i * {self.layout.leaf_width(nm)};")
        for k, nm in enumerate(red.params):
            q = ptr_of["param:" + nm]
            w(f"  const T* const __restrict__ p{k} = B{q} + b * bstride[{q}];")
        for a in range(red.outer_vecs):
            q = ptr_of[f"ovec:{a}"]
            w(f"  const T* const __restrict__ ov{a} = B{q} + b * bstride[{q}] + i * c;")
        for k, wt in enumerate(red.weights):
            if wt[1] == "pair":
                q = ptr_of[f"pair:{wt[0]}"]
                w(f"  const T* const __restrict__ pr{k} = B{q} + b * bstride[{q}] + i * m;")
        if red.store is not None:
            q = ptr_of["out:store"]
            w(f"  T* const __restrict__ dense = B{q} + b * bstride[{q}] + i * m;")
        w(f"  memset(acc, 0, sizeof(T) * ({self.acc_size} + {self.mm_size}));")
        for z in self.needed:
            if self.row[z] and self.nodes[z].op not in ("in", "const"):
                lines.extend("  " + s for s in self._row_node(z))
        w("  int64_t j0 = 0;")
        w("  for (; j0 + TILE <= m; j0 += TILE) LK_TILE(j0, TILE);")
        w("  if (j0 < m) LK_TILE(j0, m - j0);")
        lines.extend("  " + s for s in self._epilogue())
        w("}")
        return lines

    def _epilogue(self) -> list[str]:
        """The row's outputs: each sum's lanes added up in a fixed order."""
        red, ptr_of = self.red, self.ptr_of
        lines: list[str] = []
        w = lines.append
        sw = red.sums_width
        if sw:
            q = ptr_of["out:sums"]
            w(f"T* const __restrict__ os = B{q} + b * bstride[{q}] + i * {sw};")
            w(f"for (int64_t q = 0; q < {sw}; ++q) {{")
            w("  T s = 0;")
            w("  for (int64_t t = 0; t < TILE; ++t) s += acc[q * TILE + t];")
            w("  os[q] = s;")
            w("}")
        if red.matmul:
            q = ptr_of["out:matmul"]
            w(f"T* const __restrict__ om = B{q} + b * bstride[{q}] + i * c;")
            w("for (int64_t q = 0; q < c; ++q) {")
            w("  T s = 0;")
            w("  for (int64_t t = 0; t < TILE; ++t) s += accm[q * TILE + t];")
            w("  om[q] = s;")
            w("}")
        return lines

    # ------------------------------------------------------------------ row nodes
    def _row_ref(self, z: int, idx: str) -> str:
        node = self.nodes[z]
        if node.width == 1:
            idx = "0"
        if node.op == "const":
            return self._const(node.attr)
        if node.op == "in":
            kind, k = self.role[node.attr]
            return f"{'o' if kind == 'outer' else 'p'}{k}[{idx}]"
        return f"r{z}[{idx}]"

    def _row_node(self, z: int) -> list[str]:
        node = self.nodes[z]
        out = [f"T r{z}[{node.width}];"]
        if node.op == "sum":
            a = node.args[0]
            out.append(f"r{z}[0] = 0; for (int64_t k = 0; k < {self.nodes[a].width}; ++k) r{z}[0] += {self._row_ref(a, 'k')};")
        elif node.op == "concat":
            offset = 0
            for a in node.args:
                wa = self.nodes[a].width
                out.append(f"for (int64_t k = 0; k < {wa}; ++k) r{z}[{offset} + k] = {self._row_ref(a, 'k')};")
                offset += wa
        elif node.op == "slice":
            out.append(f"for (int64_t k = 0; k < {node.width}; ++k) r{z}[k] = {self._row_ref(node.args[0], f'k + {node.attr}')};")
        elif node.op == "expand":
            out.append(f"for (int64_t k = 0; k < {node.width}; ++k) r{z}[k] = {self._row_ref(node.args[0], '0')};")
        elif node.op == "esym":  # (an esym_vjp reads the pair weight: never a row value)
            out.extend(_recurrence_code(self.nodes, z, self._row_ref, f"r{z}", "1", "1", None))
        else:
            args = [self._row_ref(a, "k") for a in node.args]
            out.append(f"for (int64_t k = 0; k < {node.width}; ++k) r{z}[k] = {self._apply(node.op, args, node.attr)};")
        return out

    # ------------------------------------------------------------------ pair nodes
    def _entries(self, mat: set[int]) -> dict[tuple[int, int], list[tuple]]:
        """Work items of a tile, grouped into fused loops by (dependency level, feature width)."""
        level: dict[int, int] = {}

        def deps(z: int, own: int | None) -> int:
            """1 + the highest level among materialized nodes that computing ``z`` inline reads."""
            best, stack, seen = 0, [z], set()
            while stack:
                a = stack.pop()
                if a in seen or self.row[a]:
                    continue
                seen.add(a)
                if a in mat and a != own:
                    best = max(best, level[a] + 1)
                    continue
                stack.extend(self.nodes[a].args)
            return best

        items: list[tuple[int, int, tuple]] = []
        for z in sorted(mat):
            node = self.nodes[z]
            if node.op == "sum":
                lv = deps(node.args[0], None)
                items.append((lv, self.nodes[node.args[0]].width, ("sum", z)))
            elif node.op == "concat":
                lv, offset, parts = 0, 0, []
                for a in node.args:
                    lv = max(lv, deps(a, None))
                    parts.append((a, offset))
                    offset += self.nodes[a].width
                for a, off in parts:
                    items.append((lv, self.nodes[a].width, ("part", z, a, off)))
            elif node.op in RECURRENCES:
                lv = max(deps(a, None) for a in node.args)
                items.append((lv, node.width, ("recurrence", z)))
            else:
                lv = deps(z, z)
                items.append((lv, node.width, ("mat", z)))
            level[z] = lv
        offset = 0
        for z in self.red.sums:
            for a, off, fold in self._split(z, offset, mat):
                if not (self.nodes[a].op == "const" and self.nodes[a].attr == 0.0):
                    items.append((deps(a, None), self.nodes[a].width, ("out", a, off, fold)))
            offset += self.nodes[z].width
        # Outputs feed nothing, so they can run as late as wanted: each goes to the last loop of its
        # width, where it shares the subexpressions (exponentials) of everything computed there.
        last: dict[int, int] = {}
        for lv, width, _ in items:
            last[width] = max(last.get(width, 0), lv)
        groups: dict[tuple[int, int], list[tuple]] = {}
        for lv, width, item in items:
            groups.setdefault((last[width] if item[0] == "out" else lv, width), []).append(item)
        return groups

    def _split(self, z: int, offset: int, mat: set[int]) -> list[tuple[int, int, bool]]:
        """An output as ``(node, offset, fold)`` pieces accumulated straight into the row's lanes:
        concatenations part by part, and a sum over the feature axis (``fold``) inside the loop over
        its operand's width, so neither is stored in a tile array first."""
        node = self.nodes[z]
        if z not in mat and node.op == "concat":
            pieces, off = [], offset
            for a in node.args:
                pieces.extend(self._split(a, off, mat))
                off += self.nodes[a].width
            return pieces
        if z not in mat and node.op == "sum":
            return [(node.args[0], offset, True)]
        return [(z, offset, False)]

    def _group(self, width: int, group: list[tuple], mat: set[int]) -> list[str]:
        body: list[str] = []
        memo: dict[tuple[int, str], str] = {}
        k = "k" if width > 1 else "0"
        # Recurrences are loops of their own; nothing else of their level reads them.
        pre: list[str] = []
        for item in group:
            if item[0] == "recurrence":
                pre.extend(self._recurrence(item[1], mat))
        group = [item for item in group if item[0] != "recurrence"]
        if not group:
            return pre
        for item in group:
            if item[0] == "sum":
                pre.append('_Pragma("omp simd")')
                pre.append(f"for (int64_t t = 0; t < (tn); ++t) m{item[1]}[t] = 0;")
        for item in group:
            kind = item[0]
            if kind == "sum":
                z = item[1]
                body.append(f"m{z}[t] += {self._pair(self.nodes[z].args[0], k, mat, memo, body)};")
            elif kind == "mat":
                z = item[1]
                value = self._pair(z, k, mat, memo, body, own=z)
                body.append(f"m{z}[({k}) * TILE + t] = {value};")
            elif kind == "part":
                _, z, a, off = item
                body.append(f"m{z}[({off} + {k}) * TILE + t] = {self._pair(a, k, mat, memo, body)};")
            else:
                _, a, off, fold = item
                lane = f"{off} * TILE + t" if fold else f"({off} + {k}) * TILE + t"
                body.append(f"acc[{lane}] += {self._pair(a, k, mat, memo, body)};")
        inner = ['_Pragma("omp simd")', "for (int64_t t = 0; t < (tn); ++t) {"] + ["  " + s for s in body] + ["}"]
        if width == 1:
            return pre + inner
        return pre + [f"for (int64_t k = 0; k < {width}; ++k) {{"] + ["  " + s for s in inner] + ["}"]

    def _pair(self, z: int, idx: str, mat: set[int], memo: dict, body: list[str], own: int | None = None) -> str:
        """A C expression for node ``z`` at feature index ``idx`` and tile lane ``t``; statements it
        needs are appended to ``body`` once (common subexpressions are shared through ``memo``)."""
        node = self.nodes[z]
        if node.width == 1:
            idx = "0"
        if self.row[z]:
            return self._row_ref(z, idx)
        if z in mat and z != own:
            return f"m{z}[t]" if node.width == 1 else f"m{z}[({idx}) * TILE + t]"
        key = (z, idx)
        if key in memo:
            return memo[key]
        if node.op == "in":
            kind, k = self.role[node.attr]
            expr = f"in{k}[({idx}) * mp + t]" if kind == "inner" else f"w{k}[t]"
            memo[key] = expr
            return expr
        if node.op == "slice":
            return self._pair(node.args[0], f"{idx} + {node.attr}", mat, memo, body)
        if node.op == "expand":
            return self._pair(node.args[0], "0", mat, memo, body)
        if node.op in ("sum", "concat"):
            raise AssertionError(f"{node.op} node {z} must be materialized")
        args = [self._pair(a, idx, mat, memo, body) for a in node.args]
        var = f"v{len(memo)}"
        body.append(f"const T {var} = {self._apply(node.op, args, node.attr)};")
        memo[key] = var
        return var

    def _recurrence(self, z: int, mat: set[int]) -> list[str]:
        """The loops of a recurrence node over a tile: operands and result in tile arrays."""

        def operand(a: int, idx: str) -> str:
            scratch: list[str] = []
            expr = self._pair(a, idx, mat, {}, scratch)
            assert not scratch, "operands of a recurrence are tile arrays, row values or leaves"
            return expr

        scratch = f"scr + {self.scratch[z]}" if z in self.scratch else None
        return _recurrence_code(self.nodes, z, operand, f"m{z}", "TILE", "(tn)", scratch)

    # ------------------------------------------------------------------ scalar code
    def _const(self, value: float) -> str:
        return f"(T)({value!r})"

    def _apply(self, op: str, args: list[str], attr: Any = None) -> str:
        """The C expression of elementwise ``op`` (its ``attr``: the exponent of ``pow``) on ``args``."""
        code = lookup(CODE, op, "lazykern.cpu.codegen.CODE")
        return code.format(*args, f=self.suffix, p=self._const(attr) if op == "pow" else None)


def _scratch_rows(nodes: tuple[Node, ...], z: int) -> int:
    """Rows of scratch an ``esym_vjp`` node keeps: R for the state (then the adjoint) and, for each
    input j, the states of orders 1..min(j - 1, R) before it (order 0 is 1, higher ones still 0)."""
    r_max, d = nodes[z].attr, nodes[nodes[z].args[0]].width
    return r_max + sum(min(j - 1, r_max) for j in range(1, d + 1))


def _recurrence_code(nodes, z, operand, out: str, stride: str, lanes: str, scratch: str | None) -> list[str]:
    """C statements of recurrence node ``z`` for ``lanes`` lanes at once: ``operand(a, idx)`` is the
    C expression of argument node ``a`` at feature index ``idx`` (a C expression) and lane ``t``;
    row ``k`` of the result is ``out + k * stride``; ``scratch`` points to
    :func:`_scratch_rows` rows of ``stride``.

    ``esym`` is the summation recurrence of
    :func:`lazykern.formulas.interactions.elementary_symmetric_reference` (after input j, state r
    holds e_r(z_1..z_j) / binom(j, r)) in the order of operations of KeOps' node
    (:mod:`lazykern.keops.nodes`), computed in the result rows; ``esym_vjp`` is its reverse
    mode (forward states kept, then the adjoint runs backwards over the inputs). Both are tested
    against the specification in ``tests/test_elementary_symmetric.py``."""
    node = nodes[z]
    r_max, zarg = node.attr, node.args[0]
    d = nodes[zarg].width
    simd = ['_Pragma("omp simd")', f"for (int64_t t = 0; t < {lanes}; ++t)"]
    zj = operand(zarg, "ej - 1")
    lines = [f"{{ /* {node.op} node {z}: {r_max} orders of {d} inputs */"]
    if node.op == "esym":
        lines += [f"for (int64_t eq = 0; eq < {r_max} * {stride}; ++eq) {out}[eq] = 0;"]
        lines += [f"for (int64_t ej = 1; ej <= {d}; ++ej) {{"]
        lines += ["  " + x for x in _esym_step(out, zj, r_max, stride, simd)] + ["}"]
        return lines + ["}"]
    adjoint = operand(node.args[1], "eq")
    assert scratch is not None  # an esym_vjp keeps its states in scratch (never a row value)
    return lines + _esym_vjp_code(zj, adjoint, r_max, d, out, stride, simd, scratch) + ["}"]


def _esym_step(state: str, zj: str, r_max: int, stride: str, simd: list[str]) -> list[str]:
    """The recurrence's step for input ``ej`` (``zj`` its value), on the states ``state``."""
    return [
        "const T ew = (T)1 / (T)ej;",
        f"for (int64_t er = ej < {r_max} ? ej : {r_max}; er >= 1; --er) {{",
        "  const T ea = (T)(ej - er), eb = (T)er;",
        f"  T* const es = {state} + (er - 1) * {stride};",
        "  if (er == 1) {",
        *("    " + x for x in simd),
        f"      es[t] = (ea * es[t] + eb * {zj}) * ew;",
        "  } else {",
        f"    const T* const ep = es - {stride};",
        *("    " + x for x in simd),
        f"      es[t] = (ea * es[t] + eb * {zj} * ep[t]) * ew;",
        "  }",
        "}",
    ]


def _esym_vjp_code(zj: str, adjoint: str, r_max: int, d: int, out: str, stride: str, simd: list[str],
                   scratch: str) -> list[str]:
    """The reverse mode of :func:`_esym_step` over ``d`` inputs: the forward states kept in
    ``scratch``, then the adjoint (``adjoint`` at order ``eq``) run backwards into ``out``."""
    return [
        f"T* const eA = {scratch};",
        f"T* const eH = eA + {r_max} * {stride};",
        f"for (int64_t eq = 0; eq < {r_max} * {stride}; ++eq) eA[eq] = 0;",
        "int64_t eo = 0;",
        f"for (int64_t ej = 1; ej <= {d}; ++ej) {{",
        f"  const int64_t ek = ej - 1 < {r_max} ? ej - 1 : {r_max};",
        f"  memcpy(eH + eo * {stride}, eA, sizeof(T) * ek * {stride});",
        "  eo += ek;",
        *("  " + x for x in _esym_step("eA", zj, r_max, stride, simd)),
        "}",
        f"for (int64_t eq = 0; eq < {r_max}; ++eq) {{",
        *("  " + x for x in simd),
        f"    eA[eq * {stride} + t] = {adjoint};",
        "}",
        f"for (int64_t ej = {d}; ej >= 1; --ej) {{",
        f"  const int64_t etop = ej < {r_max} ? ej : {r_max}, ek = ej - 1 < {r_max} ? ej - 1 : {r_max};",
        "  eo -= ek;",
        f"  const T* const eh = eH + eo * {stride};",
        "  const T ew = (T)1 / (T)ej;",
        f"  T* const ey = {out} + (ej - 1) * {stride};",
        *("  " + x for x in simd),
        "    ey[t] = eA[t];",
        "  for (int64_t er = 2; er <= etop; ++er) {",
        "    const T eb = (T)er;",
        f"    const T* const ead = eA + (er - 1) * {stride};",
        f"    const T* const ep = eh + (er - 2) * {stride};",
        *("    " + x for x in simd),
        "      ey[t] += ead[t] * eb * ep[t];",
        "  }",
        *("  " + x for x in simd),
        "    ey[t] *= ew;",
        "  /* ascending: the adjoint of order er + 1 is still the later state's when order er reads it */",
        "  for (int64_t er = 1; er <= etop; ++er) {",
        f"    T* const ead = eA + (er - 1) * {stride};",
        "    const T ea = (T)(ej - er) * ew;",
        "    if (er < etop) {",
        "      const T eb = (T)(er + 1);",
        f"      const T* const en = ead + {stride};",
        *("      " + x for x in simd),
        f"        ead[t] = ea * ead[t] + eb * {zj} * en[t] * ew;",
        "    } else {",
        *("      " + x for x in simd),
        "        ead[t] = ea * ead[t];",
        "    }",
        "  }",
        "}",
    ]
