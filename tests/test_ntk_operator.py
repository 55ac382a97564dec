"""linear_operator's own operator test bases, run on the NTK operator.

``LinearOperatorTestCase`` (square) and ``RectangularLinearOperatorTestCase`` exercise every
operator method GPyTorch users reach: products and their gradients with respect to the
representation (inputs *and* network parameters), solves, log-determinants, decompositions,
batch operations (``unsqueeze``, ``expand``, ``permute``, indexing), dtype conversions, ``cat``,
pickling. The dense reference is a ``torch.func`` Jacobian contraction written from the operator's
own representation tensors, so conversions (``.double()``) and gradients are checked too.

Each base runs with default settings (``backend="auto"``, which at these sizes picks per-layer
features on the chunked torch engine) and with the lazy path forced (``backend="linearized"``: no
features and nothing pairwise is ever stored; every product goes through the network). The KeOps
backend is not run here: these bases multiply by right-hand sides of a dozen different widths,
each a separate KeOps compilation (minutes in all); its products, blocks and gradients are checked
in ``tests/test_ntk.py`` against the same Jacobian reference.
"""

from __future__ import annotations

import unittest

import torch
from linear_operator.test.linear_operator_test_case import LinearOperatorTestCase, RectangularLinearOperatorTestCase
from torch import nn
from torch.func import functional_call, jacrev, vmap

from lazykern.ntk import NTKOperator
from lazykern.ntk.operator import make_operator

WIDTH, OUTPUTS = 3, 2


def _network() -> nn.Module:
    # 32 wide, inputs spread by 2: kernel matrices with condition numbers below 200, as the bases'
    # stochastic log-determinant tolerances assume
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(WIDTH, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, OUTPUTS))


def dense_ntk(op: NTKOperator) -> torch.Tensor:
    """Jacobian contraction from the operator's representation (inputs, parameters), differentiable."""
    model, trainable, mode = op.network.model, op.network.trainable, op.plan.mode
    tensors = op.tensors

    def jacobian(x: torch.Tensor) -> torch.Tensor:
        def f(p, xi):
            return functional_call(model, {**tensors, **p}, (xi.unsqueeze(0),)).reshape(-1)

        jac = vmap(jacrev(f), in_dims=(None, 0))({n: tensors[n] for n in trainable}, x)
        return torch.cat([j.reshape(x.shape[0], j.shape[1], -1) for j in jac.values()], dim=-1)

    x1, x2 = op._full_batch()
    batch = x1.shape[:-2]
    blocks = []
    for b1, b2 in zip(x1.reshape(-1, *x1.shape[-2:]), x2.reshape(-1, *x2.shape[-2:])):
        j1, j2 = jacobian(b1), jacobian(b2)
        full = torch.einsum("iop,jqp->iojq", j1, j2)
        if mode == "trace":
            blocks.append(torch.einsum("iojo->ij", full))
        else:
            blocks.append(full.reshape(j1.shape[0] * OUTPUTS, j2.shape[0] * OUTPUTS))
    return torch.stack(blocks).reshape(*batch, *blocks[0].shape[-2:])


class _NTKCase:
    seed = 0
    backend = "auto"
    mode = "trace"
    batch: tuple[int, ...] = ()
    rows, cols = 6, None

    def create_linear_op(self) -> NTKOperator:
        torch.manual_seed(self.seed)
        x1 = 2 * torch.randn(*self.batch, self.rows, WIDTH)
        x2 = None if self.cols is None else 2 * torch.randn(*self.batch, self.cols, WIDTH)
        return make_operator(_network(), x1, x2, mode=self.mode, backend=self.backend, forms=None, sample_ndim=1)

    def evaluate_linear_op(self, linear_op: NTKOperator) -> torch.Tensor:
        return dense_ntk(linear_op)


def _square(name: str, **attrs) -> type:
    return type(name, (_NTKCase, LinearOperatorTestCase, unittest.TestCase), attrs)


def _rectangular(name: str, **attrs) -> type:
    return type(name, (_NTKCase, RectangularLinearOperatorTestCase, unittest.TestCase), attrs)


for _backend in ("auto", "linearized"):
    _tag = _backend.capitalize()
    globals()[f"TestNTKTrace{_tag}"] = _square(f"TestNTKTrace{_tag}", backend=_backend)
    globals()[f"TestNTKFull{_tag}"] = _square(f"TestNTKFull{_tag}", backend=_backend, mode="full", rows=3)
    globals()[f"TestNTKBatch{_tag}"] = _square(f"TestNTKBatch{_tag}", backend=_backend, batch=(2,))
    globals()[f"TestNTKRectangular{_tag}"] = _rectangular(f"TestNTKRectangular{_tag}", backend=_backend, cols=4)
    globals()[f"TestNTKRectangularBatch{_tag}"] = _rectangular(
        f"TestNTKRectangularBatch{_tag}", backend=_backend, cols=4, batch=(2,), mode="full"
    )


def test_operator_uses_its_own_tensors() -> None:
    """Batch operations, dtype conversions and ``cat`` act on the operator's own
    tensors, and a backward pass reaches every representation tensor that requires grad."""
    from linear_operator.operators import cat

    case = _NTKCase()
    case.batch = (2,)
    op = case.create_linear_op()
    dense = dense_ntk(op).detach()
    for dim in (-3, -2, -1):
        joined = cat([op, op], dim=dim)
        assert torch.allclose(joined.to_dense(), torch.cat([dense, dense], dim=dim), atol=1e-5)
    assert torch.allclose(op.unsqueeze(0).to_dense(), dense.unsqueeze(0), atol=1e-5)
    assert torch.allclose(op.expand(3, *op.shape).to_dense()[2], dense, atol=1e-5)
    double = op.double()
    assert double.dtype == torch.float64
    assert torch.allclose(double.to_dense(), dense_ntk(double).detach(), rtol=1e-12, atol=0)
    # gradients with respect to the inputs and the network's parameters, as representation tensors
    op = op.detach().requires_grad_(True)
    copy = op.clone().detach().requires_grad_(True)
    v = torch.randn(*op.batch_shape, op.shape[-1], 2)
    (op @ v).square().sum().backward()
    (dense_ntk(copy) @ v).square().sum().backward()
    assert op.x1.grad is not None and op._args[2].grad is not None
    for a, b in zip(op.representation(), copy.representation()):
        # (the output layer's bias does not enter the NTK: no gradient on either side)
        ga, gb = (torch.zeros_like(t) if t.grad is None else t.grad for t in (a, b))
        assert torch.allclose(ga, gb, rtol=1e-3, atol=1e-4)
