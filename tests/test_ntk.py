"""Empirical NTK: every layer rule, alone and in small networks, against a torch.func Jacobian contraction.

The reference contracts explicit per-sample Jacobians (``vmap(jacrev)`` over ``functional_call``),
written here from the definition, never through lazykern, in float64 to 1e-10. Every case runs in
both modes, for dense blocks, products (and transposed products), diagonals and gathered entries,
with every form a layer has (implicit and explicit: either convolution rule), on the torch engine;
products also through the network (``"linearized"``). KeOps runs once per formula family
(dot-product, token-pair and token-equality parts, trace and full mode) on one network, so the
test compiles four KeOps formulas.
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

import lazykern
from lazykern.ntk import NTKFallbackWarning, NTKKernel, NTKPlan, choose_backend, empirical_ntk
from lazykern.ntk.features import piece_terms
from lazykern.ntk.terms import Explicit, Implicit, Sparse, terms_numel

DT = torch.float64


# ----------------------------------------------------------------------------- reference
def jacobians(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``(N, k, P)`` Jacobians of the flattened outputs w.r.t. all trainable parameters."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}

    def f(p, xi):
        return functional_call(model, p, (xi.unsqueeze(0),)).reshape(-1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.func's batching fallbacks (attention) warn
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
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
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
class Attention(nn.Module):
    """nn.MultiheadAttention alone: sequence-first internally, a boolean mask and key padding."""

    def __init__(self, kdim: int | None = None) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(4, 2, kdim=kdim, vdim=kdim)
        self.kdim = kdim

    def forward(self, x):
        q = x.transpose(0, 1)  # (T, N, E)
        kv = q if self.kdim is None else q[..., : self.kdim]
        mask = torch.zeros(q.shape[0], q.shape[0], dtype=torch.bool)
        mask[0, -1] = True
        padding = torch.zeros(q.shape[1], q.shape[0], dtype=torch.bool)
        padding[:, 1] = True
        out, weights = self.att(q, kv, kv, attn_mask=mask, key_padding_mask=padding)
        return torch.cat([out.transpose(0, 1).flatten(1), weights.flatten(1)], dim=1)


class Encoder(nn.Module):
    """Token ids -> Embedding (padding index) -> Transformer encoder layer -> LayerNorm -> pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(9, 4, padding_idx=0)
        self.encoder = nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids):
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], dtype=torch.float64)
        h = self.encoder(self.embed(ids), src_mask=causal, is_causal=True)
        return self.head(self.norm(h).mean(1))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.block = nn.Linear(6, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        h = self.inp(x)
        return self.out(h + nn.functional.relu(self.block(torch.tanh(h)), inplace=True))


class TokenMixer(nn.Module):
    """Token-wise Linear on (batch, tokens, features) with a frozen weight, attention from nn.Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4, bias=False), nn.Linear(4, 4)
        self.v.weight.requires_grad_(False)  # frozen weight, trainable bias
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        att = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / 2.0, dim=-1)
        return self.head(torch.tanh(att @ self.v(x)).mean(1))


def _batchnorm(channels: int, dims: int) -> nn.Module:
    bn = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)[dims - 1](channels)
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    bn.weight.data.normal_()
    bn.bias.data.normal_()
    return bn.eval()


def _norm_affine(module: nn.Module) -> nn.Module:
    module.weight.data.normal_()
    module.bias.data.normal_()
    return module


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), _batchnorm(4, 2), nn.ReLU(inplace=True),
        nn.Conv2d(4, 4, 3, stride=2, groups=2), _norm_affine(nn.GroupNorm(2, 4)), nn.Tanh(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
    ).eval()


# name -> (factory, inputs(n)); a case's only trainable module is its layer ("alone") or a small network
def _floats(*shape):
    return lambda n: torch.randn(n, *shape, dtype=DT)


def _ids(t: int, vocab: int):
    return lambda n: torch.randint(0, vocab, (n, t))


CASES = {
    # each layer type alone
    "linear": (lambda: nn.Linear(4, 3), _floats(4)),
    "linear_tokens": (lambda: nn.Sequential(nn.Linear(4, 2), nn.Flatten()), _floats(3, 4)),
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(2, 3, 3, stride=2, padding=2, dilation=2, padding_mode="reflect"),
                                     nn.Flatten()), _floats(2, 7)),
    "conv2d": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2), nn.Flatten()), _floats(2, 5, 5)),
    "conv3d": (lambda: nn.Sequential(nn.Conv3d(1, 2, 2, padding="same", bias=False), nn.Flatten()), _floats(1, 3, 2, 3)),
    "layer_norm": (lambda: nn.Sequential(_norm_affine(nn.LayerNorm(4)), nn.Flatten()), _floats(3, 4)),
    "group_norm": (lambda: nn.Sequential(_norm_affine(nn.GroupNorm(2, 4)), nn.Flatten()), _floats(4, 3)),
    "batch_norm": (lambda: nn.Sequential(_batchnorm(3, 2), nn.Flatten()), _floats(3, 2, 2)),
    "embedding": (lambda: nn.Sequential(nn.Embedding(7, 3, padding_idx=0), nn.Flatten()), _ids(4, 7)),
    "attention": (Attention, _floats(3, 4)),
    "attention_kdim": (lambda: Attention(kdim=2), _floats(3, 4)),
    # inside small networks
    "residual_mlp": (Residual, _floats(4)),
    "token_mixer": (TokenMixer, _floats(5, 4)),
    "cnn": (_cnn, _floats(2, 6, 6)),
    "encoder": (Encoder, _ids(5, 9)),
    "conv1d_norm": (lambda: nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), _batchnorm(4, 1), nn.ReLU(),
                                          nn.Conv1d(4, 2, 2, dilation=2), nn.Flatten(), nn.LayerNorm(6), nn.Linear(6, 3)),
                    _floats(2, 5)),
    "conv3d_net": (lambda: nn.Sequential(nn.Conv3d(1, 2, 2), _batchnorm(2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(16, 3)),
                   _floats(1, 3, 3, 3)),
}


def build(name: str, n1: int = 5, n2: int = 4):
    factory, inputs = CASES[name]
    torch.manual_seed(1)
    model = factory().to(DT)
    return model, inputs(n1), inputs(n2)


def forms_of(model: nn.Module, x: torch.Tensor) -> list[str | None]:
    """Every global form override a case's layers accept, and the cost rule (None)."""
    plan = empirical_ntk(model, x, plan=True)
    return [None] + [f for f in ("implicit", "explicit") if any(f in p.forms and len(p.forms) > 1 for p in plan.pieces)]


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["full", "trace"])
def test_matches_jacobian_contraction(case: str, mode: str) -> None:
    model, x1, x2 = build(case)
    before = snapshot(model)
    expected = reference(model, x1, x2, mode)
    square = reference(model, x1, x1, mode)
    rhs = torch.randn(expected.shape[1], 3, dtype=DT)
    lhs = torch.randn(expected.shape[0], 2, dtype=DT)
    v = torch.randn(square.shape[0], dtype=DT)
    k = expected.shape[0] // x1.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", NTKFallbackWarning)  # every layer here has a rule
        for forms in forms_of(model, x1):
            K = empirical_ntk(model, x1, x2, mode=mode, backend="dense", forms=forms)
            assert_close(K.to_dense(), expected)
            assert_close(K @ rhs, expected @ rhs)
            assert_close(K.mT @ lhs, expected.T @ lhs)
            S = empirical_ntk(model, x1, mode=mode, backend="dense", forms=forms)
            assert_close(S.diagonal(), square.diagonal())
            assert_close(S @ v, square @ v)
            rows, cols = torch.tensor([0, 2 * k - 1, 3 * k]), torch.tensor([k, 0, 3 * k + k - 1])
            assert_close(S[rows, cols], square[rows, cols])
            # a test-by-train block, whole samples: evaluated from features of those samples only
            block = S[3 * k :, : 3 * k]
            assert_close(block.to_dense(), square[3 * k :, : 3 * k])
            assert_close(block @ rhs[: 3 * k], square[3 * k :, : 3 * k] @ rhs[: 3 * k])
        K = empirical_ntk(model, x1, x2, mode=mode, backend="linearized")
        assert_close(K @ rhs, expected @ rhs)
        assert_close(K.mT @ lhs, expected.T @ lhs)
        with lazykern.settings.chunk_bytes(1):  # one right-hand side (and one sample) at a time
            assert_close(K @ rhs, expected @ rhs)
    assert_unchanged(model, before)


