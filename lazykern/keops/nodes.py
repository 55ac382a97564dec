r"""KeOps formula nodes of lazykern's own, in keopscore's style (one small class per node).

KeOps writes a formula as a *tree*: an expression used twice is written, and evaluated, twice. A
recursion such as the one that turns per-dimension kernel values into elementary symmetric
polynomials (each step reads the previous state twice) would double in size with every step. The
nodes here run such recursions as plain loops in the generated C++ code, so a formula stays small
whatever the number of dimensions and interaction orders, and costs O(D R) per pair. One more node,
``Expm1``, gives the orthogonalized kernels a difference of exponentials without cancellation.

:func:`register` makes the nodes known to keopscore (the namespace in which KeOps evaluates formula
strings) under the names the formulas write (``lazykern.formulas.interactions.KEOPS_ELEMENTARY_SYMMETRIC``
and ``KEOPS_EXPM1``: a formula names a node without importing KeOps); the registry is :data:`NODES`,
and :func:`lazykern.keops.keops_lazy_tensor` calls :func:`register` before making any
``LazyTensor``. The node names carry a version number: a change of the generated code must change
the name, because KeOps caches compiled formulas by their text (``Expm1`` is named after the C
function it calls, which does not change).
"""

from __future__ import annotations

import importlib
import threading

from ..formulas.interactions import KEOPS_ELEMENTARY_SYMMETRIC, KEOPS_EXPM1

from keopscore.formulas.Operation import Operation
from keopscore.formulas.VectorizedScalarOp import VectorizedScalarOp
from keopscore.utils.code_gen_utils import new_c_varname
from keopscore.utils.math_functions import math_function
from keopscore.utils.misc_utils import KeOps_Error

__all__ = ["ELEMENTARY_SYMMETRIC", "EXPM1", "NODES", "register"]

#: Name of ``ElementarySymmetric`` in KeOps formula strings (the one the formulas write).
ELEMENTARY_SYMMETRIC = KEOPS_ELEMENTARY_SYMMETRIC
_GRADIENT = "LazykernElemSymGrad1"
#: Name of ``Expm1`` in KeOps formula strings (the one the formulas write).
EXPM1 = KEOPS_EXPM1

_lock = threading.Lock()
_registered = False


def _forward_code(dtype: str, z: str, d: int, r_max: int, state: str, history: str | None) -> str:
    """C++ code of the normalized summation recurrence over ``d`` inputs ``z[0..d-1]``.

    After input ``j`` (1-based), ``state[r]`` holds :math:`e_r(z_1..z_j) / \binom{j}{r}`; ``history``
    (if given) receives the state *before* each input, ``(d, r_max + 1)`` row-major.
    """
    j, r, w = new_c_varname("j"), new_c_varname("r"), new_c_varname("w")
    save = (f"for (int {r} = 0; {r} <= {r_max}; {r}++) {history}[({j} - 1) * {r_max + 1} + {r}] = {state}[{r}];"
            if history else "")
    return f"""
        {state}[0] = ({dtype}) 1;
        for (int {r} = 1; {r} <= {r_max}; {r}++) {state}[{r}] = ({dtype}) 0;
        for (int {j} = 1; {j} <= {d}; {j}++) {{
            {save}
            const {dtype} {w} = ({dtype}) 1 / ({dtype}) {j};
            // descending r: state[r - 1] still holds the previous input's value when state[r] is updated
            for (int {r} = ({j} < {r_max} ? {j} : {r_max}); {r} >= 1; {r}--)
                {state}[{r}] = (({dtype}) ({j} - {r}) * {state}[{r}]
                                + ({dtype}) {r} * {z}[{j} - 1] * {state}[{r} - 1]) * {w};
        }}
    """


class ElementarySymmetric(Operation):
    r"""Normalized elementary symmetric polynomials of the entries of a vector.

    For :math:`z \in \mathbb R^D` and orders :math:`r = 1..R` (:math:`R \le D`), returns the
    R-vector :math:`\tilde e_r(z) = e_r(z) / \binom{D}{r}`, with
    :math:`e_r(z) = \sum_{|S| = r} \prod_{d \in S} z_d`, the mean over the :math:`\binom{D}{r}`
    subsets of size r of the product of their entries.

    Evaluated by the summation recurrence over inputs :math:`j = 1..D`,

    .. math::

        \tilde e^{(j)}_r = \Big(1 - \frac rj\Big) \tilde e^{(j-1)}_r + \frac rj\, z_j\, \tilde e^{(j-1)}_{r-1},
        \qquad \tilde e^{(0)} = (1, 0, \dots, 0),

    a convex combination for :math:`r \le j`: no cancellation, no overflow (see
    :func:`lazykern.formulas.interactions.elementary_symmetric` for the measured accuracy).
    """

    string_id = ELEMENTARY_SYMMETRIC

    def __init__(self, z, max_degree, params=()):
        if params:
            (max_degree,) = params
        if not 1 <= max_degree <= z.dim:
            KeOps_Error(f"{ELEMENTARY_SYMMETRIC}: max_degree must be in 1..{z.dim}, got {max_degree}")
        super().__init__(z, params=(max_degree,))
        self.max_degree = max_degree
        self.dim = max_degree

    def Op(self, out, table, z):
        state = new_c_varname("esym")
        r = new_c_varname("r")
        return f"""
            {out.dtype} {state}[{self.max_degree + 1}];
            {_forward_code(out.dtype, z.id, z.dim, self.max_degree, state, None)}
            for (int {r} = 0; {r} < {self.max_degree}; {r}++) {out.id}[{r}] = {state}[{r} + 1];
        """

    def DiffT(self, v, gradin):
        (z,) = self.children
        return z.DiffT(v, ElementarySymmetricGrad(z, gradin))


