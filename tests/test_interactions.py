"""Interaction kernels against dense references from their definitions: values and gradients,
every engine (KeOps, torch, lazykern's CPU engine), float64.

KeOps compile budget: every KeOps test here uses D = 20 features, max_degree 3 and right-hand
sides of 9 columns (padded to 16), float64 -- the same formulas as the CG training step of
``tests/test_interactions_memory.py`` -- so the two files share their compiled reductions. The
combinatorics (other orders, batches, other bases, cross matrices) run on the torch engine.
"""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch

import lazykern
from lazykern import settings
from lazykern.formulas.interactions import elementary_symmetric

from . import reference_interactions as ref
from .test_kernels import assert_close

D = 20
R = 3
N, M = 23, 17
RHS = 9  # 1 + 8 probe vectors, as in the CG step of the memory test
GROUPS = ((0, 1), (1, 2, 3), (4,), tuple(range(5, 20)))
KINDS = ["newton-girard", "orthogonal", "group"]


def _lengthscale(shape) -> torch.Tensor:
    return torch.linspace(0.6, 1.7, shape[-1], dtype=torch.float64).expand(shape)


def make(kind: str, max_degree: int = R, batch_shape=torch.Size(), base: gpytorch.kernels.Kernel | None = None):
    if kind == "newton-girard":
        base = base if base is not None else lazykern.RBFKernel(ard_num_dims=D, batch_shape=batch_shape).double()
        base.lengthscale = _lengthscale(base.raw_lengthscale.shape)
        kernel = lazykern.kernels.NewtonGirardAdditiveKernel(base, D, max_degree, component_scales=True).double()
        kernel.component_scales = torch.linspace(0.5, 2.0, D, dtype=torch.float64).expand_as(kernel.component_scales)
    elif kind == "orthogonal":
        kernel = lazykern.kernels.OrthogonalAdditiveKernel(D, max_degree, batch_shape=batch_shape).double()
        # Buffers set in float64 (a float32 0.2 would differ from the reference's by 3e-9).
        kernel.measure_mean = torch.full((1, D), 0.2, dtype=torch.float64)
        kernel.measure_std = torch.linspace(0.7, 1.2, D, dtype=torch.float64).reshape(1, D)
        kernel.base_kernel.lengthscale = _lengthscale(kernel.base_kernel.raw_lengthscale.shape)
    else:
        base = lazykern.RBFKernel(ard_num_dims=D, batch_shape=batch_shape).double()
        base.lengthscale = _lengthscale(base.raw_lengthscale.shape)
        kernel = lazykern.kernels.GroupAdditiveKernel(base, GROUPS, num_dims=D, component_scales=True).double()
        kernel.component_scales = torch.linspace(0.7, 1.3, len(GROUPS), dtype=torch.float64).expand_as(
            kernel.component_scales)
        return kernel
    shape = kernel.raw_outputscale.shape
    kernel.outputscale = torch.linspace(0.3, 0.9, shape[-1], dtype=torch.float64).expand(shape)
    return kernel


def reference_of(kernel, x1, x2, diag=False):
    if isinstance(kernel, lazykern.kernels.GroupAdditiveKernel):
        return ref.group("rbf", x1, x2, kernel.base_kernel.lengthscale, kernel.groups, kernel.component_scales,
                         diag=diag)
    if isinstance(kernel, lazykern.kernels.OrthogonalAdditiveKernel):
        z = ref.orthogonal_rbf(x1, x2, kernel.base_kernel.lengthscale, kernel.measure_mean, kernel.measure_std,
                               diag=diag, normalized=True)
        scales = None
    else:
        base = kernel.base_kernel
        family = "matern" if isinstance(base, gpytorch.kernels.MaternKernel) else "rbf"
        z = ref.per_dimension(family, x1, x2, base.lengthscale, nu=getattr(base, "nu", None), diag=diag)
        scales = kernel.component_scales
    return ref.orders(z, kernel.outputscale, scales, kernel.max_degree, diag=diag)


def _grads(out, weights, tensors):
    return torch.autograd.grad((out * weights).sum(), tensors)


