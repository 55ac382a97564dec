"""ProjectedAdditiveKernel: sums of one-dimensional kernels on projections w_j^T x of the inputs.

* exactness against a dense reference written from the formula (the projection done here, the
  one-dimensional terms from ``tests/reference.py``) and against ``AdditiveStructureKernel`` of the
  same base on the projected inputs: values and gradients (W, scales, input lengthscales, base
  hyperparameters), through
  ``kernel(X)`` and ``kernel(X, Z)`` with a batch shape, on the torch engine, lazykern's CPU
  engine and with default settings (and one case forced on KeOps), float64, relative error <= 1e-12;
* gradcheck on a tiny case (inputs, directions, scales, lengthscale);
* GPyTorch's ``BaseKernelTestCase``;
* the directions: RPA seeded and reproducible, DPA deterministic and more spread than RPA, optimised
  once per (d, J, seed) in a process and handed out as copies;
* bad arguments: one-line errors naming the argument, nothing kept or changed.

Memory at N = 10^4 (an MLL step, peak RSS in a subprocess) is in ``test_projected_memory``.
"""

from __future__ import annotations

import contextlib
import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

import lazykern
from lazykern import settings
from lazykern.kernels.projected import _spread_directions, diverse_directions, random_directions

from . import reference
from .test_kernels import FAMILIES, assert_close
from .test_upstream import _InMode

F64 = torch.float64
D, J = 5, 3  # input dimensions, projections (J = 3 shares compiled formulas with test_kernels.py)
BATCH = torch.Size([2])
MODES = {
    "torch": lambda: (settings.engine("torch"), settings.max_dense_bytes(0)),
    "cpu": lambda: (settings.engine("cpu"), settings.max_dense_bytes(0)),
    "default": lambda: (),
}


@contextlib.contextmanager
def mode(name: str):
    with contextlib.ExitStack() as stack:
        for ctx in MODES[name]():
            stack.enter_context(ctx)
        yield


def make_projected(family: str, ard: bool, batch_shape=BATCH, projections="rpa",
                   input_lengthscales=False) -> lazykern.ProjectedAdditiveKernel:
    """Learned directions, distinct non-default hyperparameters (a mix-up between terms shows)."""
    kw = dict(ard_num_dims=J if ard else None, batch_shape=batch_shape)
    if family.startswith("matern"):
        base = lazykern.MaternKernel(nu=float(family[len("matern") :]), **kw)
    else:
        base = {"rbf": lazykern.RBFKernel, "rq": lazykern.RQKernel, "periodic": lazykern.PeriodicKernel}[family](**kw)
    kernel = lazykern.ProjectedAdditiveKernel(base, D, J, projections=projections, learn_projections=True,
                                              input_lengthscales=input_lengthscales).double()
    shape = base.raw_lengthscale.shape
    base.lengthscale = torch.linspace(0.6, 1.7, shape[-1], dtype=F64).expand(shape)
    if family == "rq":
        base.alpha = torch.full_like(base.alpha, 1.3)
    if family == "periodic":
        base.period_length = torch.linspace(1.1, 2.3, shape[-1], dtype=F64).expand(shape)
    kernel.component_scales = torch.linspace(0.5, 2.0, J, dtype=F64).expand_as(kernel.component_scales)
    if input_lengthscales:
        kernel.input_lengthscale = torch.linspace(0.4, 2.5, D, dtype=F64).expand_as(kernel.input_lengthscale)
    return kernel


def projected(kernel, x):
    """The inputs the terms see, from the formula: (x / ell) @ W, or x @ W without input lengthscales."""
    ell = kernel.input_lengthscale
    return (x if ell is None else x / ell) @ kernel.projections


def dense_reference(kernel, x1, x2, diag=False):
    """The formula written out: sum_j s_j k_1(w_j^T x1, w_j^T x2), the projection done here.

    For ``x2 is x1`` the diagonal is sum_j s_j (every base kernel is 1 at distance 0) and the rest
    pair by pair, so that Matérn's square root never meets a zero distance (its gradient there is
    NaN in autograd; the kernel's is the limit, 0)."""
    base = kernel.base_kernel

    def terms(a, b, pairs):
        return reference.kernel(
            type(base).__name__.replace("Kernel", "").lower(),
            projected(kernel, a),
            projected(kernel, b),
            base.lengthscale,
            additive=True,
            scales=kernel.component_scales,
            nu=getattr(base, "nu", None),
            alpha=getattr(base, "alpha", None),
            period=getattr(base, "period_length", None),
            diag=pairs,
        )

    if x2 is not x1 or diag:
        return terms(x1, x2, diag)
    n = x1.shape[-2]
    i, j = (~torch.eye(n, dtype=torch.bool)).nonzero(as_tuple=True)
    off = terms(x1[..., i, :], x1[..., j, :], True)
    on = kernel.component_scales.sum(-1).expand(*off.shape[:-1], n)
    full = off.new_zeros(*off.shape[:-1], n * n)
    full[..., i * n + j] = off
    full[..., torch.arange(n) * (n + 1)] = on
    return full.reshape(*off.shape[:-1], n, n)