@pytest.mark.parametrize("path", ["pairwise", "factored"])
@pytest.mark.parametrize("case", ["token_mixer", "conv2d", "embedding"])
def test_implicit_products_pairwise_and_factored(case: str, path: str, monkeypatch) -> None:
    """Products of implicit layers, forced through either path (the cost rule picks one per term)."""
    import lazykern.ntk.products as products

    cost = {"pairwise": 0.0, "factored": 1.0} if path == "pairwise" else {"pairwise": 1.0, "factored": 0.0}
    monkeypatch.setattr(products, "implicit_matmul_macs", lambda *args, **kwargs: dict(cost))
    model, x1, x2 = build(case)
    for mode in ("full", "trace"):
        expected = reference(model, x1, x2, mode)
        rhs = torch.randn(expected.shape[1], 3, dtype=DT)
        K = empirical_ntk(model, x1, x2, mode=mode, backend="dense", forms="implicit")
        assert_close(K @ rhs, expected @ rhs)


@pytest.mark.slow
def test_keops_products_per_formula_family() -> None:
    """KeOps reductions: token-equality (embedding), token-pair (convolution) and dot (dense) parts
    in trace mode, and the first-factor kernels of full-mode products; both forms' results agree."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # widths chosen so that the convolution and the head share padded sizes (16 columns of
            # first factor, 16 of cotangents, 4 of right-hand side): four distinct formulas in all,
            # the trace one of the head being backend="auto"'s KeOps probe
            self.embed = nn.Embedding(7, 4)
            self.conv = nn.Conv1d(4, 3, 3, padding=1)
            self.head = nn.Linear(12, 3)

        def forward(self, ids):
            return self.head(torch.tanh(self.conv(self.embed(ids).transpose(1, 2))).flatten(1))

    torch.manual_seed(2)
    model = Net().to(DT)
    x1, x2 = torch.randint(0, 7, (6, 4)), torch.randint(0, 7, (5, 4))
    for mode in ("trace", "full"):
        expected = reference(model, x1, x2, mode)
        rhs = torch.randn(expected.shape[1], 1, dtype=DT)
        K = empirical_ntk(model, x1, x2, mode=mode, backend="keops", forms="implicit")
        assert all(p.form == "implicit" for p in K.plan.pieces)
        assert_close(K @ rhs, expected @ rhs)


# ----------------------------------------------------------------------------- the plan
def test_plan_reports_what_is_computed() -> None:
    model, x1, x2 = build("encoder")
    plan = empirical_ntk(model, x1, x2, mode="trace", plan=True)
    assert isinstance(plan, NTKPlan)
    names = [p.name for p in plan.pieces]
    assert names == [
        "embed", "encoder.self_attn[q]", "encoder.self_attn[k]", "encoder.self_attn[v]", "encoder.self_attn[out]",
        "encoder.linear1", "encoder.linear2", "encoder.norm1", "encoder.norm2", "norm", "head",
    ]
    assert [p.rule for p in plan.pieces] == ["embedding"] + ["attention"] * 4 + ["linear"] * 2 + ["layer_norm"] * 3 + ["linear"]
    assert "embed" in str(plan) and "predicted MACs" in str(plan)
    for model, x in ((model, x1), build("cnn")[:2]):
        for forms in ("implicit", "explicit", None):
            op = empirical_ntk(model, x, mode="trace", forms=forms)
            computed = piece_terms(op.network, op.tensors, x)
            assert len(computed) == len(op.plan.pieces)
            for piece, terms in zip(op.plan.pieces, computed):
                assert terms_numel(terms) == piece.feature_numel(), piece.name
                kinds = {type(t) for t in terms}
                if piece.form == "implicit":
                    assert kinds == {Implicit}, piece.name
                else:
                    assert kinds <= {Explicit, Sparse}, piece.name
                if forms is not None and forms in piece.forms:
                    assert piece.form == forms


def test_convolution_cost_rule_direction() -> None:
    """Large maps with few channels go explicit, small maps with many channels implicit."""
    early = nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.Linear(8 * 26 * 26, 10))
    late = nn.Sequential(nn.Conv2d(64, 64, 3), nn.Flatten(), nn.Linear(64, 10))
    early_plan = empirical_ntk(early, torch.randn(64, 1, 28, 28), plan=True)
    late_plan = empirical_ntk(late, torch.randn(64, 64, 3, 3), plan=True)
    assert early_plan.pieces[0].form == "explicit"
    assert late_plan.pieces[0].form == "implicit"
    forced = empirical_ntk(early, torch.randn(64, 1, 28, 28), forms={"0": "implicit"}, plan=True)
    assert forced.pieces[0].form == "implicit" and forced.pieces[1].form == early_plan.pieces[1].form


def test_choose_backend_from_measured_rates() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    plan = empirical_ntk(model, torch.randn(4, 64), plan=True)
    cpu = torch.device("cpu")
    assert choose_backend(plan, 100_000, 100_000, 1, features_cached=False, device=cpu) == "linearized"
    assert choose_backend(plan, 64, 64, 1, features_cached=True, device=cpu) in ("dense", "keops")


# ----------------------------------------------------------------------------- gradients
def _smooth() -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 2)).to(DT)


@pytest.mark.parametrize("backend", ["dense", "linearized"])
def test_gradcheck_through_ntk_kernel(backend: str) -> None:
    model = _smooth()
    kernel = NTKKernel(model, backend=backend)
    x1 = torch.randn(3, 3, dtype=DT, requires_grad=True)
    x2 = torch.randn(2, 3, dtype=DT)
    assert torch.autograd.gradcheck(lambda a: kernel(a, x2).to_dense(), (x1,))
    assert torch.autograd.gradcheck(lambda a: kernel(a, x2) @ torch.ones(2, 2, dtype=DT), (x1,))
    assert torch.autograd.gradcheck(lambda a: kernel(a, diag=True), (x1,))
    assert torch.autograd.gradcheck(lambda a: kernel(a).to_dense(), (x1,))


def test_gradcheck_through_conv_rules_full_mode() -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv1d(1, 2, 2), nn.Tanh(), _norm_affine(nn.LayerNorm(2)), nn.Flatten(), nn.Linear(4, 2))
    model = model.to(DT)
    x1 = torch.randn(2, 1, 3, dtype=DT, requires_grad=True)
    x2 = torch.randn(2, 1, 3, dtype=DT)
    for forms in ("implicit", "explicit"):
        assert torch.autograd.gradcheck(lambda a: empirical_ntk(model, a, x2, forms=forms).to_dense(), (x1,))
        assert torch.autograd.gradcheck(lambda a: empirical_ntk(model, a, forms=forms).diagonal(), (x1,))


def test_batched_ntk_kernel() -> None:
    model = _smooth()
    x = torch.randn(2, 4, 3, dtype=DT)
    z = torch.randn(2, 3, 3, dtype=DT)
    K = NTKKernel(model)(x, z).to_dense()
    assert K.shape == (2, 4, 3)
    for b in range(2):
        assert_close(K[b], reference(model, x[b], z[b], "trace"))
    assert_close(NTKKernel(model)(x, diag=True)[1], reference(model, x[1], x[1], "trace").diagonal())


def test_batched_ntk_kernel_indexing_and_compositions() -> None:
    """A kernel's batch shape is what it returns, through indexing, expand_batch, ScaleKernel, sums
    and products; copies share the network (held by reference, never cloned)."""
    model = _smooth()
    x = torch.randn(4, 3, dtype=DT)
    K = reference(model, x, x, "trace")
    kernel = NTKKernel(model, batch_shape=torch.Size([2]))
    assert kernel(x).shape == (2, 4, 4) and kernel(x, diag=True).shape == (2, 4)
    assert_close(kernel(x).to_dense()[1], K)
    assert kernel[0].batch_shape == torch.Size([]) and kernel[0].model is model
    assert_close(kernel[0](x).to_dense(), K)
    wide = kernel.expand_batch(3, 2)
    assert wide.batch_shape == (3, 2) and wide(x).shape == (3, 2, 4, 4) and wide.model is model
    assert wide[1].batch_shape == (2,) and wide[:, 0].batch_shape == (3,)
    scaled = gpytorch.kernels.ScaleKernel(kernel, batch_shape=torch.Size([2])).to(DT)
    scaled.outputscale = torch.tensor([0.5, 2.0], dtype=DT)
    assert_close(scaled[1](x).to_dense(), 2.0 * K)
    rbf = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2])).to(DT)
    for combined, expected in ((kernel + rbf, K + rbf[0](x).to_dense()), (kernel * rbf, K * rbf[0](x).to_dense())):
        assert combined(x).shape == (2, 4, 4)
        assert combined[0].batch_shape == torch.Size([])
        assert_close(combined[0](x).to_dense(), expected)


def test_batched_ntk_kernel_in_batched_exact_gp() -> None:
    """A batched GP (two outputs, one network) trains one step and predicts as two unbatched GPs."""
    model = _smooth()
    before = snapshot(model)
    torch.manual_seed(6)
    x, xs = torch.randn(12, 3, dtype=DT), torch.randn(5, 3, dtype=DT)
    y = torch.stack([torch.sin(x.sum(-1)), torch.cos(x[:, 0])])

    class GP(gpytorch.models.ExactGP):
        def __init__(self, targets: torch.Tensor, batch_shape: torch.Size) -> None:
            super().__init__(x, targets, gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch_shape))
            self.mean = gpytorch.means.ConstantMean(batch_shape=batch_shape)
            self.covar = gpytorch.kernels.ScaleKernel(NTKKernel(model, batch_shape=batch_shape), batch_shape=batch_shape)

        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(self.mean(inputs), self.covar(inputs))

    def train_one_step(gp: GP) -> None:
        gp.train()
        optimizer = torch.optim.SGD(gp.parameters(), lr=0.1)
        loss = -gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)(gp(x), gp.train_targets).sum()
        loss.backward()
        optimizer.step()
        gp.eval()

    batched = GP(y, torch.Size([2])).to(DT)
    batched.likelihood.noise = torch.tensor([[0.05], [0.2]], dtype=DT)
    batched.covar.outputscale = torch.tensor([0.7, 1.3], dtype=DT)
    singles = []
    for b in range(2):
        single = GP(y[b], torch.Size([])).to(DT)
        single.likelihood.noise = batched.likelihood.noise[b]
        single.covar.outputscale = batched.covar.outputscale[b]
        singles.append(single)
    for gp in (batched, *singles):
        train_one_step(gp)
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        pred = batched.likelihood(batched(xs))
        for b, single in enumerate(singles):
            for name, value in single.named_parameters():
                assert_close(dict(batched.named_parameters())[name][b], value)
            alone = single.likelihood(single(xs))
            assert_close(pred.mean[b], alone.mean)
            assert_close(pred.covariance_matrix[b], alone.covariance_matrix)
    assert_unchanged(model, before)


def test_ntk_kernel_in_exact_gp_and_input_gradients() -> None:
    model = _smooth()
    before = snapshot(model)
    x = torch.randn(12, 3, dtype=DT)
    y = torch.sin(x.sum(-1))
    xs = torch.randn(4, 3, dtype=DT)

    class GP(gpytorch.models.ExactGP):
        def __init__(self) -> None:
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood().to(DT))
            self.mean = gpytorch.means.ZeroMean()
            self.covar = NTKKernel(model)

        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(self.mean(inputs), self.covar(inputs))

    gp = GP().to(DT)
    gp.likelihood.noise = 0.05
    noise = gp.likelihood.noise.detach()
    assert not any(p is q for p in gp.parameters() for q in model.parameters())
    gp.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        pred = gp(xs).mean
    K = reference(model, x, x, "trace")
    expected = reference(model, xs, x, "trace") @ torch.linalg.solve(K + noise * torch.eye(12, dtype=DT), y)
    assert torch.allclose(pred, expected, rtol=1e-7, atol=1e-9)
    # the gradient of the predictive mean with respect to the test inputs
    xs_grad = xs.clone().requires_grad_(True)
    with gpytorch.settings.fast_pred_var(False):
        gp(xs_grad).mean.sum().backward()
    weights = torch.linalg.solve(K + noise * torch.eye(12, dtype=DT), y)
    jac = torch.autograd.functional.jacobian(lambda a: reference(model, a, x, "trace") @ weights, xs)
    assert_close(xs_grad.grad, torch.einsum("ijk->jk", jac), rtol=1e-7)
    assert_unchanged(model, before)


# ----------------------------------------------------------------------------- operator use
@pytest.mark.parametrize("backend", ["dense", "linearized"])
def test_conjugate_gradient_solve(backend: str) -> None:
    model, x1, _ = build("residual_mlp", n1=7)
    dense = reference(model, x1, x1, "full")
    K = empirical_ntk(model, x1, mode="full", backend=backend)
    rhs = torch.randn(dense.shape[0], 4, dtype=DT)
    noise = torch.tensor(0.1, dtype=DT)
    # CG (max_cholesky_size 0) with the pivoted-Cholesky preconditioner, tolerance tightened
    with linear_operator.settings.max_cholesky_size(0), linear_operator.settings.cg_tolerance(1e-8):
        solution = K.add_diagonal(noise).solve(rhs)
        baseline = DenseLinearOperator(dense).add_diagonal(noise).solve(rhs)
    exact = torch.linalg.solve(dense + noise * torch.eye(dense.shape[0], dtype=DT), rhs)
    # linear_operator's CG stops near 1e-6 relative even on a DenseLinearOperator of the reference
    assert_close(baseline, exact, rtol=1e-4)
    assert_close(solution, exact, rtol=1e-4)


def test_outputs_per_input() -> None:
    """Rows and columns per sample, ``k`` in full mode: where the sharded operator may cut its row
    blocks (:func:`lazykern.distributed.operator.rows_per_input`), never through a sample's outputs."""
    from lazykern.distributed.operator import rows_per_input

    model, x1, _ = build("residual_mlp", n1=3)
    k = reference(model, x1[:1], x1[:1], "full").shape[0]
    full, trace = empirical_ntk(model, x1, mode="full"), empirical_ntk(model, x1, mode="trace")
    assert k > 1 and full.num_outputs_per_input == (k, k) and rows_per_input(full) == k
    assert trace.num_outputs_per_input == (1, 1) and rows_per_input(trace) == 1