def _check_matvec(kernel, x1, x2, rhs, engine):
    weights = torch.randn(x1.shape[:-1] + rhs.shape[-1:], dtype=torch.float64)
    tensors = [x1, *([rhs] if rhs.requires_grad else []), *kernel.parameters()] + ([x2] if x2 is not x1 else [])
    with settings.engine(engine), settings.max_dense_bytes(0):
        out = kernel(x1, x2) @ rhs
        grads = _grads(out, weights, tensors)
    expected = reference_of(kernel, x1, x2) @ rhs
    assert_close(out, expected)
    for g, e in zip(grads, _grads(expected, weights, tensors)):
        assert_close(g, e)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torch", "keops", "cpu"])
@pytest.mark.parametrize("kind", KINDS)
def test_symmetric_matvec_values_and_gradients(kind, engine):
    """K(X, X) @ V and the gradients for X, V and every hyperparameter (order variances included).
    On KeOps V takes no gradient, as in GP training (probe vectors): each gradient KeOps derives is
    a compile of its own, up to a minute for OAK's formula."""
    kernel = make(kind)
    x = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    rhs = torch.randn(N, RHS, dtype=torch.float64, requires_grad=engine != "keops")
    _check_matvec(kernel, x, x, rhs, engine)


@pytest.mark.parametrize("max_degree", [1, 2, 4])
@pytest.mark.parametrize("kind", ["newton-girard", "orthogonal"])
def test_cross_matvec_every_order_torch_engine(kind, max_degree):
    kernel = make(kind, max_degree)
    x1 = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(M, D, dtype=torch.float64, requires_grad=True)
    _check_matvec(kernel, x1, x2, torch.randn(M, 2, dtype=torch.float64, requires_grad=True), "torch")


def test_all_orders_small_d_torch_engine():
    """max_degree = D on a small D, where every order's subsets are enumerated."""
    base = lazykern.RBFKernel(ard_num_dims=5).double()
    base.lengthscale = _lengthscale(base.raw_lengthscale.shape)
    kernel = lazykern.kernels.NewtonGirardAdditiveKernel(base, 5, component_scales=True).double()
    kernel.outputscale = torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0], dtype=torch.float64)
    kernel.component_scales = torch.linspace(0.5, 1.5, 5, dtype=torch.float64)
    x1 = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(M, 5, dtype=torch.float64, requires_grad=True)
    rhs = torch.randn(M, 2, dtype=torch.float64)
    weights = torch.randn(N, 2, dtype=torch.float64)
    tensors = [x1, x2, *kernel.parameters()]
    with settings.engine("torch"):
        out = kernel(x1, x2) @ rhs
    z = ref.per_dimension("rbf", x1, x2, base.lengthscale)
    expected = ref.orders(z, kernel.outputscale, kernel.component_scales, 5) @ rhs
    assert_close(out, expected)
    for g, e in zip(_grads(out, weights, tensors), _grads(expected, weights, tensors)):
        assert_close(g, e)


@pytest.mark.parametrize("engine", ["torch", "cpu"])
def test_top_order_alone_is_the_ard_rbf_kernel(engine):
    """max_degree = D, every order variance zero but the top one (1): the ARD RBF kernel."""
    kernel = make("newton-girard", max_degree=D)
    kernel.component_scales = torch.ones(1, D, dtype=torch.float64)
    kernel.outputscale = torch.cat([torch.zeros(D - 1), torch.ones(1)]).double()
    ard = lazykern.RBFKernel(ard_num_dims=D).double()
    ard.lengthscale = kernel.base_kernel.lengthscale
    x = torch.randn(N, D, dtype=torch.float64)
    rhs = torch.randn(N, RHS, dtype=torch.float64)
    with settings.engine(engine), settings.max_dense_bytes(0), torch.no_grad():
        assert_close(kernel(x) @ rhs, ard(x) @ rhs)


@pytest.mark.parametrize("kind", KINDS)
def test_diag_and_dense(kind):
    kernel = make(kind)
    x1 = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(N, D, dtype=torch.float64)
    diag = kernel(x1, x2, diag=True)
    expected = reference_of(kernel, x1, x2, diag=True)
    assert diag.shape == (N,)
    assert_close(diag, expected)
    w = torch.randn(N, dtype=torch.float64)
    params = list(kernel.parameters())
    for g, e in zip(_grads(diag, w, [x1, *params]), _grads(expected, w, [x1, *params])):
        assert_close(g, e)
    assert_close(kernel(x1, x2).to_dense(), reference_of(kernel, x1, x2))