def additive_on_projections(kernel):
    """AdditiveStructureKernel of the same base (shared, so the same parameters) and the same scales,
    to be called on x @ W."""
    additive = lazykern.AdditiveStructureKernel(kernel.base_kernel, num_dims=J, component_scales=True).double()
    additive.raw_component_scales = kernel.raw_component_scales  # the same parameter: gradients compare
    return additive


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*BATCH, 9, D, generator=g, dtype=F64)
    z = torch.randn(*BATCH, 6, D, generator=g, dtype=F64)
    return x, z


def _values_and_gradients(kernel, K, b):
    """K @ rhs and the gradients of a weighted sum of it w.r.t. every parameter of ``kernel``."""
    g = torch.Generator().manual_seed(1)
    rhs = torch.randn(*BATCH, b.shape[-2], 2, generator=g, dtype=F64)
    weights = torch.randn(*BATCH, K.shape[-2], 2, generator=g, dtype=F64)
    out = K @ rhs
    grads = torch.autograd.grad((out * weights).sum(), list(kernel.parameters()))
    return [out.detach(), *grads]


@pytest.mark.parametrize("engine", list(MODES))
@pytest.mark.parametrize("ard, inputs", [(False, False), (True, False), (False, True)],
                         ids=["shared", "ard", "input-lengthscales"])
@pytest.mark.parametrize("family", FAMILIES)
def test_equals_dense_reference_and_additive_kernel_on_projections(family, ard, inputs, engine):
    kernel = make_projected(family, ard, input_lengthscales=inputs)
    additive = additive_on_projections(kernel)
    names = [name for name, _ in kernel.named_parameters()]
    assert "projections" in names and "raw_component_scales" in names and "base_kernel.raw_lengthscale" in names
    assert ("raw_input_lengthscale" in names) == inputs
    x, z = _inputs()
    for b in (x, z):
        with mode(engine):
            lazy = _values_and_gradients(kernel, kernel(x, b), b)
            with torch.no_grad():
                dense = kernel(x, b).to_dense()
        expected = _values_and_gradients(kernel, dense_reference(kernel, x, b), b)
        on_x = projected(kernel, x)
        with mode(engine):
            on_projections = _values_and_gradients(
                kernel, additive(on_x, on_x if b is x else projected(kernel, b)), b
            )
        assert_close(dense, dense_reference(kernel, x, b).detach(), rtol=1e-12)
        for actual, want, theirs in zip(lazy, expected, on_projections):
            assert_close(actual, want, rtol=1e-12)
            assert_close(actual, theirs, rtol=1e-12)
        with mode(engine), torch.no_grad():
            assert_close(kernel(b, diag=True), dense_reference(kernel, b, b, diag=True), rtol=1e-12)


@pytest.mark.slow
def test_keops_products_and_gradients_equal_the_dense_reference():
    """KeOps runs the same additive formula on the J projected columns (J = 3 and two right-hand
    sides, float64: the reduction test_kernels.py compiles for the additive RBF kernel)."""
    kernel = make_projected("rbf", ard=True, batch_shape=torch.Size())
    g = torch.Generator().manual_seed(2)
    x, z = (torch.randn(n, D, generator=g, dtype=F64) for n in (9, 6))
    rhs, weights = torch.randn(6, 2, generator=g, dtype=F64), torch.randn(9, 2, generator=g, dtype=F64)
    with settings.engine("keops"), settings.max_dense_bytes(0):
        out = kernel(x, z) @ rhs
        grads = torch.autograd.grad((out * weights).sum(), list(kernel.parameters()))
    expected = dense_reference(kernel, x, z) @ rhs
    assert_close(out, expected, rtol=1e-12)
    for actual, want in zip(grads, torch.autograd.grad((expected * weights).sum(), list(kernel.parameters()))):
        assert_close(actual, want, rtol=1e-12)


