"""Every implementation of the elementary symmetric recurrence against its one specification.

``lazykern.formulas.interactions.elementary_symmetric_reference`` states the recurrence (out of
place, as the formula reads); its autograd derivative is the reference vector-Jacobian product.
Tested on the same float64 inputs (signed, so nothing is a convex combination of positive
numbers only; R < D, so the orders above j are skipped while j < R):

* the torch formula (``elementary_symmetric`` on tensors: in place, hand-written reverse mode);
* KeOps' node (``lazykern.keops.nodes``) through pykeops on CPU;
* the C target (``lazykern.cpu``), the recurrence as a pair value and as a row value;
* the Triton target under ``TRITON_INTERPRET=1`` (set when this module is imported, before triton
  is; in a process that imported triton earlier without it, that test skips).

The compiled targets are reached through their products ``K V`` with one inner point and
``V = 1``: the kernel ``sum_r c_r e_r(z)`` with one-hot ``c`` gives each order, and its gradient
for the inputs (a backward pass of the engine) is the vector-Jacobian product for ``g = c``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (see the module docstring)

import pytest  # noqa: E402
import torch  # noqa: E402

from lazykern import cpu  # noqa: E402
from lazykern.formulas.interactions import elementary_symmetric, elementary_symmetric_reference  # noqa: E402

DT = torch.float64
N, D, R = 7, 5, 3


def orders_of_pairs(x1, x2, c):
    """``sum_r c_r e_r(x1 * x2)``: with ``x2 = 1``, the orders of ``x1``, computed per pair."""
    return (c * elementary_symmetric(x1 * x2, R)).sum(-1)


def orders_of_rows(x1, x2, c):
    """``sum_r c_r e_r(x1)``: the same, computed once per row (the inner point is not read)."""
    return (c * elementary_symmetric(x1, R)).sum(-1)


def inputs():
    gen = torch.Generator().manual_seed(3)
    z = (torch.rand(N, D, generator=gen, dtype=DT) * 1.7 - 0.5).requires_grad_()
    g = torch.randn(N, R, generator=gen, dtype=DT)  # the seed of the vector-Jacobian product
    return z, g


def reference(z, g):
    """The specification's orders and its vector-Jacobian product for ``g``, by autograd."""
    e = elementary_symmetric_reference(z, R)
    (vjp,) = torch.autograd.grad(e, z, g)
    return e.detach(), vjp


def assert_close(actual, expected, rtol=1e-12):
    err = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert err <= rtol, f"relative error {err:.3e} > {rtol}"


def test_the_specification_from_the_definition():
    """e_r / binom(D, r) from every subset (so the specification itself is checked against the math)."""
    from itertools import combinations
    from math import comb

    z, _ = inputs()
    e = elementary_symmetric_reference(z.detach(), R)
    for r in range(1, R + 1):
        subsets = sum(z.detach()[:, list(s)].prod(-1) for s in combinations(range(D), r))
        assert_close(e[:, r - 1], subsets / comb(D, r))


@pytest.mark.parametrize("max_degree", range(1, D + 1))
def test_torch_formula(max_degree):
    z, _ = inputs()
    g = torch.randn(N, max_degree, dtype=DT)
    e = elementary_symmetric(z, max_degree)
    (vjp,) = torch.autograd.grad(e, z, g)
    expected = elementary_symmetric_reference(z, max_degree)
    (expected_vjp,) = torch.autograd.grad(expected, z, g)
    assert_close(e.detach(), expected.detach())
    assert_close(vjp, expected_vjp)


@pytest.mark.slow
def test_keops_node():
    """Two KeOps compiles: the node and its gradient node."""
    from lazykern.keops import keops_lazy_tensor  # registers lazykern's nodes with KeOps

    z, g = inputs()
    pairs = keops_lazy_tensor(z[:, None, :]) * keops_lazy_tensor(torch.ones(1, 1, D, dtype=DT))
    e = elementary_symmetric(pairs, R).sum(dim=1)
    (vjp,) = torch.autograd.grad(e, z, g)
    expected, expected_vjp = reference(z, g)
    assert_close(e.detach(), expected)
    assert_close(vjp, expected_vjp)


def _through_products(matmul, formula):
    """Each order (one-hot ``c``) and the vector-Jacobian product for a per-row ``g``, from the
    engine's product over one inner point of ones and the gradient of its backward pass."""
    z, g = inputs()
    x2 = torch.ones(1, D, dtype=DT)
    one = torch.ones(1, 1, dtype=DT)
    orders = [matmul(formula, z.detach(), x2, {"c": torch.eye(R, dtype=DT)[r : r + 1]}, one)[:, 0] for r in range(R)]
    expected, _ = reference(z, g)
    assert_close(torch.stack(orders, dim=-1), expected)
    c = torch.randn(1, R, dtype=DT)
    w = torch.randn(N, dtype=DT)  # the product's row weights: g = w_i c
    (vjp,) = torch.autograd.grad((matmul(formula, z, x2, {"c": c}, one)[:, 0] * w).sum(), z)
    _, expected_vjp = reference(z, w[:, None] * c)
    assert_close(vjp, expected_vjp)


@pytest.mark.parametrize("formula", [orders_of_pairs, orders_of_rows])
def test_c_target(formula):
    _through_products(cpu.ENGINE.matmul, formula)


@pytest.mark.parametrize("formula", [orders_of_pairs, orders_of_rows])
def test_triton_target(formula):
    triton = pytest.importorskip("triton", reason="the Triton target's tests need the triton package (the dev extra)")
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(triton.language.standard.sum, InterpretedFunction):
        pytest.skip("triton was imported in this process before TRITON_INTERPRET=1 was set")
    from lazykern import triton as lk_triton

    _through_products(lk_triton.ENGINE.matmul, formula)