@pytest.mark.parametrize("kind", KINDS)
def test_batch_shape_torch_engine(kind):
    kernel = make(kind, batch_shape=torch.Size([2]))
    x1 = torch.randn(2, N, D, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(2, M, D, dtype=torch.float64)
    rhs = torch.randn(2, M, 2, dtype=torch.float64)
    with settings.engine("torch"), settings.max_dense_bytes(0):
        op = kernel(x1, x2)
        assert op.shape == (2, N, M)
        out = op @ rhs
    if kind == "orthogonal":  # the quadrature reference is non-batch: one batch member at a time
        expected = torch.stack([reference_of(_member(kernel, b), x1[b], x2[b]) @ rhs[b] for b in range(2)])
    else:
        expected = reference_of(kernel, x1, x2) @ rhs
    assert_close(out, expected)


def _member(kernel, b):
    member = make("orthogonal", kernel.max_degree)
    member.base_kernel.lengthscale = kernel.base_kernel.lengthscale[b]
    member.outputscale = kernel.outputscale[b]
    return member


def test_other_bases_and_gpytorch_kernels_train():
    base = gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=D).double()
    kernel = make("newton-girard", base=base)
    x = torch.randn(N, D, dtype=torch.float64)
    with settings.engine("torch"):
        (kernel(x) @ torch.ones(N, 1, dtype=torch.float64)).sum().backward()
    assert base.raw_lengthscale.grad is not None and base.raw_lengthscale.grad.abs().sum() > 0
    z = ref.per_dimension("matern", x, x, base.lengthscale, nu=2.5)
    assert_close(kernel(x).to_dense(), ref.orders(z, kernel.outputscale, kernel.component_scales, R))


def test_active_dims_select_columns():
    base = lazykern.RBFKernel(ard_num_dims=3).double()
    kernel = lazykern.kernels.NewtonGirardAdditiveKernel(base, 3, 2, active_dims=(0, 2, 4)).double()
    x = torch.randn(N, 5, dtype=torch.float64)
    cols = x[:, [0, 2, 4]]
    z = ref.per_dimension("rbf", cols, cols, base.lengthscale)
    assert_close(kernel(x).to_dense(), ref.orders(z, kernel.outputscale, None, 2))


def test_orthogonal_components_integrate_to_zero():
    """The defining property: each one-dimensional term integrates to zero under the measure."""
    kernel = make("orthogonal", max_degree=1)
    mean, std = kernel.measure_mean[0, 0].item(), kernel.measure_std[0, 0].item()
    t, w = torch.tensor(np.stack(np.polynomial.hermite.hermgauss(200)), dtype=torch.float64)
    nodes = mean + 2**0.5 * std * t
    x = torch.zeros(len(t), D, dtype=torch.float64)
    x[:, 0] = nodes
    y = torch.randn(5, D, dtype=torch.float64)
    from lazykern.formulas.interactions import orthogonal_rbf_features, orthogonal_rbf_terms

    f = lambda v: orthogonal_rbf_features(v, kernel.base_kernel.lengthscale, kernel.measure_mean,  # noqa: E731
                                          kernel.measure_std)
    terms = orthogonal_rbf_terms(f(x)[:, None], f(y)[None])[..., 0]  # (nodes, 5): dimension 0 only
    integral = (terms * w[:, None]).sum(0) / torch.pi**0.5
    assert integral.abs().max() < 1e-12