@pytest.mark.parametrize("engine", ["torch", "cpu"])
def test_gradcheck_inputs_directions_scales_lengthscales(engine):
    torch.manual_seed(0)
    kernel = lazykern.ProjectedAdditiveKernel(
        lazykern.MaternKernel(nu=2.5), num_dims=2, num_projections=J, projections="rpa", learn_projections=True,
        input_lengthscales=True,
    ).double()
    rhs = torch.randn(3, 2, dtype=F64)

    class Product(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.kernel = kernel

        def forward(self, x, z):
            return self.kernel(x, z) @ rhs

    product = Product()
    names = ("kernel.projections", "kernel.raw_component_scales", "kernel.base_kernel.raw_lengthscale",
             "kernel.raw_input_lengthscale")
    start = dict(product.named_parameters())

    def f(x, z, *params):
        return torch.func.functional_call(product, dict(zip(names, params)), (x, z))

    x = torch.randn(4, 2, dtype=F64, requires_grad=True)
    z = torch.randn(3, 2, dtype=F64, requires_grad=True)
    params = [start[n].detach().clone().requires_grad_(True) for n in names]
    with mode(engine):
        assert torch.autograd.gradcheck(f, (x, z, *params))


# ------------------------------------------------------------------ GPyTorch's BaseKernelTestCase
class _ProjectedCase(_InMode, BaseKernelTestCase):
    """Two input dimensions (the data of the batch tests), three projections."""

    def create_kernel_no_ard(self, **kwargs):
        return lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(**kwargs), num_dims=2, num_projections=3)

    def create_kernel_ard(self, num_dims, **kwargs):
        return lazykern.ProjectedAdditiveKernel(
            lazykern.MaternKernel(nu=1.5, ard_num_dims=3, **kwargs), num_dims=num_dims, num_projections=3,
            input_lengthscales=True,
        )

    def test_active_dims_list(self):
        self.skipTest("no active_dims: the d x J directions choose how each column enters (a zero row drops one)")

    test_active_dims_range = test_active_dims_list


for _mode in ("torch", "default"):
    _name = f"TestProjectedKernelCase_{_mode}"
    globals()[_name] = type(_name, (_ProjectedCase, unittest.TestCase), {"mode": _mode})


# ------------------------------------------------------------------ the directions
def test_rpa_is_seeded_reproducible_and_leaves_the_global_generator_alone():
    state = torch.get_rng_state()
    a = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, 7, projections="rpa", seed=3)
    b = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, 7, projections="rpa", seed=3)
    c = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, 7, projections="rpa", seed=4)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.projections, b.projections) and not torch.equal(a.projections, c.projections)
    assert a.projections.shape == (D, 7) and a.projections.dtype == torch.float32
    assert_close(a.projections.norm(dim=0), torch.ones(7), rtol=1e-6)
    assert "projections" in dict(a.named_buffers()) and "projections" not in dict(a.named_parameters())
    assert torch.equal(a.projections, random_directions(D, 7, 3).float())


def _energy(W):
    return float(((W.T @ W) ** 4).sum()) - W.shape[1]


@pytest.mark.parametrize("num_dims, num_projections", [(26, 200), (8, 20), (6, 4)])
def test_dpa_is_deterministic_unit_and_more_spread_than_rpa(num_dims, num_projections):
    W = diverse_directions(num_dims, num_projections, 0)
    assert torch.equal(W, diverse_directions(num_dims, num_projections, 0))
    assert_close(W.norm(dim=0), torch.ones(num_projections, dtype=F64), rtol=1e-12)
    rpa = random_directions(num_dims, num_projections, 0)
    assert _energy(W) < 0.6 * _energy(rpa)
    assert (W.T @ W - torch.eye(num_projections, dtype=F64)).abs().max() < (rpa.T @ rpa).triu(1).abs().max()
    kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims, num_projections)  # DPA is the default
    assert torch.equal(kernel.projections, W.float())


def test_dpa_directions_are_optimised_once_and_handed_out_as_copies():
    first = diverse_directions(6, 4, 7)
    optimised = _spread_directions.cache_info().misses
    second = diverse_directions(6, 4, 7)
    kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), 6, 4, seed=7, learn_projections=True).double()
    assert _spread_directions.cache_info().misses == optimised  # neither the call nor the kernel optimised again
    assert torch.equal(first, second) and first is not second
    first.add_(1.0)
    with torch.no_grad():
        kernel.projections.add_(1.0)  # as training would
    assert torch.equal(diverse_directions(6, 4, 7), second)  # the cached set is unchanged