def test_fallback_warning_names_module() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4, dtype=DT))

        def forward(self, x):
            return x * self.w

    model = nn.Sequential(nn.Linear(4, 4), Scale(), nn.Linear(4, 3)).to(DT)
    x = torch.randn(5, 4, dtype=DT)
    with pytest.warns(NTKFallbackWarning, match="'1'.*Scale.*MiB"):
        K = empirical_ntk(model, x)
    assert_close(K.to_dense(), reference(model, x, x, "full"))


def test_features_of_a_large_operator_are_not_kept_by_dense_blocks() -> None:
    """to_dense, the diagonal and entries use features transiently; only products cache them."""
    model, x1, _ = build("residual_mlp", n1=6)
    K = empirical_ntk(model, x1, backend="dense")
    K.to_dense(), K.diagonal(), K[torch.tensor([0, 1]), torch.tensor([2, 3])]
    assert len(K.cache) == 0
    K @ torch.ones(K.shape[-1], dtype=DT)
    assert len(K.cache) == 1


@pytest.mark.parametrize("case", ["cnn", "encoder"])
def test_dense_blocks_in_sample_tiles_match_and_differentiate(case: str, monkeypatch) -> None:
    """Tiles (forced here: 3 blocks per side) give the same block and input gradients as one pass."""
    import lazykern.ntk.operator as operator

    monkeypatch.setattr(operator, "dense_blocks", lambda *args: (3, True))
    model, x1, x2 = build(case, n1=7, n2=4)
    for mode in ("full", "trace"):
        for cols in (None, x2):  # the same samples (upper tiles, mirrored) and two sample sets
            expected = reference(model, x1, x1 if cols is None else cols, mode)
            assert_close(empirical_ntk(model, x1, cols, mode=mode, backend="dense").to_dense(), expected)
    if x1.is_floating_point():
        x = x1.clone().requires_grad_(True)
        weights = torch.randn(reference(model, x1, x1, "full").shape, dtype=DT)
        (empirical_ntk(model, x, mode="full").to_dense() * weights).sum().backward()
        xr = x1.clone().requires_grad_(True)
        (reference(model, xr, xr, "full") * weights).sum().backward()
        assert_close(x.grad, xr.grad)


