"""Memory: the additive kernel never forms N x M x d, nor N x M (peak RSS in a fresh process)."""

from __future__ import annotations

import pytest

from .memory import MLL_STEP, peak_rss_increase_mb

SETUP = """
import torch, gpytorch, lazykern
torch.manual_seed(0)
n, d = 10000, 26
x = torch.randn(n, d)
y = torch.randn(n)

class GP(gpytorch.models.ExactGP):
    def __init__(self):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        base = lazykern.RBFKernel(ard_num_dims=d)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            lazykern.AdditiveStructureKernel(base, num_dims=d, component_scales=True))
    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

model = GP()
model.train()
mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)


""" + MLL_STEP + """

# Warm up (compiles, lazy imports) on a small problem: the same reductions, none of the size.
step(x[:600], y[:600])
model.zero_grad()
"""

BODY = """
loss = step(x, y)
assert torch.isfinite(loss)
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
"""


@pytest.mark.slow
def test_additive_mll_step_at_n10000_stays_small():
    """One MLL forward+backward on the CG path, N=10000, d=26, float32: one N x N float32 matrix alone
    would be 400 MB and GPyTorch's d x N x N tensor 10 GB; the lazy kernel must stay under 300 MB.
    Default engine: lazykern's CPU engine for CPU tensors (KeOps runs the same formula on GPUs)."""
    increase = peak_rss_increase_mb(SETUP, BODY, timeout=1500)
    print(f"peak RSS increase: {increase:.0f} MB")
    assert increase < 300, f"peak RSS grew by {increase:.0f} MB"