def test_orthogonal_terms_stay_finite_far_out_at_short_lengthscales():
    """Standardized inputs of 10 and more at a lengthscale of 0.2 (met training OAK on UCI pol): a a'
    underflows while exp(s) overflows; the terms must still equal the definition k - m m' / v."""
    from lazykern.formulas.interactions import orthogonal_rbf_features, orthogonal_rbf_terms

    ls, mean, std = (torch.tensor([[v]], dtype=torch.float64) for v in (0.2, 0.0, 1.0))
    x = torch.tensor([[-13.5], [-2.0], [0.0], [0.3], [11.2], [13.5]], dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        f = orthogonal_rbf_features(x.to(dtype), ls.to(dtype), mean.to(dtype), std.to(dtype))
        terms = orthogonal_rbf_terms(f[:, None], f[None])[..., 0]
        assert torch.isfinite(terms).all()
        # k(x, y) - m(x) m(y) / v for the RBF kernel and N(mean, std^2), in closed form
        beta = (std / ls) ** 2
        u = (x - mean) / ls
        k = torch.exp(-0.5 * (u - u.T) ** 2)
        m = torch.exp(-0.5 * u**2 / (1 + beta)) / torch.sqrt(1 + beta)
        v = 1 / torch.sqrt(1 + 2 * beta)
        expected = k - m * m.T / v
        # float32: at u = 67 the exponents log a + log a' + s are sums of terms of size c u^2 = 4500
        # that cancel, so their rounding (eps * 4500 = 3e-4) is what float32 can give there.
        tol = 1e-12 if dtype == torch.float64 else 1e-3
        assert (terms.double() - expected).abs().max() < tol


def test_orthogonal_terms_at_collapsed_and_boundary_lengthscales():
    """A lengthscale of 1e-5 (beta = 1e10, reached training OAK on UCI bike in float32): the short-
    lengthscale form keeps float32 at its own precision, where u u' - g - g' cancelled numbers of
    size 1e10 (errors of order 1); float32 keeps the error of rounding u = (x - mu) / l itself,
    eps * |u| = 1e-3 at |u| = 2e4, as any kernel of scaled inputs does. At beta = 1 -+ 1e-3 the
    two forms meet (float64, 1e-12)."""
    from lazykern.formulas.interactions import orthogonal_rbf_features, orthogonal_rbf_terms

    x = torch.tensor([[-2.1], [-0.4], [0.0], [0.3], [0.30001], [1.7]], dtype=torch.float64)
    mean, std = torch.tensor([[0.1]], dtype=torch.float64), torch.tensor([[0.9]], dtype=torch.float64)
    cases = [(1e-5, torch.float32, 2e-3), (0.9 / (1 - 1e-3) ** 0.5, torch.float64, 1e-12),
             (0.9 / (1 + 1e-3) ** 0.5, torch.float64, 1e-12), (1e-5, torch.float64, 1e-12)]
    for length, dtype, tol in cases:
        ls = torch.tensor([[length]], dtype=torch.float64)
        f = orthogonal_rbf_features(x.to(dtype), ls.to(dtype), mean.to(dtype), std.to(dtype))
        terms = orthogonal_rbf_terms(f[:, None], f[None])[..., 0].double()
        xr, ls = x.to(dtype).double(), ls.to(dtype).double()  # the definition at the rounded inputs
        beta = (std.to(dtype).double() / ls) ** 2
        u = (xr - mean.to(dtype).double()) / ls
        k = torch.exp(-0.5 * ((xr - xr.T) / ls) ** 2)
        m = torch.exp(-0.5 * u**2 / (1 + beta)) / torch.sqrt(1 + beta)
        expected = k - m * m.T * torch.sqrt(1 + 2 * beta)
        assert (terms - expected).abs().max() < tol, (length, dtype)


def test_orthogonal_terms_keep_their_precision_at_long_lengthscales():
    """At lengthscale 300 the terms are 1e-4 of an RBF term's (the constant took the rest); the
    overflow guard's e^(L + r) - e^L, added to them in the wrong order, rounded them to the
    precision of e^L (relative errors of 3e-12). Against a 50-digit reference."""
    from lazykern.formulas.interactions import orthogonal_rbf_features, orthogonal_rbf_terms

    xs, mean, std = [-2.1, -0.4, 0.0, 0.3, 1.7], 0.1, 0.9
    for length in (30.0, 300.0):
        params = [torch.tensor([[v]], dtype=torch.float64) for v in (length, mean, std)]
        f = orthogonal_rbf_features(torch.tensor(xs, dtype=torch.float64)[:, None], *params)
        terms = orthogonal_rbf_terms(f[:, None], f[None])[..., 0]
        expected = torch.tensor([[ref.orthogonal_rbf_exact(a, b, length, mean, std) for b in xs] for a in xs],
                                dtype=torch.float64)
        assert float((terms - expected).abs().max() / expected.abs().max()) < 1e-14, length


def test_orthogonal_l2_terms_match_exact_integrals():
    """C(a, b) = int k~(t, a) k~(t, b) p(t) dt (the Sobol indices' inner products) against closed-form
    Gaussian integrals to 700 digits, entry by entry on the scale sqrt(C(a, a) C(b, b)), from a
    collapsed lengthscale (4e-150: OAK on UCI bike) to a long one (differences of logarithms of
    size beta lost digits there), with an input 28.6 standard deviations out (UCI protein, where
    lengthscale 0.04 made every share NaN: an underflowing product times an overflowing
    exponential). float32 stays finite at a collapsed lengthscale."""
    from lazykern.formulas.interactions import orthogonal_rbf_l2_features, orthogonal_rbf_l2_terms

    xs, mean, std = [-2.1, 0.0, 0.3, 0.30001, 1.7, 3.0, 28.6], 0.1, 0.9
    for length in (4e-150, 1e-6, 0.04, 0.7, 300.0, 2e4):
        params = [torch.tensor([[v]], dtype=torch.float64) for v in (length, mean, std)]
        f = orthogonal_rbf_l2_features(torch.tensor(xs, dtype=torch.float64)[:, None], *params)
        inner = orthogonal_rbf_l2_terms(f[:, None], f[None])[..., 0]
        expected = torch.tensor([[ref.orthogonal_rbf_l2_exact(a, b, length, mean, std, digits=700) for b in xs]
                                 for a in xs], dtype=torch.float64)
        scale = expected.diag().sqrt()[:, None] * expected.diag().sqrt()[None]
        error, seen = (inner - expected).abs(), scale > 0  # 28.6 out, C underflows to 0 at short lengthscales
        assert float((error[seen] / scale[seen]).max()) < 1e-12 and bool((error[~seen] < 1e-300).all()), length
    params = [torch.tensor([[v]], dtype=torch.float32) for v in (1e-30, mean, std)]
    f = orthogonal_rbf_l2_features(torch.tensor(xs, dtype=torch.float32)[:, None], *params)
    assert torch.isfinite(orthogonal_rbf_l2_terms(f[:, None], f[None])).all()


def test_elementary_symmetric_gradcheck_and_float32():
    z = torch.rand(4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: elementary_symmetric(v, 4), (z,))
    nearby = 1 - 0.01 * torch.rand(100, 64, dtype=torch.float64)
    exact = elementary_symmetric(nearby, 64)
    single = elementary_symmetric(nearby.float(), 64).double()
    assert ((single - exact).abs() / exact).max() < 1e-5


def test_float32_kernel_matches_float64():
    kernel = make("newton-girard")
    x = torch.randn(N, D, dtype=torch.float64)
    expected = reference_of(kernel, x, x).detach()
    with settings.engine("torch"):
        out = kernel.float()(x.float()).to_dense()
    assert_close(out.double(), expected, rtol=1e-5)


def test_bad_arguments_raise_before_anything_runs():
    base = lazykern.RBFKernel(ard_num_dims=4)
    NG = lazykern.kernels.NewtonGirardAdditiveKernel
    with pytest.raises(ValueError, match="max_degree must be at most num_dims=4"):
        NG(base, 4, 5)
    with pytest.raises(ValueError, match="max_degree must be a positive int, got 0"):
        NG(base, 4, 0)
    with pytest.raises(ValueError, match="max_degree must be a positive int, got True"):
        NG(base, 4, True)
    with pytest.raises(TypeError, match="base_kernel must be one of"):
        NG(gpytorch.kernels.LinearKernel(), 4, 2)
    with pytest.raises(ValueError, match="inputs have 3 features"):
        NG(base, 4, 2)(torch.randn(5, 3)).to_dense()
    OAK = lazykern.kernels.OrthogonalAdditiveKernel
    with pytest.raises(ValueError, match="input_measure must be 'gaussian', got 'uniform'"):
        OAK(4, 2, input_measure="uniform")
    with pytest.raises(ValueError, match="measure_std must be positive"):
        OAK(4, 2, measure_std=0.0)
    with pytest.raises(ValueError, match=r"measure_mean must be a number or 4 numbers .* got shape \(3,\)"):
        OAK(4, 2, measure_mean=torch.zeros(3))
    Group = lazykern.kernels.GroupAdditiveKernel
    with pytest.raises(ValueError, match="groups must be a non-empty sequence"):
        Group(base, [])
    with pytest.raises(ValueError, match=r"got group \(1, 1\)"):
        Group(base, [(0,), (1, 1)])
    with pytest.raises(ValueError, match="groups use column 7 but num_dims=4"):
        Group(base, [(0, 7)], num_dims=4)
    with pytest.raises(ValueError, match="base_kernel.lengthscale has 4 entries"):
        Group(base, [(0, 1)])  # num_dims inferred as 2