def test_given_projections_are_copied_and_learnable():
    W = torch.randn(D, J, dtype=F64)
    kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, J, projections=W, learn_projections=True)
    W.add_(1.0)  # the caller's tensor is not kept
    assert isinstance(kernel.projections, torch.nn.Parameter)
    assert torch.allclose(kernel.projections.double(), W - 1.0)
    assert kernel.projections.dtype == torch.float32  # the base kernel's dtype
    x = torch.randn(20, D)
    kernel(x).to_dense().sum().backward()
    assert kernel.projections.grad is not None and bool(kernel.projections.grad.abs().sum() > 0)


def test_batch_kernel_has_one_copy_of_the_directions_per_member_and_indexes():
    kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(batch_shape=torch.Size([3])), D, J,
                                              input_lengthscales=True).double()
    assert kernel.projections.shape == (3, D, J) and kernel.batch_shape == (3,)
    assert kernel.input_lengthscale.shape == (3, 1, D)
    kernel.input_lengthscale = torch.rand(3, 1, D, dtype=F64) + 0.5
    x = torch.randn(3, 10, D, dtype=F64)
    with torch.no_grad():
        assert_close(kernel[1](x[1]).to_dense(), kernel(x).to_dense()[1], rtol=1e-12)


def test_scales_start_at_one_over_j():
    kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, 8).double()
    assert_close(kernel.component_scales, torch.full((1, 8), 1 / 8, dtype=F64), rtol=1e-6)  # set in float32
    x = torch.randn(4, D, dtype=F64)
    assert_close(kernel(x, diag=True), torch.ones(4, dtype=F64), rtol=1e-6)


def test_input_lengthscales_start_at_one_and_divide_the_inputs():
    plain = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, J).double()
    scaled = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, J, input_lengthscales=True).double()
    assert plain.input_lengthscale is None
    assert_close(scaled.input_lengthscale, torch.ones(1, D, dtype=F64), rtol=1e-6)  # set in float32
    x = torch.randn(6, D, dtype=F64)
    ell = torch.linspace(0.5, 3.0, D, dtype=F64)
    scaled.input_lengthscale = ell
    with torch.no_grad():
        assert_close(scaled(x).to_dense(), plain(x / ell).to_dense(), rtol=1e-12)
    with pytest.raises(AttributeError, match="construct with input_lengthscales=True"):
        plain.input_lengthscale = 1.0


# ------------------------------------------------------------------ bad arguments
BAD = [
    (dict(num_dims=0), ValueError, "num_dims must be a positive int, got 0"),
    (dict(num_projections=2.0), ValueError, "num_projections must be a positive int, got 2.0"),
    (dict(projections="pca"), ValueError, "projections must be one of ('rpa', 'dpa'), got 'pca'"),
    (dict(projections=[[1.0]]), TypeError, "projections must be one of ('rpa', 'dpa') or a torch.Tensor, got list"),
    (dict(projections=torch.ones(D, J, dtype=torch.int64)), TypeError, "projections must be float32 or float64"),
    (dict(projections=torch.ones(J, D)), ValueError, f"projections must have shape (num_dims, num_projections) = ({D}, {J}), got ({J}, {D})"),
    (dict(projections=torch.full((D, J), float("nan"))), ValueError, "projections contains NaN or infinite values"),
    (dict(projections=torch.eye(D, J) * torch.tensor([1.0, 0.0, 1.0])), ValueError, "projections has all-zero columns [1]"),
    (dict(learn_projections="yes"), TypeError, "learn_projections must be True or False, got 'yes'"),
    (dict(seed=-1), ValueError, "seed must be"),
    (dict(input_lengthscales=1), TypeError, "input_lengthscales must be True or False, got 1"),
    (dict(base_kernel=lazykern.RBFKernel(ard_num_dims=D)), ValueError,
     f"base_kernel.lengthscale has {D} entries: use ard_num_dims=None (shared) or ard_num_dims=num_projections={J}"),
    (dict(base_kernel=gpytorch.kernels.LinearKernel()), TypeError, "base_kernel must be one of"),
]


@pytest.mark.parametrize("change, error, message", BAD, ids=[next(iter(c)) + str(i) for i, (c, _, _) in enumerate(BAD)])
def test_bad_arguments_give_one_line_errors(change, error, message):
    args = dict(base_kernel=lazykern.RBFKernel(), num_dims=D, num_projections=J, projections="rpa")
    args.update(change)
    state = torch.get_rng_state()
    with pytest.raises(error) as info:
        lazykern.ProjectedAdditiveKernel(**args)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert torch.equal(torch.get_rng_state(), state)


def test_inputs_of_the_wrong_width_name_num_dims():
    kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), D, J)
    with pytest.raises(ValueError, match=f"num_dims={D}") as info:
        kernel(torch.randn(4, D + 1)).to_dense()
    assert "\n" not in str(info.value)