@pytest.mark.parametrize("case", ["cnn", "encoder", "conv2d"])
def test_symmetric_block_in_row_blocks_matches(case: str, monkeypatch) -> None:
    """The block of one sample set fills its upper row blocks and mirrors them: the same as the
    reference with one row block per sample (forced here) and with the default floor of rows."""
    from lazykern.ntk import products

    assert [len(products._block_rows(n, r, True)) for n, r in ((5, 1), (128, 1), (1024, 1), (64, 10))] == [1, 2, 8, 8]
    assert len(products._block_rows(1024, 1, False)) == 1
    model, x1, _ = build(case, n1=7)
    for rows in (1, products.MIN_BLOCK_ROWS):
        monkeypatch.setattr(products, "MIN_BLOCK_ROWS", rows)
        for mode in ("full", "trace"):
            for forms in forms_of(model, x1):
                K = empirical_ntk(model, x1, mode=mode, backend="dense", forms=forms)
                assert_close(K.to_dense(), reference(model, x1, x1, mode))


@pytest.mark.parametrize("case", ["cnn", "encoder"])
def test_sample_batches_reuse_cotangent_buffers(case: str, monkeypatch) -> None:
    """Batches of 3, 3 and 1 samples share the stacked-cotangent buffers of their stream; every
    batch's features are used before the next batch overwrites them (the diagonal of two sample
    sets streams the second set inside the first's callback)."""
    from lazykern.ntk import features

    timing = features._BackwardTiming  # the plain backward passes, which stack into the buffers
    monkeypatch.setattr(features, "_BackwardTiming",
                        lambda: timing(len(features._TIMED_WAYS), {"loop": 0.0, "batched": 1.0}))
    monkeypatch.setattr(features.Network, "batch_size", lambda self, total, itemsize: 3)
    model, x1, x2 = build(case, n1=7, n2=7)
    for mode in ("full", "trace"):
        expected = reference(model, x1, x2, mode)
        K = empirical_ntk(model, x1, x2, mode=mode, backend="dense")
        assert_close(K.to_dense(), expected)
        assert_close(K.diagonal(), expected.diagonal())
        assert_close(K @ torch.ones(expected.shape[1], dtype=DT), expected.sum(1))


