"""Second derivatives through every engine, exact: ``gradgradcheck`` through what users hold
(``kernel(X) @ V``, ``kernel(X, Z) @ V``) with respect to the inputs, the right-hand side and every
raw hyperparameter, and the Hessian of an ExactGP's marginal log likelihood against a dense
reference written from the math.

Each of these failed before: the CPU engine's backward was ``once_differentiable``, the torch
engine's block recomputation detached its inputs, and linear_operator's ``_bilinear_derivative``
differentiates detached copies, so a Hessian-vector product came back zero or raised.

Compile budget: the kernels are the shapes other files compile already (``test_kernels``: D = 3,
two right-hand-side columns; ``test_interactions``: D = 20, R = 3, nine columns), and a second
derivative compiles nothing more (it runs on the torch engine's blocks), so KeOps compiles no new
formula here.
"""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

import lazykern
from lazykern import settings

from . import reference
from . import test_interactions as interactions
from . import test_kernels as kernels

F64 = torch.float64
KINDS = ["additive-rbf", "additive-matern2.5", "newton-girard", "orthogonal"]
ENGINES = ["cpu", "torch", "keops"]


def _kernel(kind: str):
    if kind.startswith("additive-"):
        return kernels.make_kernel(kind[len("additive-") :], "additive-ard-scales"), kernels.D, 2
    return interactions.make(kind), interactions.D, interactions.RHS


class _Product(torch.nn.Module):
    """``kernel(x) @ v`` or ``kernel(x, z) @ v``, evaluated inside the call (``kernel(x)`` is lazy:
    evaluated outside ``functional_call`` it would read the kernel's own parameters)."""

    def __init__(self, kernel: gpytorch.kernels.Kernel) -> None:
        super().__init__()
        self.kernel = kernel

    def forward(self, x: torch.Tensor, z: torch.Tensor | None, v: torch.Tensor) -> torch.Tensor:
        return (self.kernel(x) if z is None else self.kernel(x, z)) @ v


def _gradgradcheck(kind: str, engine: str, cross: bool, n: int = 5, m: int = 4) -> None:
    kernel, d, columns = _kernel(kind)
    module = _Product(kernel)
    names = [name for name, _ in module.named_parameters()]
    raw = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]
    x = torch.randn(n, d, dtype=F64, requires_grad=True)
    z = torch.randn(m, d, dtype=F64, requires_grad=True) if cross else None
    v = torch.randn(m if cross else n, columns, dtype=F64, requires_grad=True)

    def product(x, *rest):
        z, v, params = (rest[0], rest[1], rest[2:]) if cross else (None, rest[0], rest[1:])
        return torch.func.functional_call(module, dict(zip(names, params)), (x, z, v))

    inputs = (x, *([z] if cross else []), v, *raw)
    with settings.engine(engine), settings.max_dense_bytes(0):
        assert torch.autograd.gradgradcheck(product, inputs)


@pytest.mark.parametrize("cross", [False, True], ids=["K(X,X)", "K(X,Z)"])
@pytest.mark.parametrize("engine", ["cpu", "torch"])
@pytest.mark.parametrize("kind", KINDS)
def test_gradgradcheck_through_the_kernel_product(kind, engine, cross):
    _gradgradcheck(kind, engine, cross)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["newton-girard"])
def test_gradgradcheck_on_keops(kind):
    """KeOps' product with the torch engine's second derivatives (KeOps' autodiff cannot
    differentiate the vector-Jacobian product of lazykern's recurrence node).

    One formula, the recurrence's: the path (KeOps' first derivatives from its kept graph, every
    higher one from the torch engine) is the same for every formula, and each family's second
    derivatives are checked on the CPU and torch engines above. The four families on KeOps cost
    3 minutes of KeOps compiles in a cold suite (OAK alone 78 s)."""
    _gradgradcheck(kind, "keops", cross=False, n=3)
    _gradgradcheck(kind, "keops", cross=True, n=3, m=3)