class ElementarySymmetricGrad(Operation):
    r"""Vector-Jacobian product of ``ElementarySymmetric``: given :math:`z \in \mathbb R^D` and
    :math:`g \in \mathbb R^R`, returns :math:`\big(\sum_r g_r\, \partial \tilde e_r / \partial z_d\big)_d`.

    Reverse mode through the recurrence: the forward states are kept (D x (R + 1) numbers per
    pair) and the adjoint runs backwards over the inputs,
    :math:`\bar z_j = \sum_r \bar e^{(j)}_r \frac rj \tilde e^{(j-1)}_{r-1}`,
    :math:`\bar e^{(j-1)}_r = (1 - \frac rj) \bar e^{(j)}_r + \frac{r+1}j z_j \bar e^{(j)}_{r+1}`.
    """

    string_id = _GRADIENT

    def __init__(self, z, g, params=()):
        if g.dim > z.dim:
            KeOps_Error(f"{_GRADIENT}: {g.dim} orders for {z.dim} inputs")
        super().__init__(z, g)
        self.dim = z.dim

    def Op(self, out, table, z, g):
        d, r_max, dtype = z.dim, g.dim, out.dtype
        state, history, adj = new_c_varname("esym"), new_c_varname("hist"), new_c_varname("adj")
        j, r, w, acc, zj, nxt = (new_c_varname(s) for s in ("j", "r", "w", "acc", "zj", "nxt"))
        return f"""
            {dtype} {state}[{r_max + 1}];
            {dtype} {history}[{d * (r_max + 1)}];
            {_forward_code(dtype, z.id, d, r_max, state, history)}
            {dtype} {adj}[{r_max + 2}];
            {adj}[0] = ({dtype}) 0;
            {adj}[{r_max + 1}] = ({dtype}) 0;
            for (int {r} = 1; {r} <= {r_max}; {r}++) {adj}[{r}] = {g.id}[{r} - 1];
            for (int {j} = {d}; {j} >= 1; {j}--) {{
                const {dtype} {w} = ({dtype}) 1 / ({dtype}) {j};
                const {dtype} {zj} = {z.id}[{j} - 1];
                const {dtype}* prev = {history} + ({j} - 1) * {r_max + 1};
                const int top = {j} < {r_max} ? {j} : {r_max};
                {dtype} {acc} = ({dtype}) 0;
                for (int {r} = 1; {r} <= top; {r}++) {acc} += {adj}[{r}] * ({dtype}) {r} * prev[{r} - 1];
                {out.id}[{j} - 1] = {acc} * {w};
                // ascending r: adj[r + 1] still holds the later state's adjoint when adj[r] is updated
                for (int {r} = 0; {r} <= top; {r}++) {{
                    const {dtype} {nxt} = ({r} + 1 <= top)
                        ? ({dtype}) ({r} + 1) * {zj} * {adj}[{r} + 1] * {w} : ({dtype}) 0;
                    {adj}[{r}] = ({r} >= 1 ? ({dtype}) ({j} - {r}) * {w} * {adj}[{r}] : {adj}[{r}]) + {nxt};
                }}
            }}
        """

    def DiffT(self, v, gradin):
        KeOps_Error(f"{_GRADIENT}: second derivatives of interaction kernels are not implemented")


class Expm1(VectorizedScalarOp):
    r""":math:`e^x - 1`, elementwise, accurate for small :math:`x` (where ``Exp(x) - 1`` keeps only
    the rounding error of :math:`e^x`); KeOps has no such node of its own."""

    string_id = EXPM1
    ScalarOpFun = math_function(cpu_code="expm1", gpu_half2_code="NA")

    @staticmethod
    def Derivative(f):
        from keopscore.formulas.maths.Exp import Exp

        return Exp(f)


#: lazykern's KeOps nodes by the names KeOps formula strings call them.
NODES = {ELEMENTARY_SYMMETRIC: ElementarySymmetric, _GRADIENT: ElementarySymmetricGrad, EXPM1: Expm1}


def register() -> None:
    """Make lazykern's nodes known to keopscore (idempotent, thread-safe)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        import keopscore.formulas

        # KeOps evaluates formula strings in the namespace of the module defining GetReduction and
        # checks their function names against keopscore.formulas.
        namespaces = (vars(keopscore.formulas), vars(importlib.import_module("keopscore.formulas.GetReduction")))
        for namespace in namespaces:
            namespace.update(NODES)
        _registered = True
