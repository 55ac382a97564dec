"""Empirical NTK: every backend against a torch.func Jacobian contraction, in float64.

The reference contracts explicit per-sample Jacobians (``vmap(jacrev)`` over ``functional_call``),
written here from the definition, never through lazykern. Widths are shared across architectures
(inputs 4, hidden 6, outputs 3) so that the KeOps reductions compile only a handful of formulas.
"""

from __future__ import annotations

import warnings

import gpytorch
import linear_operator
import pytest
import torch
from linear_operator.operators import DenseLinearOperator
from torch import nn
from torch.func import functional_call, jacrev, vmap

from lazykern.ntk import BACKENDS, NTKFallbackWarning, NTKKernel, choose_backend, empirical_ntk

DT = torch.float64
K_OUT = 3
PAIRWISE = ("keops", "dense", "linearized")


# ----------------------------------------------------------------------------- reference
def jacobians(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``(N, k, P)`` Jacobians of the flattened outputs w.r.t. all trainable parameters."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def f(p, xi):
        return functional_call(model, p, (xi.unsqueeze(0),)).reshape(-1)

    jac = vmap(jacrev(f), in_dims=(None, 0))(params, x)
    return torch.cat([j.reshape(x.shape[0], j.shape[1], -1) for j in jac.values()], dim=-1)


def reference(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor, mode: str) -> torch.Tensor:
    j1, j2 = jacobians(model, x1), jacobians(model, x2)
    full = torch.einsum("iop,jqp->iojq", j1, j2)
    if mode == "trace":
        return torch.einsum("iojo->ij", full)
    n1, k, n2, _ = full.shape
    return full.reshape(n1 * k, n2 * k)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-10) -> None:
    err = (actual - expected).abs().max() / expected.abs().max()
    assert err < rtol, f"relative error {err:.3e}"


# ----------------------------------------------------------------------------- model state
def snapshot(model: nn.Module) -> dict:
    return {
        "state": {n: t.detach().clone() for n, t in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "hooks": [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks), len(m._backward_pre_hooks))
            for m in model.modules()
        ],
    }


def assert_unchanged(model: nn.Module, before: dict) -> None:
    after = snapshot(model)
    assert after["training"] == before["training"]
    assert after["requires_grad"] == before["requires_grad"]
    assert all(g is None for g in after["grads"])
    assert after["hooks"] == before["hooks"]
    assert after["state"].keys() == before["state"].keys()
    for name, t in before["state"].items():
        assert torch.equal(after["state"][name], t), name


# ----------------------------------------------------------------------------- architectures
class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.block = nn.Linear(6, 6)
        self.out = nn.Linear(6, K_OUT)

    def forward(self, x):
        h = self.inp(x)
        return self.out(h + nn.functional.relu(self.block(torch.tanh(h)), inplace=True))


