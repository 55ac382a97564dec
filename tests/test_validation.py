"""Bad input: a named ValueError/TypeError before any KeOps compile, and nothing changed."""

from __future__ import annotations

import gpytorch
import pytest
import torch

import lazykern
from lazykern import backend


@pytest.fixture
def no_reduction(monkeypatch):
    """Fail loudly if any reduction (hence any KeOps compile) starts."""

    def boom(*args, **kwargs):
        raise AssertionError("a reduction ran before validation")

    for name in ("pairwise_matmul", "pairwise_dense", "elementwise"):
        monkeypatch.setattr(backend, name, boom)


def additive(d=3, **kw):
    return lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=d), num_dims=d, **kw)


X = torch.randn(10, 3)


@pytest.mark.parametrize(
    "kernel, x1, x2, error, match",
    [
        (additive(), torch.randn(10, 4), torch.randn(10, 4), ValueError, "num_dims=3"),
        (lazykern.RBFKernel(ard_num_dims=3), torch.randn(10, 2), torch.randn(10, 2), ValueError, "ard_num_dims=3"),
        (additive(), X, torch.randn(10, 2), ValueError, "same number of features"),
        (additive(), X.bool(), X, TypeError, "x1 must hold real numbers"),
        (additive(), X, X.to(torch.complex64), TypeError, "x2 must hold real numbers"),
        (additive().half(), X.half(), X.half(), TypeError, "float32 or float64"),
        (additive(), torch.full((10, 3), float("nan")), X, ValueError, "x1 contains NaN"),
        (additive(), X, torch.full((10, 3), float("inf")), ValueError, "x2 contains NaN or infinite"),
        (additive(), torch.empty(0, 3), X, ValueError, "x1 must not be empty"),
    ],
)
def test_bad_inputs_raise_named_errors(no_reduction, kernel, x1, x2, error, match):
    state = {k: v.clone() for k, v in kernel.state_dict().items()}
    with pytest.raises(error, match=match):
        kernel.forward(x1, x2)
    assert all(torch.equal(state[k], v) for k, v in kernel.state_dict().items())


def test_bad_inputs_through_gpytorch_call_and_diag(no_reduction):
    kernel = gpytorch.kernels.ScaleKernel(additive())
    with pytest.raises(ValueError, match="num_dims=3"):
        kernel(torch.randn(10, 4), diag=True)
    with pytest.raises(ValueError, match="num_dims=3"):
        kernel(torch.randn(10, 4)).to_dense()


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: lazykern.AdditiveStructureKernel(gpytorch.kernels.LinearKernel(), 3), TypeError, "base_kernel must be"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), 0), ValueError, "num_dims"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=4), 3), ValueError, "ard_num_dims"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), 3, active_dims=(0, 1)), ValueError, "active_dims"),
        (lambda: lazykern.AdditiveStructureKernel(lazykern.RBFKernel(active_dims=(0,)), 1), ValueError, "active_dims"),
        (lambda: lazykern.MaternKernel(nu=2.0), ValueError, "nu must be one of"),
    ],
)
def test_bad_constructor_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_last_dim_is_batch_is_refused(no_reduction):
    with pytest.raises(ValueError, match="AdditiveStructureKernel"):
        lazykern.RBFKernel()(X, X, last_dim_is_batch=True).to_dense()


def test_settings_validate():
    with pytest.raises(ValueError, match="engine"):
        lazykern.settings.engine("cuda")
    with pytest.raises(ValueError, match="max_dense_bytes"):
        lazykern.settings.max_dense_bytes(-1)
