"""Memory: exact GPs with interaction kernels train on the CG path at N=5000, d=20 in O(N d) memory.

Default engine: lazykern's CPU engine for CPU tensors (KeOps runs the same formulas on GPUs). On
KeOps' CPU code the OAK run peaked at 436 MB (measured before the CPU engine became the default,
and before OAK's KeOps gradient became one fused reduction instead of four; Newton-Girard and
groups stayed under 300 MB there too).
"""

from __future__ import annotations

import pytest

from .memory import peak_rss_increase_mb

SETUP = """
import torch, gpytorch, lazykern
torch.manual_seed(0)
n, d = 5000, 20
x = torch.randn(n, d, dtype=torch.float64)
y = torch.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * torch.randn(n, dtype=torch.float64)

def make(kind):
    if kind == "newton-girard":
        base = lazykern.RBFKernel(ard_num_dims=d)
        return lazykern.kernels.NewtonGirardAdditiveKernel(base, d, 3, component_scales=True)
    if kind == "orthogonal":
        return lazykern.kernels.OrthogonalAdditiveKernel(d, 3)
    base = lazykern.RBFKernel(ard_num_dims=d)
    return lazykern.kernels.GroupAdditiveKernel(base, ((0, 1), (1, 2, 3), (4,), tuple(range(5, 20))),
                                                num_dims=d, component_scales=True)

class GP(gpytorch.models.ExactGP):
    def __init__(self):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = make(KIND)
    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

model = GP().double()
model.train()
mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)

def step(inputs, targets):
    with lazykern.settings.max_dense_bytes(0), \\
            gpytorch.settings.max_cholesky_size(0), gpytorch.settings.max_cg_iterations(6), \\
            gpytorch.settings.max_lanczos_quadrature_iterations(6), \\
            gpytorch.settings.num_trace_samples(8):
        model.set_train_data(inputs, targets, strict=False)
        optimizer.zero_grad()
        loss = -mll(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return loss

# Warm up (compiles, lazy imports) on a small problem: the same reductions, none of the size.
step(x[:600], y[:600])
"""

BODY = """
before = {n: p.detach().clone() for n, p in model.named_parameters()}
losses = [step(x, y)]
assert all(torch.isfinite(l) for l in losses)
assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if p.requires_grad)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["newton-girard", "orthogonal", "group"])
def test_interaction_gp_trains_at_n5000_d20_in_small_memory(kind):
    """An Adam step of the exact MLL on the CG path, N=5000, d=20, float64: one N x N float64
    matrix alone would be 200 MB, GPyTorch's R x D x N x N tensor for R = 3 about 12 GB."""
    increase = peak_rss_increase_mb(f"KIND = {kind!r}\n" + SETUP, BODY, timeout=3000)
    print(f"{kind}: peak RSS increase {increase:.0f} MB")
    assert increase < 300, f"peak RSS grew by {increase:.0f} MB"