def test_backward_ways_are_timed_per_stream(monkeypatch) -> None:
    """Each operator call's extraction (a stream of 3 batches here) takes one way; the first streams
    take the ways in turn, each timed twice over its whole stream, and later streams take the faster."""
    from lazykern.ntk import features

    monkeypatch.setattr(features.Network, "batch_size", lambda self, total, itemsize: 3)
    model, x1, _ = build("cnn", n1=7)
    expected = reference(model, x1, x1, "trace")
    for _ in range(len(features._TIMED_WAYS) + 1):
        assert_close(empirical_ntk(model, x1, mode="trace", backend="dense").to_dense(), expected)
    (timing,) = features._BACKWARD_TIMING[model].values()
    assert timing.calls == len(features._TIMED_WAYS) + 1
    assert set(timing.seconds) == {"loop", "batched"}
    assert features._backward_way(timing, False) == min(timing.seconds, key=timing.seconds.get)
    assert features._backward_way(timing, True) == "loop"


def test_batch_floor_stops_below_the_fresh_allocation_size() -> None:
    """Raising a batch towards BATCH_SAMPLES stops where one captured output's stacked cotangents
    would pass FLOOR_TENSOR_BYTES (a 64-channel 26 x 26 map: 1.7 MB a sample in float32), not below
    the budget's own batch; many small captures still reach BATCH_SAMPLES."""
    from lazykern.ntk.features import BATCH_SAMPLES, FLOOR_TENSOR_BYTES, batch_bytes

    conv = nn.Sequential(nn.Conv2d(1, 64, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    net = empirical_ntk(conv, torch.randn(4, 1, 28, 28)).network
    size = net.batch_size(1024, 4)
    assert size * net.largest_numel * 4 <= FLOOR_TENSOR_BYTES < (size + 1) * net.largest_numel * 4
    assert batch_bytes() // (net.work_numel * 4) < size < BATCH_SAMPLES
    mlp = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 3))
    assert empirical_ntk(mlp, torch.randn(4, 8)).network.batch_size(1024, 4) >= BATCH_SAMPLES


