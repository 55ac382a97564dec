"""``torch.compile`` of code that uses lazykern's kernels: where it matches eager, and where it does not.

Dynamo cannot trace lazykern's engines (the compiled C reductions are ``ctypes`` calls, the chooser
reads Python state), so it breaks the graph around them and runs them eagerly; what it compiles is
the torch code around them. Each test compiles a function and compares it with the same function
run eagerly, in float64 on 50 points.
"""

from __future__ import annotations

import contextlib

import gpytorch
import pytest
import torch

import lazykern
from lazykern.operators import LazyKernelOperator

N, D = 50, 3

pytestmark = pytest.mark.slow  # each test waits for Dynamo and Inductor (~10-60 s on 2 cores)


def _kernel() -> gpytorch.kernels.ScaleKernel:
    base = lazykern.RBFKernel(ard_num_dims=D)
    return gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=D)).double()


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(N, D, dtype=torch.float64), torch.randn(N, 2, dtype=torch.float64)


def test_compiled_forward_returns_the_lazy_operator() -> None:
    """The kernel's forward compiles to the same lazy operator (nothing is evaluated in it)."""
    x, v = _data()
    kernel = _kernel().base_kernel
    torch._dynamo.reset()
    op = torch.compile(kernel.forward)(x, x)
    assert isinstance(op, LazyKernelOperator)
    assert torch.allclose(op @ v, kernel(x) @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("engine", "dense_bytes"), [("cpu", 0)], ids=["cpu_engine_lazy"])
def test_compiled_matvec_matches_eager(engine: str, dense_bytes: int | None) -> None:
    """The lazy path (the torch engine's row blocks were checked the same way: they are plain torch,
    which Dynamo traces; one compile per setting, so the suite keeps the CPU engine's)."""
    x, v = _data()
    kernel = _kernel()

    def matvec(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(x) @ v

    budget = lazykern.settings.max_dense_bytes(dense_bytes) if dense_bytes is not None else contextlib.nullcontext()
    with lazykern.settings.engine(engine), budget:
        eager = matvec(x, v)
        torch._dynamo.reset()
        compiled = torch.compile(matvec)(x, v)
    assert torch.allclose(compiled, eager, rtol=1e-12, atol=1e-12)


def test_compiled_matvec_on_the_dense_budget_matches_eager() -> None:
    """The dense path's product runs eagerly inside the compiled function (it returned
    uninitialised memory when Dynamo traced into the engines from linear_operator's Matmul)."""
    x, v = _data()
    kernel = _kernel()

    def matvec(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(x) @ v

    with lazykern.settings.engine("cpu"), lazykern.settings.max_dense_bytes(10**9):
        eager = matvec(x, v)
        torch._dynamo.reset()
        compiled = torch.compile(matvec)(x, v)
    assert torch.allclose(compiled, eager, rtol=1e-12, atol=1e-12)


def test_compiled_posterior_mean_matches_eager() -> None:
    """An ExactGP's posterior mean and variance at new points, compiled, equal eager's (default
    settings: the engine lazykern chooses, the dense budget on)."""
    x, _ = _data()
    y = torch.sin(x).sum(-1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()

    class GP(gpytorch.models.ExactGP):
        def __init__(self) -> None:
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = _kernel()

        def forward(self, inputs: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
            return gpytorch.distributions.MultivariateNormal(self.mean_module(inputs), self.covar_module(inputs))

    model = GP().double().eval()
    test_x = torch.randn(7, D, dtype=torch.float64)

    def posterior(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        prediction = model(inputs)
        return prediction.mean, prediction.variance

    with torch.no_grad():
        eager = posterior(test_x)
        torch._dynamo.reset()
        compiled = torch.compile(posterior)(test_x)
    for a, b in zip(compiled, eager):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10)
