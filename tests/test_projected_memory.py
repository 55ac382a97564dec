"""Memory: an MLL step of a GP with 500 projections never forms J x N x N, nor N x N (peak RSS in a
fresh process, as ``test_memory.py`` measures the additive kernel).

The suite runs N = 2,000 (one float32 J x N x N tensor alone would be 8 GB). The full size of the
claim, N = 10^4 with d = 26 and J = 500, costs O(N^2 J) per product: minutes on two cores, so it is
measured on demand (``docs/projected.rst`` records the result)::

    python3 -m tests.test_projected_memory 10000
"""

from __future__ import annotations

import sys
import time

import pytest

from .memory import MLL_STEP, peak_rss_increase_mb

SETUP = """
import torch, gpytorch, lazykern
torch.manual_seed(0)
n, d, J = {n}, 26, 500
x = torch.randn(n, d)
y = torch.randn(n)

class GP(gpytorch.models.ExactGP):
    def __init__(self):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        base = lazykern.MaternKernel(nu=2.5)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            lazykern.ProjectedAdditiveKernel(base, num_dims=d, num_projections=J, projections="rpa",
                                             learn_projections=True))
    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

model = GP()
model.train()
mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)


""" + MLL_STEP + """

# Warm up (compiles, lazy imports) on a small problem: the same reductions, none of the size.
step(x[:300], y[:300])
model.zero_grad()
"""

BODY = """
loss = step(x, y)
assert torch.isfinite(loss)
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
assert model.covar_module.base_kernel.projections.grad.abs().sum() > 0
"""


def mll_step_peak_rss_increase_mb(n: int) -> float:
    """Peak RSS growth (MB) of one MLL forward and backward with learned directions, N = ``n``."""
    return peak_rss_increase_mb(SETUP.format(n=n), BODY, timeout=7200)


@pytest.mark.slow
def test_projected_mll_step_at_n2000_j500_stays_small():
    """Measured 68-79 MB (the N x J projected inputs, their sort and their gradients; see
    docs/projected.rst); J x N x N in float32 would be 8 GB."""
    increase = mll_step_peak_rss_increase_mb(2000)
    print(f"peak RSS increase: {increase:.0f} MB")
    assert increase < 150, f"peak RSS grew by {increase:.0f} MB"


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    start = time.perf_counter()
    grown = mll_step_peak_rss_increase_mb(size)
    print(f"N = {size}, d = 26, J = 500: peak RSS increase {grown:.0f} MB, {time.perf_counter() - start:.0f} s "
          "(warm-up and setup included)")