def test_small_sets_run_in_one_batch() -> None:
    """A sample set whose whole extraction fits the raise's ceilings (four batch_bytes, and
    FLOOR_TENSOR_BYTES for one stacked cotangent) runs as one batch, the fewest operations; a
    larger set keeps the budget's batches, which bound its memory."""
    from lazykern.ntk.features import FLOOR_TENSOR_BYTES, batch_bytes

    cnn = nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    net = empirical_ntk(cnn, torch.randn(4, 3, 16, 16)).network
    whole = min(4 * batch_bytes() // (net.work_numel * 4), FLOOR_TENSOR_BYTES // (net.largest_numel * 4))
    assert whole >= 128
    assert net.batch_size(whole, 4) == whole
    assert net.batch_size(whole + 1, 4) == batch_bytes() // (net.work_numel * 4) < whole


def test_one_batch_keeps_its_own_tensors() -> None:
    """Features extracted in one batch are kept as formed (no copy), except views into larger
    storage, which are copied so they do not keep that storage alive."""
    from lazykern.ntk.terms import Explicit, write_terms

    owned, larger = torch.randn(4, 2, 6), torch.randn(4, 2, 6, 3)
    kept, copied = write_terms(None, slice(0, 4), [Explicit(owned), Explicit(larger[..., 1])], 4)
    assert kept.e is owned
    assert torch.equal(copied.e, larger[..., 1])
    assert copied.e.untyped_storage().nbytes() == copied.e.numel() * copied.e.element_size()
    first, = write_terms(None, slice(0, 2), [Explicit(owned[:2])], 4)  # the first of several batches
    assert first.e.shape == (4, 2, 6) and torch.equal(first.e[:2], owned[:2])


def test_tile_rule() -> None:
    """Tiles when features exceed a quarter of the block (forced beyond ``max_dense_bytes``), kept
    only when re-extracting the column blocks costs at most a tenth of the block's time."""
    from lazykern import settings
    from lazykern.ntk.plan import dense_blocks, tiles_pay_off

    model, x1, _ = build("cnn", n1=8)
    plan = empirical_ntk(model, x1, plan=True)
    assert dense_blocks(plan, 8, 8, True) == (1, False)
    with settings.max_dense_bytes(plan.feature_bytes(8) // 2):
        blocks, forced = dense_blocks(plan, 8, 8, True)
    assert forced and blocks >= 3  # two of three blocks held: 2/3 of the features
    cpu = torch.device("cpu")
    assert tiles_pay_off(plan, 8, 8, True, 4, 0.0, cpu)
    assert not tiles_pay_off(plan, 8, 8, True, 4, 1.0, cpu)


# ----------------------------------------------------------------------------- bad input
class Flaky(nn.Module):
    """Raises on its third forward call: the first two are the probes, the error hits extraction."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls >= 3:
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
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return nn.functional.linear(x, self.lin.weight)


class Mixing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x).mean(0, keepdim=True)


class Shared(nn.Module):
    """A Linear applied to a learned constant: its output has no sample axis."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.query = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x[:, :3] * self.lin(self.query)


def _tied() -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    net[2].weight = net[0].weight
    return net.to(DT)


def _frozen() -> nn.Module:
    net = nn.Linear(4, 3).to(DT)
    net.requires_grad_(False)
    return net


X = torch.randn(6, 4, dtype=DT)
IDS = torch.randint(0, 5, (6, 3))
BAD = [
    ("no trainable", _frozen, (X,), {}, ValueError, "no trainable parameters"),
    ("dtype", lambda: nn.Linear(4, 3), (X,), {}, TypeError, "dtype"),
    ("x1 type", lambda: nn.Linear(4, 3).to(DT), (X.numpy(),), {}, TypeError, "x1 must be a torch.Tensor"),
    ("x2 dtype", lambda: nn.Linear(4, 3).to(DT), (X, X.float()), {}, TypeError, "same dtype"),
    ("features", lambda: nn.Linear(5, 3).to(DT), (X,), {}, ValueError, "cannot be applied"),
    ("float ids", lambda: nn.Embedding(5, 3).to(DT), (X,), {}, ValueError, "cannot be applied"),
    ("x2 shape", lambda: nn.Linear(4, 3).to(DT), (X, torch.randn(3, 5, dtype=DT)), {}, ValueError, "sample shape"),
    ("batch", lambda: Mixing().to(DT), (X,), {}, ValueError, "one row per sample"),
    ("no sample axis", lambda: Shared().to(DT), (X,), {}, ValueError, "one axis that indexes samples"),
    ("nan", lambda: nn.Linear(4, 3).to(DT), (X.clone().fill_(float("nan")),), {}, ValueError, "x1 contains NaN"),
    ("empty", lambda: nn.Linear(4, 3).to(DT), (X[:0],), {}, ValueError, "x1 must not be empty"),
    ("mode", lambda: nn.Linear(4, 3).to(DT), (X,), {"mode": "diag"}, ValueError, "mode must be one of"),
    ("backend", lambda: nn.Linear(4, 3).to(DT), (X,), {"backend": "jax"}, ValueError, "backend must be one of"),
    ("forms", lambda: nn.Linear(4, 3).to(DT), (X,), {"forms": "sparse"}, ValueError, "forms must be one of"),
    ("forms name", lambda: nn.Linear(4, 3).to(DT), (X,), {"forms": {"conv": "implicit"}}, ValueError, "'conv'"),
    ("forms layer", lambda: nn.LayerNorm(4).to(DT), (X,), {"forms": {"": "implicit"}}, ValueError, "has forms"),
    ("not a module", lambda: (lambda x: x), (X,), {}, TypeError, "torch.nn.Module"),
    ("tied", _tied, (X,), {}, ValueError, "ties"),
    ("reused module", lambda: Twice().to(DT), (X,), {}, ValueError, "ran twice"),
    ("functional", lambda: Functional().to(DT), (X,), {}, ValueError, "used functionally"),
    ("batchnorm", lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(DT), (X,), {}, ValueError, "BatchNorm1d"),
    ("batch stats", lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, track_running_stats=False)).to(DT).eval(),
     (X,), {}, ValueError, "track_running_stats"),
    ("dropout", lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)).to(DT), (X,), {}, ValueError, "Dropout"),
    ("attention dropout", lambda: nn.TransformerEncoderLayer(4, 2, 4, dropout=0.0).to(DT).train(),
     (torch.randn(6, 2, 4, dtype=DT),), {}, ValueError, "MultiheadAttention"),
    ("max_norm", lambda: nn.Embedding(5, 3, max_norm=1.0).to(DT), (IDS,), {}, ValueError, "max_norm"),
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
        K @ torch.ones(X.shape[0] * 3, dtype=DT)
    assert_unchanged(model, before)



def test_auto_backend_probes_leave_the_global_random_stream_alone(monkeypatch) -> None:
    """The throughput probe of the first ``backend="auto"`` product called ``torch.manual_seed(0)``:
    every seed a user had set then gave the same random stream."""
    from lazykern.ntk import throughput

    monkeypatch.setattr(throughput, "_cache", {})  # as in a fresh process: the probes run again
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x, v = torch.randn(40, 3, dtype=DT), torch.randn(80, 1, dtype=DT)
    torch.manual_seed(1234)
    expected = torch.rand(5)
    torch.manual_seed(1234)
    empirical_ntk(model, x, backend="auto") @ v
    assert throughput._cache, "the probes did not run"
    assert torch.equal(torch.rand(5), expected)