def test_hessian_vector_product_through_the_default_engine():
    """``grad(grad(f, X, create_graph=True).sum(), X)`` raised "appears to not have been used in the
    graph": the first gradient came back detached."""
    kernel = kernels.make_kernel("rbf", "additive-ard-scales")
    x = torch.randn(12, kernels.D, dtype=F64, requires_grad=True)
    v = torch.randn(12, 2, dtype=F64)
    w = torch.randn(12, kernels.D, dtype=F64)  # a direction: the plain sum of a stationary kernel's gradient is 0

    (g,) = torch.autograd.grad((kernel(x) @ v).square().sum(), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * w).sum(), x)
    ref = lambda x: (reference.kernel("rbf", x, x, kernel.base_kernel.lengthscale, additive=True,  # noqa: E731
                                      scales=kernel.component_scales) @ v).square().sum()
    (g_ref,) = torch.autograd.grad(ref(x), x, create_graph=True)
    (hv_ref,) = torch.autograd.grad((g_ref * w).sum(), x)
    kernels.assert_close(g, g_ref)
    kernels.assert_close(hv, hv_ref)


# ------------------------------------------------------------------ the MLL's Hessian
class _GP(gpytorch.models.ExactGP):
    def __init__(self, x, y):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        super().__init__(x, y, likelihood)
        self.mean = gpytorch.means.ConstantMean().double()
        base = lazykern.RBFKernel(ard_num_dims=x.shape[-1]).double()
        self.covar = gpytorch.kernels.ScaleKernel(
            lazykern.AdditiveStructureKernel(base, num_dims=x.shape[-1], component_scales=True)).double()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))


class _MLL(torch.nn.Module):
    """The MLL as a module of the model alone, so that ``functional_call`` swaps every parameter."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        return gpytorch.mlls.ExactMarginalLogLikelihood(self.model.likelihood, self.model)(self.model(x), y)


def _dense_mll(model, raw: dict[str, torch.Tensor], x, y):
    """The same MLL from the math: a dense additive RBF kernel, GPyTorch's parameter transforms."""
    covar, additive = model.covar, model.covar.base_kernel
    positive = lambda name, constraint: constraint.transform(raw[name])  # noqa: E731
    outputscale = positive("covar.raw_outputscale", covar.raw_outputscale_constraint)
    lengthscale = positive("covar.base_kernel.base_kernel.raw_lengthscale",
                           additive.base_kernel.raw_lengthscale_constraint)
    scales = positive("covar.base_kernel.raw_component_scales", additive.raw_component_scales_constraint)
    noise = positive("likelihood.noise_covar.raw_noise", model.likelihood.noise_covar.raw_noise_constraint)
    K = outputscale * reference.kernel("rbf", x, x, lengthscale, additive=True, scales=scales)
    K = K + noise * torch.eye(len(x), dtype=F64)
    r = y - raw["mean.raw_constant"]
    L = torch.linalg.cholesky(K)
    quad = r @ torch.cholesky_solve(r.unsqueeze(-1), L).squeeze(-1)
    logdet = 2 * L.diagonal().log().sum()
    return -0.5 * (quad + logdet + len(x) * math.log(2 * math.pi)) / len(x)


def test_hessian_of_the_marginal_log_likelihood_matches_a_dense_reference():
    torch.manual_seed(3)
    x = torch.rand(50, 3, dtype=F64) * 4 - 2
    y = torch.sin(x).sum(-1) + 0.1 * torch.randn(50, dtype=F64)
    model = _GP(x, y)
    model.covar.base_kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.1, 1.6]], dtype=F64)
    model.likelihood.noise = 0.05
    model.train()
    wrapper = _MLL(model)
    names = [name.removeprefix("model.") for name, _ in wrapper.named_parameters()]
    start = tuple(p.detach().clone() for _, p in wrapper.named_parameters())

    def lazy(*params):
        full = {f"model.{n}": p for n, p in zip(names, params)}
        return torch.func.functional_call(wrapper, full, (x, y))

    def dense(*params):
        return _dense_mll(model, dict(zip(names, params)), x, y)

    kernels.assert_close(lazy(*start), dense(*start))
    got = torch.autograd.functional.hessian(lazy, start)
    expected = torch.autograd.functional.hessian(dense, start)
    for row_got, row_expected in zip(got, expected):
        for a, b in zip(row_got, row_expected):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
