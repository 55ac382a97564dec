"""lazykern's CPU engine (lazykern.cpu) against dense references from the math, float64.

Compile budget: each (formula structure, pass, dtype) is one small C library (about a second to
compile). The tests share D = 3, float64, one parameter layout per family, and runtime sizes
(N, M, C and the batch are never compiled in), so the whole file compiles about 50 libraries and
no new KeOps formula (the KeOps comparison reuses the formula test_kernels.py compiles).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from lazykern import backend, cpu, native, settings
from lazykern.cpu import reductions as cpu_reductions
from lazykern.formulas import GroupFormula, InteractionFormula, StationaryFormula
from lazykern.formulas.interactions import (
    elementary_symmetric,
    orthogonal_rbf_features,
    orthogonal_rbf_l2_features,
)
from lazykern.formulas.ntk import dot

from . import reference
from . import reference_interactions as ref_int
from .memory import peak_rss_increase_mb

D = 3
N, M = 23, 17
DT = torch.float64
CASES = {
    "rbf-additive": ("rbf", True, None),
    "rbf-full": ("rbf", False, None),
    "matern0.5-full": ("matern", False, 0.5),
    "matern1.5-additive": ("matern", True, 1.5),
    "matern2.5-full": ("matern", False, 2.5),
    "rq-additive": ("rq", True, None),
    "rq-full": ("rq", False, None),
    "periodic-additive": ("periodic", True, None),
    "periodic-full": ("periodic", False, None),
}


def hyperparameters(dtype=DT) -> dict[str, torch.Tensor]:
    """GPyTorch-shaped hyperparameters, distinct per dimension so that mix-ups show."""
    return {
        "lengthscale": torch.linspace(0.6, 1.7, D, dtype=dtype).reshape(1, D).requires_grad_(),
        "scales": torch.linspace(0.5, 2.0, D, dtype=dtype).reshape(1, D).requires_grad_(),
        "alpha": torch.tensor([1.3], dtype=dtype).requires_grad_(),
        "period": torch.linspace(1.1, 2.3, D, dtype=dtype).reshape(1, D).requires_grad_(),
    }


def formula_args(case: str, x1, x2, hp):
    """Inputs and tensor parameters in the convention of lazykern.formulas.stationary: inputs divided
    by the lengthscale (periodic: multiplied by pi / period, weights 2 / lengthscale)."""
    family, additive, nu = CASES[case]
    formula = StationaryFormula(family, additive, nu)
    params = {}
    if family == "periodic":
        scale = hp["period"] / math.pi
        params["weights"] = 2.0 / hp["lengthscale"]
    else:
        scale = hp["lengthscale"]
    if family == "rq":
        params["alpha"] = hp["alpha"].unsqueeze(-1)
    if additive:
        params["scales"] = hp["scales"]
    return formula, x1 / scale, x2 / scale, params


def reference_kernel(case: str, x1, x2, hp):
    family, additive, nu = CASES[case]
    return reference.kernel(
        family,
        x1,
        x2,
        hp["lengthscale"],
        additive=additive,
        scales=hp["scales"] if additive else None,
        nu=nu,
        alpha=hp["alpha"],
        period=hp["period"],
    )


def used(case: str, hp) -> list[torch.Tensor]:
    family, additive, _ = CASES[case]
    names = ["lengthscale"] + (["scales"] if additive else []) + (["alpha"] if family == "rq" else [])
    return [hp[n] for n in names + (["period"] if family == "periodic" else [])]


def grads(out, weights, tensors):
    return torch.autograd.grad((out * weights).sum(), tensors)


def assert_close(actual, expected, rtol=1e-10):
    scale = expected.abs().max().clamp_min(1e-300)
    err = ((actual - expected).abs().max() / scale).item()
    assert err <= rtol, f"relative error {err:.3e} > {rtol}"


def inputs(*batch, n=N, m=M, dtype=DT):
    x1 = torch.randn(*batch, n, D, dtype=dtype, requires_grad=True)
    x2 = torch.randn(*batch, m, D, dtype=dtype, requires_grad=True)
    return x1, x2


# ---------------------------------------------------------------------------- every family
@pytest.mark.parametrize("case", CASES)
def test_matmul_values_and_gradients(case):
    hp = hyperparameters()
    x1, x2 = inputs()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(N, 2, dtype=DT)
    tensors = [x1, x2, rhs, *used(case, hp)]
    formula, a, b, params = formula_args(case, x1, x2, hp)
    out = cpu.ENGINE.matmul(formula, a, b, params, rhs)
    expected = reference_kernel(case, x1, x2, hp) @ rhs
    assert_close(out, expected)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)


@pytest.mark.parametrize("case", CASES)
def test_symmetric_gradients_in_one_pass(case, monkeypatch):
    """The gradient of sum_ij <l_i, r_j> k(x_i, x_j) with respect to x (both sides) and every
    hyperparameter, chained back to the raw hyperparameters through the input transform."""
    hp = hyperparameters()
    x = torch.randn(N, D, dtype=DT, requires_grad=True)
    left, right = torch.randn(N, 2, dtype=DT), torch.randn(N, 2, dtype=DT)
    tensors = [x, *used(case, hp)]
    formula, a, _, params = formula_args(case, x, x, hp)
    calls = []
    load = cpu_reductions.load
    monkeypatch.setattr(cpu_reductions, "load", lambda red: calls.append(red) or load(red))
    gx, _, gp = cpu.ENGINE.symmetric_gradients(formula, a, a, params, left, right)
    assert len(calls) == 1  # one pass for x and every parameter
    outputs = [a] + list(params.values())
    actual = torch.autograd.grad(outputs, tensors, [gx] + [gp[n] for n in params])
    # From the math, pair by pair: k(x_i, x_i) is 1 (full) or sum_d s_d (additive), and the pairs
    # i != j are evaluated elementwise (the Matern reference's sqrt has no derivative at 0).
    family, additive, nu = CASES[case]
    W = left @ right.T
    i, j = torch.triu_indices(N, N, 1)
    i, j = torch.cat([i, j]), torch.cat([j, i])
    k_ij = reference.kernel(
        family, x[i], x[j], hp["lengthscale"], additive=additive, scales=hp["scales"] if additive else None,
        nu=nu, alpha=hp["alpha"], period=hp["period"], diag=True,
    )
    S = (W[i, j] * k_ij).sum() + W.trace() * (hp["scales"].sum() if additive else 1.0)
    for g, e in zip(actual, torch.autograd.grad(S, tensors)):
        assert_close(g, e)


@pytest.mark.parametrize("case", ["rbf-additive", "matern2.5-full", "rq-additive", "periodic-full"])
def test_dense_values_and_gradients(case):
    hp = hyperparameters()
    x1, x2 = inputs()
    weights = torch.randn(N, M, dtype=DT)
    tensors = [x1, x2, *used(case, hp)]
    formula, a, b, params = formula_args(case, x1, x2, hp)
    K = cpu.ENGINE.dense(formula, a, b, params)
    expected = reference_kernel(case, x1, x2, hp)
    assert K.shape == (N, M)
    assert_close(K, expected)
    for g, e in zip(grads(K, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)


def test_gradcheck_matmul_and_dense():
    """torch's finite-difference check, on the RQ additive formula (a width-1 parameter broadcast
    over the feature axis and a width-D one)."""
    formula = StationaryFormula("rq", additive=True)
    x1 = torch.randn(5, D, dtype=DT, requires_grad=True)
    x2 = torch.randn(4, D, dtype=DT, requires_grad=True)
    rhs = torch.randn(4, 2, dtype=DT, requires_grad=True)
    alpha = torch.tensor([[0.8]], dtype=DT, requires_grad=True)
    scales = torch.rand(1, D, dtype=DT).add(0.5).requires_grad_()
    mm = lambda a, b, v, al, s: cpu.ENGINE.matmul(formula, a, b, {"alpha": al, "scales": s}, v)  # noqa: E731
    assert torch.autograd.gradcheck(mm, (x1, x2, rhs, alpha, scales))
    dn = lambda a, b, al, s: cpu.ENGINE.dense(formula, a, b, {"alpha": al, "scales": s})  # noqa: E731
    assert torch.autograd.gradcheck(dn, (x1, x2, alpha, scales))


# ---------------------------------------------------------------------------- layouts
def test_batch_broadcast_against_reference():
    """Batched x1 and parameters, shared x2 and right-hand side (broadcast, never copied per batch)."""
    hp = hyperparameters()
    hp["lengthscale"] = torch.stack([torch.linspace(0.6, 1.7, D), torch.linspace(1.2, 0.4, D)]).to(DT)
    hp["lengthscale"] = hp["lengthscale"].reshape(2, 1, D).requires_grad_()
    hp["scales"] = torch.rand(2, 1, D, dtype=DT).add(0.5).requires_grad_()
    x1 = torch.randn(2, N, D, dtype=DT, requires_grad=True)
    x2 = torch.randn(M, D, dtype=DT, requires_grad=True)
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(2, N, 2, dtype=DT)
    tensors = [x1, x2, rhs, hp["lengthscale"], hp["scales"]]
    formula, a, b, params = formula_args("rbf-additive", x1, x2, hp)
    out = cpu.ENGINE.matmul(formula, a, b, params, rhs)
    expected = reference_kernel("rbf-additive", x1, x2.expand(2, M, D), hp) @ rhs
    assert out.shape == (2, N, 2)
    assert_close(out, expected)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)
    K = cpu.ENGINE.dense(formula, a, b, params)
    assert_close(K, reference_kernel("rbf-additive", x1, x2.expand(2, M, D), hp))


def test_non_contiguous_inputs_and_vector_rhs():
    formula = StationaryFormula("rbf", additive=True)
    big = torch.randn(D + 2, 2 * N, dtype=DT)
    x1 = big[1 : D + 1, ::2].T  # strided, transposed
    x2 = torch.randn(M, 2 * D, dtype=DT)[:, ::2]
    scales = torch.rand(D, 2, dtype=DT)[:, 0].reshape(1, D)
    v = torch.randn(2 * M, dtype=DT)[::2]
    assert not (x1.is_contiguous() or x2.is_contiguous() or scales.is_contiguous() or v.is_contiguous())
    out = cpu.ENGINE.matmul(formula, x1, x2, {"scales": scales}, v)
    expected = reference.kernel("rbf", x1, x2, torch.ones(1, D, dtype=DT), additive=True, scales=scales) @ v
    assert out.shape == (N,)
    assert_close(out, expected)


def test_float32_close_to_float64():
    formula = StationaryFormula("rbf", additive=True)
    x = torch.randn(200, D, dtype=DT)
    scales = torch.rand(1, D, dtype=DT) + 0.5
    v = torch.randn(200, 2, dtype=DT)
    expected = reference.kernel("rbf", x, x, torch.ones(1, D, dtype=DT), additive=True, scales=scales) @ v
    out = cpu.ENGINE.matmul(formula, x.float(), x.float(), {"scales": scales.float()}, v.float())
    assert out.dtype == torch.float32
    assert_close(out.double(), expected, rtol=1e-5)


def test_same_results_for_any_thread_count():
    """Each row is owned by one thread and summed in a fixed order: bitwise equal results."""
    formula = StationaryFormula("rbf", additive=True)
    x = torch.randn(300, D, dtype=DT)
    scales, v = torch.rand(1, D, dtype=DT), torch.randn(300, 2, dtype=DT)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu.ENGINE.matmul(formula, x, x, {"scales": scales}, v)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, cpu.ENGINE.matmul(formula, x, x, {"scales": scales}, v))


# ---------------------------------------------------------------------------- other engines
def test_matches_the_torch_engine():
    """Values and gradients equal to backend.pairwise_matmul on the torch engine (KeOps runs the
    same formula in test_kernels.py, both against the dense reference)."""
    formula = StationaryFormula("rbf", additive=True)
    x1, x2 = inputs()
    scales = torch.rand(1, D, dtype=DT).add(0.5).requires_grad_()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(N, 2, dtype=DT)
    tensors = [x1, x2, rhs, scales]
    out = cpu.ENGINE.matmul(formula, x1, x2, {"scales": scales}, rhs)
    ours = grads(out, weights, tensors)
    with settings.engine("torch"):
        theirs = backend.pairwise_matmul(formula, x1, x2, {"scales": scales}, rhs)
    assert_close(out, theirs)
    for g, e in zip(ours, grads(theirs, weights, tensors)):
        assert_close(g, e)
    with settings.engine("torch"):
        assert_close(cpu.ENGINE.dense(formula, x1, x2, {"scales": scales}), backend.pairwise_dense(formula, x1, x2, {"scales": scales}))


# ---------------------------------------------------------------------------- NTK formulas
@dataclass(frozen=True)
class FactoredTraceEntry:
    """<a_i, a_j> <g_i, g_j> over features concatenated as [a, g] (slices of the feature axis)."""

    width_a: int

    def __call__(self, x1, x2):
        w = self.width_a
        return dot(x1[..., :w], x2[..., :w]) * dot(x1[..., w:], x2[..., w:])


def test_ntk_formulas():
    a1, g1 = torch.randn(N, 3, dtype=DT), torch.randn(N, 4, dtype=DT)
    a2, g2 = torch.randn(M, 3, dtype=DT), torch.randn(M, 4, dtype=DT)
    f1 = torch.cat([a1, g1], -1).requires_grad_()
    f2 = torch.cat([a2, g2], -1).requires_grad_()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(N, 2, dtype=DT)
    out = cpu.ENGINE.matmul(FactoredTraceEntry(3), f1, f2, {}, rhs)
    # From the math: Theta = (A1 A2^T) * (G1 G2^T), written on the concatenated features.
    expected = ((f1[:, :3] @ f2[:, :3].T) * (f1[:, 3:] @ f2[:, 3:].T)) @ rhs
    assert_close(out, expected)
    for g, e in zip(grads(out, weights, [f1, f2, rhs]), grads(expected, weights, [f1, f2, rhs])):
        assert_close(g, e)
    # The full-mode weights w_i = sum_j <a_i, a_j> u_j are the dot-product kernel times u.
    u = torch.randn(M, 5, dtype=DT)
    assert_close(cpu.ENGINE.matmul(dot, a1, a2, {}, u), (a1 @ a2.T) @ u)


# ---------------------------------------------------------------------------- other operations
def _cat(a, b):
    return torch.cat([a, b], -1) if isinstance(a, torch.Tensor) else a.concat(b)


def _sum(q):
    return q.sum(-1, keepdim=True) if isinstance(q, torch.Tensor) else q.sum(-1)


def uneven(x1, x2, p, q):
    """Not symmetric in its inputs; uses operations the formulas of lazykern do not (log, sin, cos,
    powers, abs, relu, rsqrt, concatenation, a width-1 parameter)."""
    d = x1 - 0.5 * x2
    head = (d[..., :1].sin() * p + x2[..., 2:3].cos()) ** 3
    tail = (d[..., 1:] * d[..., 1:] + 1.0).log().abs() + (q * x1[..., 1:]).relu()
    u = _cat(head, tail)
    return _sum(u * u).rsqrt() + _sum(x1 * x2) * 0.1 + (x1[..., 0:1] * x1[..., 0:1] + p) ** 1.5


def test_any_formula_values_gradients_and_symmetric_pass_of_an_asymmetric_formula():
    x1, x2 = inputs()
    p = torch.tensor([[0.7]], dtype=DT, requires_grad=True)
    q = torch.rand(1, D - 1, dtype=DT).add(0.2).requires_grad_()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(N, 2, dtype=DT)
    tensors = [x1, x2, rhs, p, q]

    def dense_torch(a, b):
        return uneven(a[:, None, :], b[None, :, :], p[None], q[None]).squeeze(-1)

    out = cpu.ENGINE.matmul(uneven, x1, x2, {"p": p, "q": q}, rhs)
    expected = dense_torch(x1, x2) @ rhs
    assert_close(out, expected)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)
    left, right = torch.randn(N, 2, dtype=DT), torch.randn(N, 2, dtype=DT)
    gx, _, gp = cpu.ENGINE.symmetric_gradients(uneven, x1, x1, {"p": p, "q": q}, left, right)
    S = ((left @ right.T) * dense_torch(x1, x1)).sum()
    for g, e in zip([gx, gp["p"], gp["q"]], torch.autograd.grad(S, [x1, p, q])):
        assert_close(g, e)


def second_order(x1, x2, scales):
    """The order-2 interaction kernel sum_{d < d'} z_d z_d' by Newton's identity (p1^2 - p2) / 2,
    z_d = s_d exp(-(x_d - x'_d)^2 / 2): power sums over the feature axis, then scalar algebra."""
    z = scales * (-0.5 * (x1 - x2) ** 2).exp()
    p1, p2 = _sum(z), _sum(z**2)
    return 0.5 * (p1 * p1 - p2)


def test_power_sum_formula():
    x1, x2 = inputs()
    scales = torch.rand(1, D, dtype=DT).add(0.5).requires_grad_()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(N, 2, dtype=DT)
    tensors = [x1, x2, rhs, scales]
    out = cpu.ENGINE.matmul(second_order, x1, x2, {"scales": scales}, rhs)
    z = scales * torch.exp(-0.5 * (x1[:, None, :] - x2[None, :, :]) ** 2)  # (N, M, D), from the math
    K = sum(z[..., d] * z[..., e] for d in range(D) for e in range(d + 1, D))
    expected = K @ rhs
    assert_close(out, expected)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)


def one_sided_orders(x1, x2, weights):
    """All orders of the products of x1 * w (one side only: the recurrence runs once per row in
    passes over rows of x1, on a row operand in their gradients) times exp(-|x2|^2 / 2)."""
    return _sum(elementary_symmetric(x1 * weights, D)) * (-0.5 * _sum(x2 * x2)).exp()


def test_elementary_symmetric_of_one_side():
    x1, x2 = inputs()
    w = torch.rand(1, D, dtype=DT).add(0.5).requires_grad_()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(N, 2, dtype=DT)
    tensors = [x1, x2, rhs, w]
    out = cpu.ENGINE.matmul(one_sided_orders, x1, x2, {"weights": w}, rhs)

    def dense(a, b):  # from the math: every subset of every order enumerated
        z = (a * w)[:, None, :].expand(a.shape[0], b.shape[0], D)
        return ref_int.orders(z, torch.ones(D, dtype=DT), None, D) * torch.exp(-0.5 * (b * b).sum(-1))

    assert_close(out, dense(x1, x2) @ rhs)
    for g, e in zip(grads(out, weights, tensors), grads(dense(x1, x2) @ rhs, weights, tensors)):
        assert_close(g, e)
    left, right = torch.randn(N, 2, dtype=DT), torch.randn(N, 2, dtype=DT)
    gx, _, gp = cpu.ENGINE.symmetric_gradients(one_sided_orders, x1, x1, {"weights": w}, left, right)
    S = ((left @ right.T) * dense(x1, x1)).sum()
    for g, e in zip([gx, gp["weights"]], torch.autograd.grad(S, [x1, w])):
        assert_close(g, e)


# ---------------------------------------------------------------------------- interaction kernels
#: case -> (kind, one-dimensional family, max_degree); the orders of lazykern.formulas.interactions
#: (the elementary symmetric recurrence is one node of the engine) and the groups.
INTERACTIONS = {
    "newton-girard-2": ("base", "rbf", 2),
    "newton-girard-all": ("base", "rbf", D),
    "newton-girard-matern-all": ("base", "matern", D),
    "orthogonal-2": ("orthogonal", "rbf", 2),
    "orthogonal-all": ("orthogonal", "rbf", D),
    "group": ("group", "rbf", None),
}
GROUPS = ((0, 1), (1, 2))


def interaction_hyperparameters() -> dict[str, torch.Tensor]:
    return {
        "lengthscale": torch.linspace(0.6, 1.7, D, dtype=DT).reshape(1, D).requires_grad_(),
        "scales": torch.linspace(0.5, 2.0, D, dtype=DT).reshape(1, D).requires_grad_(),
        "order_variances": torch.linspace(0.3, 0.9, D, dtype=DT).reshape(1, D).requires_grad_(),
        "group_scales": torch.tensor([[0.7, 1.3]], dtype=DT).requires_grad_(),
        "measure_mean": torch.full((1, D), 0.2, dtype=DT),
        "measure_std": torch.linspace(0.7, 1.2, D, dtype=DT).reshape(1, D),
    }


def interaction_args(case: str, x1, x2, hp):
    """The formula, its inputs and parameters as the interaction kernels pass them (same parameter
    order, so the kernel tests below reuse these compiled passes)."""
    kind, family, r = INTERACTIONS[case]
    ls = hp["lengthscale"]
    if kind == "group":
        membership = torch.zeros(len(GROUPS), D, dtype=DT)
        for g, dims in enumerate(GROUPS):
            membership[g, list(dims)] = 1
        params = {"membership": membership.reshape(1, -1), "scales": hp["group_scales"]}
        return GroupFormula(StationaryFormula(family)), x1 / ls, x2 / ls, params
    params = {"scales": hp["scales"], "order_variances": hp["order_variances"][..., :r]}
    if kind == "orthogonal":
        features = lambda x: orthogonal_rbf_features(x, ls, hp["measure_mean"], hp["measure_std"])  # noqa: E731
        return InteractionFormula(StationaryFormula("rbf"), r, kind), features(x1), features(x2), params
    base = StationaryFormula(family, nu=2.5 if family == "matern" else None)
    return InteractionFormula(base, r), x1 / ls, x2 / ls, params


def interaction_reference(case: str, x1, x2, hp):
    """From the definitions: every subset of every order enumerated, measure integrals by quadrature."""
    kind, family, r = INTERACTIONS[case]
    ls = hp["lengthscale"]
    if kind == "group":
        return ref_int.group(family, x1, x2, ls, GROUPS, hp["group_scales"])
    if kind == "orthogonal":
        z = ref_int.orthogonal_rbf(x1, x2, ls, hp["measure_mean"], hp["measure_std"])
    else:
        z = ref_int.per_dimension(family, x1, x2, ls, nu=2.5 if family == "matern" else None)
    return ref_int.orders(z, hp["order_variances"][..., :r], hp["scales"], r)


def interaction_leaves(case: str, hp) -> list[torch.Tensor]:
    names = ["lengthscale"] + (["group_scales"] if case == "group" else ["scales", "order_variances"])
    return [hp[n] for n in names]


def test_interaction_formulas_are_supported():
    hp = interaction_hyperparameters()
    x = torch.randn(10, D, dtype=DT)
    for case in INTERACTIONS:
        formula, a, b, params = interaction_args(case, x, x, hp)
        assert cpu.ENGINE.supports(formula, a, b, params), case
    l2 = InteractionFormula(StationaryFormula("rbf"), 2, "orthogonal-l2")
    features = orthogonal_rbf_l2_features(x, hp["lengthscale"], hp["measure_mean"], hp["measure_std"])
    params = {"scales": hp["scales"], "order_variances": hp["order_variances"][..., :2]}
    assert cpu.ENGINE.supports(l2, features, features, params)


@pytest.mark.parametrize("case", INTERACTIONS)
def test_interaction_matmul_values_and_gradients(case):
    """K(x1, x2) V and the gradients for x1, x2, V and every hyperparameter, per-order variances
    included (the orthogonal terms' inputs are per-point features, differentiated through)."""
    hp = interaction_hyperparameters()
    x1, x2 = inputs()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    weights = torch.randn(N, 2, dtype=DT)
    tensors = [x1, x2, rhs, *interaction_leaves(case, hp)]
    formula, a, b, params = interaction_args(case, x1, x2, hp)
    out = cpu.ENGINE.matmul(formula, a, b, params, rhs)
    expected = interaction_reference(case, x1, x2, hp) @ rhs
    assert_close(out, expected)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)


@pytest.mark.parametrize("case", INTERACTIONS)
def test_interaction_dense_values_and_gradients(case):
    hp = interaction_hyperparameters()
    x1, x2 = inputs()
    weights = torch.randn(N, M, dtype=DT)
    tensors = [x1, x2, *interaction_leaves(case, hp)]
    formula, a, b, params = interaction_args(case, x1, x2, hp)
    K = cpu.ENGINE.dense(formula, a, b, params)
    expected = interaction_reference(case, x1, x2, hp)
    assert_close(K, expected)
    for g, e in zip(grads(K, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)


@pytest.mark.parametrize("case", ["newton-girard-all", "orthogonal-all"])
def test_dense_of_one_input_backward_in_one_pass(case, monkeypatch):
    """K(x, x) from one tensor (as the kernels pass it): the gradient reaching x through both sides
    comes from one pass weighted by G and G^T, for an even formula and one that is not (OAK's);
    G not symmetric, so a pass that used G for both sides would show."""
    from lazykern.compiler import driver

    jobs = []
    grad_pass = driver._grad_pass
    monkeypatch.setattr(driver, "_grad_pass", lambda target, f, job, *a: jobs.append(job) or grad_pass(target, f, job, *a))
    hp = interaction_hyperparameters()
    x = torch.randn(N, D, dtype=DT, requires_grad=True)
    weights = torch.randn(N, N, dtype=DT)
    tensors = [x, *interaction_leaves(case, hp)]
    formula, a, _, params = interaction_args(case, x, x, hp)
    K = cpu.ENGINE.dense(formula, a, a, params)
    expected = interaction_reference(case, x, x, hp)
    assert_close(K, expected)
    for g, e in zip(grads(K, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)
    assert jobs == ["sym-pair"]


@pytest.mark.parametrize("case", [c for c in INTERACTIONS if "matern" not in c])
def test_interaction_symmetric_gradients(case):
    """The fused gradient of sum_ij <l_i, r_j> k(x_i, x_j): one pass, one trace of the formula (every
    kind is symmetric, the orthogonal terms too, though not stationary)."""
    hp = interaction_hyperparameters()
    x = torch.randn(N, D, dtype=DT, requires_grad=True)
    left, right = torch.randn(N, 2, dtype=DT), torch.randn(N, 2, dtype=DT)
    tensors = [x, *interaction_leaves(case, hp)]
    formula, a, _, params = interaction_args(case, x, x, hp)
    gx, _, gp = cpu.ENGINE.symmetric_gradients(formula, a, a, params, left, right)
    differentiated = [n for n in params if gp[n] is not None]
    assert differentiated == [n for n in params if params[n].requires_grad]
    outputs = [a, *(params[n] for n in differentiated)]
    actual = torch.autograd.grad(outputs, tensors, [gx, *(gp[n] for n in differentiated)])
    S = ((left @ right.T) * interaction_reference(case, x, x, hp)).sum()
    for g, e in zip(actual, torch.autograd.grad(S, tensors)):
        assert_close(g, e)


def test_orthogonal_l2_terms_match_the_torch_engine():
    """The L2(p) inner products of orthogonal terms (component analysis): six features per
    dimension, one expm1 and two exp per pair."""
    hp = interaction_hyperparameters()
    x1, x2 = inputs()
    rhs = torch.randn(M, 2, dtype=DT)
    weights = torch.randn(N, 2, dtype=DT)
    formula = InteractionFormula(StationaryFormula("rbf"), 2, "orthogonal-l2")
    features = lambda x: orthogonal_rbf_l2_features(  # noqa: E731
        x, hp["lengthscale"], hp["measure_mean"], hp["measure_std"])
    params = {"scales": hp["scales"], "order_variances": hp["order_variances"][..., :2]}
    tensors = [x1, x2, *interaction_leaves("orthogonal-2", hp)]
    out = cpu.ENGINE.matmul(formula, features(x1), features(x2), params, rhs)
    with settings.engine("torch"):
        expected = backend.pairwise_matmul(formula, features(x1), features(x2), params, rhs)
    assert_close(out, expected)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)


# ---------------------------------------------------------------------------- supports, errors
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dense_matmul_matches_torch(dtype):
    """The few-column product on a stored matrix (CG's products on the dense cache): row counts
    that are not multiples of its 4-row blocks, 2 to 9 columns, batches, a broadcast rhs batch."""
    from lazykern.cpu.dense_matmul import dense_matmul, supports_dense_matmul

    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for shape, rhs_shape in [((7, 5), (5, 2)), ((2, 13, 9), (2, 9, 5)), ((3, 10, 10), (10, 9)), ((1, 6), (6, 4))]:
        k, v = torch.randn(shape, dtype=dtype), torch.randn(rhs_shape, dtype=dtype)
        torch.testing.assert_close(dense_matmul(k, v), k @ v, rtol=tol, atol=tol)
    assert not supports_dense_matmul(torch.ones(4, 4), torch.ones(2, 4, 3))  # would copy the matrix
    assert not supports_dense_matmul(torch.ones(4, 4), torch.ones(4, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="rhs"):
        dense_matmul(torch.ones(4, 4), torch.ones(4, 1))


def test_supports_declines_what_it_cannot_generate():
    x = torch.randn(10, D, dtype=DT)
    rbf = StationaryFormula("rbf")
    assert cpu.ENGINE.supports(rbf, x, x, {})
    assert not cpu.ENGINE.supports(lambda a, b: (a - b).logsumexp(dim=1), x, x, {})  # not in the grammar
    assert not cpu.ENGINE.supports(lambda a, b: (a - b).sum(dim=1), x, x, {})  # a reduction inside a formula
    assert not cpu.ENGINE.supports(lambda a, b: a * b, x, x, {})  # D values per pair, not one
    assert not cpu.ENGINE.supports(rbf, x.half(), x.half(), {})
    assert not cpu.ENGINE.supports(rbf, x, x.float(), {})
    assert not cpu.ENGINE.supports(rbf, x.to("meta"), x.to("meta"), {})
    with pytest.raises(ValueError, match="sum over dim=1"):
        cpu.ENGINE.matmul(lambda a, b: (a - b).sum(dim=1), x, x, {}, torch.ones(10, 1, dtype=DT))
    with pytest.raises(ValueError, match="rhs must have 10 rows"):
        cpu.ENGINE.matmul(rbf, x, x, {}, torch.ones(9, 1, dtype=DT))


def test_compiled_once_per_structure_not_per_value_or_size():
    formula = StationaryFormula("rbf", additive=True)
    x = torch.randn(30, D, dtype=DT)
    cpu.ENGINE.matmul(formula, x, x, {"scales": torch.ones(1, D, dtype=DT)}, torch.ones(30, 1, dtype=DT))
    before = len(native.compile_log), native.loaded_programs()
    for n, c in ((7, 1), (40, 5)):
        y = torch.randn(n, D, dtype=DT)
        cpu.ENGINE.matmul(formula, y, x, {"scales": torch.rand(1, D, dtype=DT)}, torch.ones(30, c, dtype=DT))
    assert (len(native.compile_log), native.loaded_programs()) == before


def test_no_flush_to_zero_after_loading_or_running():
    """The libraries are built without -ffast-math, and the flush-to-zero each reduction sets in its
    threads is restored when it ends: subnormal numbers survive in the process, in the calling
    thread and in the OpenMP threads that ran the reduction (torch's own parallel loops)."""
    n = math.isqrt(cpu.reductions.WORK_PER_THREAD * torch.get_num_threads()) + 1  # enough work for every thread
    x = torch.randn(n, D, dtype=DT)
    cpu.ENGINE.matmul(StationaryFormula("rbf", additive=True), x, x, {"scales": torch.ones(1, D, dtype=DT)}, x[:, :1])
    for tiny in (torch.full((10**6,), 1e-39, dtype=torch.float32), torch.full((10**6,), 1e-310, dtype=DT)):
        assert bool(((tiny * 1.0) != 0).all())


@pytest.mark.parametrize("dtype, lowest", [(torch.float32, -87.0), (torch.float64, -708.0)])
def test_exp_below_the_normal_range_is_zero_and_above_it_exact(dtype, lowest):
    """exp's argument is clamped before the call (glibc's vector exp takes a scalar path for a vector
    with any lane out of its range) and the result is 0 below it: what flush-to-zero makes of it."""
    x = torch.zeros(1, D, dtype=dtype)
    z = torch.zeros(400, D, dtype=dtype)
    z[:, 0] = torch.linspace(math.sqrt(-2 * (lowest + 40)), math.sqrt(-2 * (lowest - 40)), 400, dtype=dtype)
    exponent = -0.5 * z[:, 0].double() ** 2
    values = cpu.ENGINE.dense(StationaryFormula("rbf"), x, z, {})[0].double()
    kept = exponent > lowest + 1e-3
    torch.testing.assert_close(values[kept], exponent[kept].exp(), rtol=1e-5 if dtype == torch.float32 else 1e-14,
                               atol=0)
    assert bool((values[exponent < lowest - 1e-3] == 0).all()) and kept.any() and not kept.all()


CHILD = """
import json, torch
from lazykern import cpu
from lazykern import native
from lazykern.formulas import StationaryFormula
x = torch.linspace(-2, 2, 60, dtype=torch.float64).reshape(20, 3)
out = cpu.ENGINE.matmul(StationaryFormula("matern", nu=1.5), x, x, {}, torch.ones(20, 1, dtype=torch.float64))
print("RESULT", json.dumps({"out": out.squeeze(-1).tolist(), "compiled": len(native.compile_log)}))
"""


def test_two_processes_share_one_compile(tmp_path):
    env = dict(os.environ, LAZYKERN_CPU_CACHE=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        results.append(json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT"))[7:]))
    assert sorted(r["compiled"] for r in results) == [0, 1]  # the second waited for the first
    assert results[0]["out"] == results[1]["out"]
    assert len(list(tmp_path.rglob("lk_*.so"))) == 1


def test_the_engine_has_its_own_settings(monkeypatch, tmp_path):
    """LAZYKERN_CPU_FLAGS / LAZYKERN_CPU_CACHE / CXX govern the CPU engine; KeOps' variables do not
    (and the engine's do not reach KeOps)."""
    from lazykern import keops

    monkeypatch.delenv(native.FLAGS_ENV, raising=False)
    monkeypatch.delenv(native.CACHE_ENV, raising=False)
    flags, folder, keops_flags = native.engine_flags(), native.cache_folder(), keops.compile_flags()
    monkeypatch.setenv(keops.FLAGS_ENV, "-O1")
    monkeypatch.setenv(keops.CACHE_ENV, str(tmp_path / "keops"))
    assert (native.engine_flags(), native.cache_folder()) == (flags, folder)
    assert flags == f"{native.BASE_FLAGS} {native.VECTOR_MATH_FLAGS}"

    monkeypatch.setenv(native.FLAGS_ENV, "  -g   -O1 ")
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cpu"))
    monkeypatch.delenv(keops.FLAGS_ENV)
    assert native.engine_flags() == f"{native.BASE_FLAGS} -g -O1" and keops.compile_flags() == keops_flags
    assert native.cache_folder().startswith(str(tmp_path / "cpu")) and native.cache_folder() != folder
    # A compile goes to that folder, with those flags (one tiny library).
    fn = native.load_source("void lk_settings_probe(double* x) { x[0] = 2 * x[0] + 1; }", "lk_settings_probe",
                           [ctypes.c_void_p])
    x = torch.tensor([3.0], dtype=DT)
    fn(x.data_ptr())
    assert x.item() == 7.0
    assert len(list((tmp_path / "cpu").rglob("lk_*.so"))) == 1 and not (tmp_path / "keops").exists()

    monkeypatch.setenv("CXX", "no-such-compiler-lazykern")
    assert native.compiler() is None


def test_matmul_memory_is_linear_in_n():
    """N = 12,000 in float64: K would take 1.15 GB; the product needs the inputs and the output."""
    setup = """
import torch
from lazykern import cpu
from lazykern.formulas import StationaryFormula
f = StationaryFormula("rbf", additive=True)
x = torch.randn(12000, 3, dtype=torch.float64)
s, v = torch.ones(1, 3, dtype=torch.float64), torch.randn(12000, 2, dtype=torch.float64)
cpu.ENGINE.matmul(f, x[:50], x[:50], {"scales": s}, v[:50])
"""
    grown = peak_rss_increase_mb(setup, "out = cpu.ENGINE.matmul(f, x, x, {'scales': s}, v)")
    assert grown < 40, f"peak RSS grew by {grown:.0f} MB"


# ---------------------------------------------------------------------------- as users reach it
def _user_kernel(kind: str, d: int):
    import gpytorch

    import lazykern

    if kind == "additive":  # RQ terms: additive RBF and Matérn terms take the structured engine
        base = lazykern.RQKernel(ard_num_dims=d)
        return gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=d, component_scales=True))
    if kind == "newton-girard":  # all orders, as lazykern uci's default kernel
        base = lazykern.RBFKernel(ard_num_dims=d)
        return lazykern.kernels.NewtonGirardAdditiveKernel(base, d, component_scales=True)
    return lazykern.kernels.OrthogonalAdditiveKernel(d, max_degree=2, component_scales=True)


@pytest.mark.parametrize("kind", ["additive", "newton-girard", "orthogonal"])
def test_kernel_of_x_runs_on_the_cpu_engine_by_default(kind, monkeypatch):
    """``kernel(X)`` on CPU tensors above ``keops_min_size`` points: products, the fused gradient and
    the dense build (and its gradient: the Cholesky path of a training step) all run on the CPU
    engine (KeOps is never called) and agree with the torch engine."""
    n, d = 600, 3
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    v = torch.randn(2, n, 2, generator=gen, dtype=torch.float64)  # a batch of right-hand sides
    w = torch.randn(n, n, generator=gen, dtype=torch.float64)

    def run(engine: str):
        kernel = _user_kernel(kind, d).double()
        with settings.engine(engine), settings.max_dense_bytes(0):
            out = kernel(x) @ v
            (out * v).sum().backward()
        lazy_grads = [p.grad.clone() for p in kernel.parameters()]
        kernel.zero_grad()
        with settings.engine(engine):
            dense = kernel(x).to_dense()
            (dense * w).sum().backward()
        return out.detach(), dense.detach(), lazy_grads, [p.grad.clone() for p in kernel.parameters()]

    expected = run("torch")

    def no_keops(*args, **kwargs):
        raise AssertionError("KeOps was called on CPU tensors the CPU engine supports")

    from lazykern.keops import engine as keops_engine
    from lazykern.torch_engine import engine as torch_engine

    monkeypatch.setattr(backend.KEOPS, "matmul", no_keops)
    monkeypatch.setattr(keops_engine, "keops_session", no_keops)
    monkeypatch.setattr(torch_engine, "rowwise", no_keops)
    op = _user_kernel(kind, d).double()(x).evaluate_kernel()
    assert backend.engine_for(op.covar_func, op.x1, op.x2, op.tensor_params) == "cpu"
    got = run("auto")
    for a, b in zip(got[:2], expected[:2]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(got[2] + got[3], expected[2] + expected[3]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
