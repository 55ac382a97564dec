"""The dense budget (``settings.max_dense_bytes``): the budgeted dense path and the lazy path agree,
and the dense matrix is formed only when it fits the budget. The additive RBF kernel runs on the
compiled pair engine here (``settings.engine("cpu")``): by default it takes the structured engine,
whose products cost less than the matrix, so that no budget ever forms one for them."""

from __future__ import annotations

import gpytorch
import pytest
import torch

import lazykern
from lazykern import backend, settings

N, D = 1000, 26  # the additive shape of test_memory.py, so the compiled formulas are shared


class ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        base = lazykern.RBFKernel(ard_num_dims=x.shape[-1])
        self.covar_module = gpytorch.kernels.ScaleKernel(
            lazykern.AdditiveStructureKernel(base, num_dims=x.shape[-1], component_scales=True)
        )

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _model(dtype: torch.dtype) -> tuple[ExactGP, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = torch.sin(x[:, :3]).sum(-1) + 0.1 * torch.randn(N, generator=gen, dtype=torch.float64)
    model = ExactGP(x.to(dtype), y.to(dtype)).to(dtype)
    # A well-conditioned problem, so that CG amplifies rounding differences as little as possible.
    model.likelihood.noise = 1.0
    model.covar_module.outputscale = 0.01
    model.covar_module.base_kernel.base_kernel.lengthscale = torch.linspace(0.5, 2.0, D, dtype=dtype)
    model.covar_module.base_kernel.component_scales = torch.linspace(0.5, 1.5, D, dtype=dtype)
    return model, x.to(dtype), y.to(dtype)


def _mll_step(dtype: torch.dtype, budget: int, spy: list) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model, x, y = _model(dtype)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    torch.manual_seed(0)  # the same CG probe vectors on both paths
    # CG run to (near) machine precision, so that the two paths' solves differ by rounding only.
    cg_tolerance = 1e-12 if dtype == torch.float64 else 1e-8
    with settings.engine("cpu"), settings.max_dense_bytes(budget), gpytorch.settings.max_cholesky_size(0), \
            gpytorch.settings.max_cg_iterations(400), gpytorch.settings.cg_tolerance(cg_tolerance):
        loss = mll(model(x), y)
        names, params = zip(*model.named_parameters())
        grads = torch.autograd.grad(loss, params)
    spy.append(None)  # marks the end of this step in the call log
    return loss.detach(), dict(zip(names, grads))


@pytest.fixture
def dense_calls(monkeypatch) -> list:
    """Every call of ``backend.pairwise_dense`` (the only way a dense kernel matrix is formed)."""
    calls: list = []
    original = backend.pairwise_dense

    def spy(formula, x1, x2, params, *engine):
        calls.append((x1.shape[-2], x2.shape[-2]))
        return original(formula, x1, x2, params, *engine)

    monkeypatch.setattr(backend, "pairwise_dense", spy)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_dense_and_lazy_paths_give_the_same_mll_and_gradients(dtype, tol, dense_calls):
    itemsize = torch.empty((), dtype=dtype).element_size()
    lazy_loss, lazy_grads = _mll_step(dtype, budget=0, spy=dense_calls)
    assert dense_calls == [None], "the lazy path formed a dense kernel matrix"
    dense_loss, dense_grads = _mll_step(dtype, budget=N * N * itemsize, spy=dense_calls)
    assert (N, N) in dense_calls, "the budget fits N x N but the dense path was not taken"

    assert torch.isfinite(lazy_loss)
    assert abs(float(dense_loss - lazy_loss)) <= tol * abs(float(lazy_loss))
    for name, grad in lazy_grads.items():
        scale = float(grad.abs().max()) or 1.0
        assert float((dense_grads[name] - grad).abs().max()) <= tol * max(scale, 1.0), name


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_dense_and_lazy_matvecs_and_gradients_agree(dtype, tol):
    model, x, _ = _model(dtype)
    kernel = model.covar_module
    rhs = torch.randn(N, 11, generator=torch.Generator().manual_seed(4), dtype=torch.float64).to(dtype)
    results = []
    for budget in (0, N * N * 8):
        with settings.engine("cpu"), settings.max_dense_bytes(budget):
            op = kernel(x)
            with torch.no_grad():
                matvec = op @ rhs
            grads = torch.autograd.grad((rhs * (op @ rhs)).sum(), list(kernel.parameters()))
        results.append((matvec, grads))
    (lazy_mv, lazy_g), (dense_mv, dense_g) = results
    assert float((dense_mv - lazy_mv).abs().max() / lazy_mv.abs().max()) <= tol
    for a, b in zip(dense_g, lazy_g):
        assert float((a - b).abs().max()) <= tol * max(float(b.abs().max()), 1.0)


def test_budget_is_honoured_at_the_boundary(dense_calls):
    n = 300
    x = torch.randn(n, 4, dtype=torch.float32)
    kernel = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=4), num_dims=4)
    rhs = torch.randn(n, 2)
    nbytes = n * n * 4
    with settings.engine("torch"), torch.no_grad():
        with settings.max_dense_bytes(nbytes - 1):
            op = kernel(x)
            below = [op @ rhs, op @ rhs]
        assert dense_calls == []
        with settings.max_dense_bytes(nbytes):
            op = kernel(x)
            at = [op @ rhs, op @ rhs]
        assert dense_calls == [(n, n)], "the dense matrix must be built once and reused by later matvecs"
    for a, b in zip(below, at):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def _tiny_ntk(n: int):
    """A small network's trace NTK on ``n`` samples, products on the torch engine (features kept)."""
    gen = torch.Generator().manual_seed(5)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    return lazykern.ntk.empirical_ntk(net, x, mode="trace", backend="dense"), x