class Tokens(nn.Module):
    """A token-wise Linear on (batch, tokens, features), pooled, then a dense head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.mix = nn.Linear(6, 6, bias=False)
        self.head = nn.Linear(6, K_OUT)

    def forward(self, x):
        h = nn.functional.gelu(self.embed(x))
        return self.head(torch.tanh(self.mix(h)).mean(1))


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, K_OUT)

    def forward(self, x):
        return self.head(self.norm(torch.relu(self.conv(x)).flatten(1)))


def _mlp_biasless() -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, 6, bias=False), nn.ReLU(), nn.Linear(6, 6, bias=False), nn.Linear(6, K_OUT, bias=False)
    )


def _mlp_activations() -> nn.Module:
    net = nn.Sequential(
        nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 6), nn.GELU(), nn.Dropout(0.5), nn.Linear(6, K_OUT), nn.ReLU()
    )
    net[2].weight.requires_grad_(False)  # frozen weight, trainable bias: excluded from the NTK
    return net.eval()


ARCHS = {
    "mlp_biasless": (_mlp_biasless, (4,)),
    "mlp_activations_frozen": (_mlp_activations, (4,)),
    "residual": (Residual, (4,)),
    "tokens": (Tokens, (5, 4)),
    "conv_fallback": (Conv, (1, 4, 4)),
}


def build(name: str):
    factory, sample = ARCHS[name]
    torch.manual_seed(1)
    model = factory().to(DT)
    x1 = torch.randn(7, *sample, dtype=DT)
    x2 = torch.randn(5, *sample, dtype=DT)
    return model, x1, x2


def ntk(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NTKFallbackWarning)
        return empirical_ntk(model, *args, **kwargs)


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mode", ["full", "trace"])
def test_matches_jacobian_contraction(arch: str, mode: str) -> None:
    model, x1, x2 = build(arch)
    before = snapshot(model)
    expected = reference(model, x1, x2, mode)
    rhs = torch.randn(expected.shape[1], 4, dtype=DT)
    for backend in BACKENDS:
        K = ntk(model, x1, x2, mode=mode, backend=backend)
        assert K.shape == expected.shape
        assert_close(K.to_dense(), expected)
        assert_close(K @ rhs, expected @ rhs)
        lhs = torch.randn(expected.shape[0], 4, dtype=DT)
        assert_close(K.mT @ lhs, expected.T @ lhs)
    assert_unchanged(model, before)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mode", ["full", "trace"])
def test_diagonal_and_vector_products(arch: str, mode: str) -> None:
    model, x1, _ = build(arch)
    before = snapshot(model)
    expected = reference(model, x1, x1, mode)
    v = torch.randn(expected.shape[0], dtype=DT)
    for backend in ("dense", "linearized"):
        K = ntk(model, x1, mode=mode, backend=backend)
        assert_close(K.diagonal(), expected.diagonal())
        assert_close(K @ v, expected @ v)
    assert_unchanged(model, before)


# ----------------------------------------------------------------------------- operator use
@pytest.mark.parametrize("mode", ["full", "trace"])
def test_test_train_blocks(mode: str) -> None:
    model, x1, _ = build("residual")
    expected = reference(model, x1, x1, mode)
    k = K_OUT if mode == "full" else 1
    K = ntk(model, x1, mode=mode, backend="dense")
    block = K[: 3 * k, 3 * k :]
    assert block.shape == (3 * k, 4 * k)
    assert_close(block.to_dense(), expected[: 3 * k, 3 * k :])
    rhs = torch.randn(4 * k, 2, dtype=DT)
    assert_close(block @ rhs, expected[: 3 * k, 3 * k :] @ rhs)
    rows = torch.tensor([5, 0, 2])
    idx = (rows[:, None] * k + torch.arange(k)).reshape(-1)
    assert_close(K[idx, :].to_dense(), expected[idx, :])
    # indices that cut through a sample's outputs fall back to linear_operator's interpolation
    assert_close(K[1:4, 2:9].to_dense(), expected[1:4, 2:9])
    assert_close(K[torch.tensor([1, 4]), torch.tensor([2, 3])], expected[[1, 4], [2, 3]])


@pytest.mark.parametrize("backend", PAIRWISE)
def test_conjugate_gradient_solve(backend: str) -> None:
    model, x1, _ = build("mlp_activations_frozen")
    dense = reference(model, x1, x1, "full")
    K = ntk(model, x1, mode="full", backend=backend)
    rhs = torch.randn(x1.shape[0] * K_OUT, 4, dtype=DT)
    noise = torch.tensor(0.1, dtype=DT)
    with linear_operator.settings.max_cholesky_size(0):  # force CG with the pivoted-Cholesky preconditioner
        solution = K.add_diagonal(noise).solve(rhs)
        baseline = DenseLinearOperator(dense).add_diagonal(noise).solve(rhs)
    exact = torch.linalg.solve(dense + noise * torch.eye(dense.shape[0], dtype=DT), rhs)
    # linear_operator's CG stops near 1e-5 relative here even on a DenseLinearOperator of the
    # reference matrix; the NTK operator must do as well as that.
    assert_close(baseline, exact, rtol=1e-3)
    assert_close(solution, exact, rtol=1e-3)


def test_ntk_kernel_in_exact_gp() -> None:
    model, x1, x2 = build("mlp_activations_frozen")
    before = snapshot(model)
    y = torch.sin(x1.sum(-1))

    class GP(gpytorch.models.ExactGP):
        def __init__(self) -> None:
            likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
            super().__init__(x1, y, likelihood)
            self.mean = gpytorch.means.ZeroMean()
            self.covar = NTKKernel(model)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))

    gp = GP().to(DT)
    gp.likelihood.noise = 0.05
    assert not any(p is q for p in gp.parameters() for q in model.parameters())
    gp.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        pred = gp(x2).mean
    K = reference(model, x1, x1, "trace")
    Ks = reference(model, x2, x1, "trace")
    noise = gp.likelihood.noise.detach()
    expected = Ks @ torch.linalg.solve(K + noise * torch.eye(x1.shape[0], dtype=DT), y)
    assert torch.allclose(pred, expected, rtol=1e-7, atol=1e-9)
    diag = NTKKernel(model)(x2, diag=True)
    assert_close(diag, reference(model, x2, x2, "trace").diagonal())
    assert_unchanged(model, before)


def test_choose_backend_rule() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    info = empirical_ntk(model, torch.randn(4, 64)).plan.info
    assert choose_backend(info, 100_000, 100_000, 1, "full", features_cached=False) == "linearized"
    assert choose_backend(info, 64, 64, 1, "full", features_cached=True) in ("dense", "keops")


def test_fallback_warning_names_module() -> None:
    model, x1, _ = build("conv_fallback")
    with pytest.warns(NTKFallbackWarning, match="'conv'.*MiB"):
        empirical_ntk(model, x1)


# ----------------------------------------------------------------------------- bad input
class Flaky(nn.Module):
    """Raises on its third forward call: the first is the probe, the error hits feature extraction."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, K_OUT)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls >= 2:
            raise RuntimeError("boom")
        return self.lin(x)


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.lin(x))


class Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, K_OUT)

    def forward(self, x):
        return nn.functional.linear(x, self.lin.weight)


class Mixing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, K_OUT)

    def forward(self, x):
        return self.lin(x).mean(0, keepdim=True)


def _tied() -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    net[2].weight = net[0].weight
    return net.to(DT)


def _frozen() -> nn.Module:
    net = nn.Linear(4, K_OUT).to(DT)
    net.requires_grad_(False)
    return net


X = torch.randn(6, 4, dtype=DT)
BAD = [
    ("no trainable", _frozen, (X,), {}, ValueError, "no trainable parameters"),
    ("dtype", lambda: nn.Linear(4, K_OUT), (X,), {}, TypeError, "dtype"),
    ("x2 dtype", lambda: nn.Linear(4, K_OUT).to(DT), (X, X.float()), {}, TypeError, "same dtype"),
    ("features", lambda: nn.Linear(5, K_OUT).to(DT), (X,), {}, ValueError, "cannot be applied"),
    ("x2 shape", lambda: nn.Linear(4, K_OUT).to(DT), (X, torch.randn(3, 5, dtype=DT)), {}, ValueError, "sample shape"),
    ("batch", lambda: Mixing().to(DT), (X,), {}, ValueError, "one row per sample"),
    ("nan", lambda: nn.Linear(4, K_OUT).to(DT), (X.clone().fill_(float("nan")),), {}, ValueError, "x1 contains NaN"),
    ("mode", lambda: nn.Linear(4, K_OUT).to(DT), (X,), {"mode": "diag"}, ValueError, "mode must be one of"),
    ("backend", lambda: nn.Linear(4, K_OUT).to(DT), (X,), {"backend": "jax"}, ValueError, "backend must be one of"),
    ("not a module", lambda: (lambda x: x), (X,), {}, TypeError, "torch.nn.Module"),
    ("tied", _tied, (X,), {}, ValueError, "ties"),
    ("reused module", lambda: Twice().to(DT), (X,), {}, ValueError, "ran twice"),
    ("functional", lambda: Functional().to(DT), (X,), {}, ValueError, "used functionally"),
    ("batchnorm", lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(DT), (X,), {}, ValueError, "BatchNorm1d"),
    ("dropout", lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)).to(DT), (X,), {}, ValueError, "Dropout"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_refused_and_model_unchanged(case) -> None:
    _, factory, args, kwargs, error, match = case
    model = factory()
    before = snapshot(model) if isinstance(model, nn.Module) else None
    with pytest.raises(error, match=match):
        empirical_ntk(model, *args, **kwargs)
    if before is not None:
        assert_unchanged(model, before)


def test_error_midway_leaves_model_unchanged() -> None:
    model = Flaky().to(DT)
    before = snapshot(model)
    K = empirical_ntk(model, X, backend="dense")
    with pytest.raises(RuntimeError, match="boom"):
        K @ torch.ones(X.shape[0] * K_OUT, dtype=DT)
    assert_unchanged(model, before)