def test_kernel_matrices_and_ntk_features_share_one_budget(dense_calls):
    """One cache and one budget per device for kernel matrices and NTK features: storing either
    evicts the least recently used entry of either kind, and the total never exceeds the budget."""
    from lazykern.operators import DENSE_CACHE

    n = 40
    cpu = torch.device("cpu")
    x = torch.randn(n, 4, dtype=torch.float64)
    kernel = lazykern.RBFKernel()
    rhs = torch.ones(n, 2, dtype=torch.float64)
    K, _ = _tiny_ntk(n)
    v = torch.ones(n, dtype=torch.float64)
    DENSE_CACHE.clear()
    with settings.engine("torch"), torch.no_grad():
        K @ v
        features = DENSE_CACHE.held(cpu)
        DENSE_CACHE.clear()
        matrix = n * n * 8
        assert 0 < features and len(K.cache) == 0
        budget = features + matrix - 1  # either alone fits, both together do not
        with settings.max_dense_bytes(budget):
            op = kernel(x)
            expected = op @ rhs
            assert DENSE_CACHE.held(cpu) == matrix and dense_calls == [(n, n)]
            K @ v  # the features evict the kernel matrix
            assert len(K.cache) == 1 and DENSE_CACHE.held(cpu) == features
            again = op @ rhs  # the kernel matrix is formed again and evicts the features
            assert dense_calls == [(n, n)] * 2 and len(K.cache) == 0 and DENSE_CACHE.held(cpu) == matrix
    assert torch.equal(again, expected)
    del K
    DENSE_CACHE.clear()


def test_ntk_plans_read_the_budget_of_their_device(monkeypatch):
    """The NTK's plan, tiles and feature cache use the budget of the tensors' device
    (``max_dense_bytes.for_device``), not a quarter of host memory on every device."""
    import dataclasses

    from lazykern.ntk.plan import dense_blocks
    from lazykern.operators import DENSE_CACHE

    K, x = _tiny_ntk(8)
    DENSE_CACHE.clear()
    monkeypatch.setattr(settings, "_available_memory_bytes", lambda: 0)  # no host memory to spare
    monkeypatch.setattr(settings, "_free_cuda_bytes", lambda device: 2**40)  # a large GPU
    on_gpu = dataclasses.replace(K.plan, device=torch.device("cuda", 0))
    assert K.plan.device == x.device and dense_blocks(K.plan, 8, 8, True) == (8, True)
    assert dense_blocks(on_gpu, 8, 8, True) == (1, False)
    with torch.no_grad():
        K @ torch.ones(8, dtype=torch.float64)
    assert len(K.cache) == 0, "features kept beyond the CPU's budget"
