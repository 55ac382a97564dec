"""The structured engine's one-dimensional sums against dense references written from the math.

Half-integer Matérn products are exact (recurrences): float64 products and every gradient within
1e-12 of the dense reference, relative to the largest entry. The Gaussian's fast Gauss transform
is held to its stated bound, ``tol`` times the sum of |v| (and the scales). Lengthscales from 1e-3
to 1e3 of the data's spread, 10% duplicated inputs, coincident points across the two sets, one set
(``K(X, X)``) and two.
"""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch

import lazykern
from lazykern import backend, settings
from lazykern.formulas import StationaryFormula
from lazykern.structured import ENGINE, gauss_plan, merged_order

F64 = torch.float64
KERNELS = [("matern", 0.5), ("matern", 1.5), ("matern", 2.5), ("rbf", 1e-10)]
IDS = ["matern0.5", "matern1.5", "matern2.5", "rbf"]


def one_dimensional(family: str, parameter: float, t: torch.Tensor) -> torch.Tensor:
    """k(t) from its definition; sqrt(t^2 + 1e-30) gives the derivative 0 at t = 0, as the
    pairwise engines do."""
    if family == "rbf":
        return torch.exp(-0.5 * t * t)
    r = torch.sqrt(t * t + 1e-30)
    if parameter == 0.5:
        return torch.exp(-r)
    if parameter == 1.5:
        return (1 + math.sqrt(3) * r) * torch.exp(-math.sqrt(3) * r)
    return (1 + math.sqrt(5) * r + 5 / 3 * r * r) * torch.exp(-math.sqrt(5) * r)


def dense(family, parameter, x1, x2, v, scales):
    k = one_dimensional(family, parameter, x1.unsqueeze(-2) - x2.unsqueeze(-3))
    return (k * scales.unsqueeze(-2)).sum(-1) @ v


def formula_of(family: str, parameter: float) -> StationaryFormula:
    return StationaryFormula(family, additive=True, nu=parameter if family == "matern" else None)


def structured(family, parameter, x1, x2, v, scales):
    """The engine's product, with scales (D,) or (*batch, D) as the formula's (*batch, 1, D)."""
    return ENGINE.matmul(formula_of(family, parameter), x1, x2, {"scales": scales.unsqueeze(-2)}, v)


def inputs(n: int, m: int, lengthscale: float, one_set: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, 3, generator=g, dtype=F64)
    x1[: n // 10] = x1[n // 10 : 2 * (n // 10)]  # 10% duplicated inputs
    x2 = x1 if one_set else torch.randn(m, 3, generator=g, dtype=F64)
    if not one_set:
        x2[: m // 10] = x1[: m // 10]  # points of one set that are also in the other
    v = torch.randn(x2.shape[0], 4, generator=g, dtype=F64)
    scales = torch.rand(3, generator=g, dtype=F64) + 0.5
    return x1 / lengthscale, x2 if one_set else x2 / lengthscale, v, scales


def products_and_gradients(fn, x1, x2, v, scales, one_set):
    leaves = [t.clone().requires_grad_() for t in ((x1,) if one_set else (x1, x2)) + (v, scales)]
    a, b = (leaves[0], leaves[0]) if one_set else (leaves[0], leaves[1])
    out = fn(a, b, leaves[-2], leaves[-1])
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    return out, torch.autograd.grad((out * weights).sum(), leaves)


@pytest.mark.parametrize("one_set", [False, True], ids=["two-sets", "one-set"])
@pytest.mark.parametrize("lengthscale", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("family, parameter", KERNELS, ids=IDS)
def test_products_and_gradients_against_dense(family, parameter, lengthscale, one_set):
    x1, x2, v, scales = inputs(300, 200, lengthscale, one_set)
    out, grads = products_and_gradients(lambda *t: structured(family, parameter, *t), x1, x2, v, scales, one_set)
    ref, ref_grads = products_and_gradients(lambda *t: dense(family, parameter, *t), x1, x2, v, scales, one_set)
    if family == "matern":
        for got, expected in zip((out, *grads), (ref, *ref_grads)):
            assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-12
    else:
        # The bound holds for the sums of each dimension; a product weights them by the scales,
        # the gradients by their weights (|weights| < 5 here) and the factors of the chain rule.
        bound = parameter * scales.sum() * v.abs().sum(0).max()
        assert (out - ref).abs().max() <= bound
        for got, expected in zip(grads, ref_grads):
            assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-8


@pytest.mark.parametrize("family, parameter", [("matern", 2.5), ("rbf", 1e-10)], ids=["matern2.5", "rbf"])
def test_float32_values_are_summed_as_their_float64_copies(family, parameter):
    """The walks read float32 right-hand sides as they are: each converts exactly, so the float64
    sums are those of the float64 copy, to the last bit."""
    from lazykern.structured.additive import product

    x1, x2, v, scales = inputs(300, 200, 1.0, one_set=False)
    single = v.float()
    assert torch.equal(product(family, parameter, x1, x2, single, scales),
                       product(family, parameter, x1, x2, single.double(), scales))

@pytest.mark.parametrize("one_set", [False, True], ids=["two-sets", "one-set"])
@pytest.mark.parametrize("family, parameter", [("matern", 1.5), ("rbf", 1e-10)], ids=["matern1.5", "rbf"])
def test_discrete_inputs_against_dense(family, parameter, one_set):
    """Columns of a few distinct values shared by both sets, as many UCI columns are: the Gauss
    transform runs over distinct values (sources' values summed, targets' sums copied)."""
    g = torch.Generator().manual_seed(5)
    x1 = torch.randint(0, 7, (300, 3), generator=g).to(F64) / 3
    x2 = x1 if one_set else torch.randint(2, 9, (200, 3), generator=g).to(F64) / 3
    v = torch.randn(x2.shape[0], 4, generator=g, dtype=F64)
    scales = torch.rand(3, generator=g, dtype=F64) + 0.5
    out, grads = products_and_gradients(lambda *t: structured(family, parameter, *t), x1, x2, v, scales, one_set)
    ref, ref_grads = products_and_gradients(lambda *t: dense(family, parameter, *t), x1, x2, v, scales, one_set)
    tolerance = 1e-12 if family == "matern" else 1e-8
    for got, expected in zip((out, *grads), (ref, *ref_grads)):
        assert ((got - expected).abs().max() / expected.abs().max()).item() < tolerance


@pytest.mark.parametrize("family, parameter", KERNELS, ids=IDS)
def test_gradcheck(family, parameter):
    g = torch.Generator().manual_seed(3)
    x1, x2 = torch.randn(7, 2, generator=g, dtype=F64), torch.randn(5, 2, generator=g, dtype=F64)
    v, scales = torch.randn(5, 2, generator=g, dtype=F64), torch.rand(2, generator=g, dtype=F64) + 0.5
    tensors = [t.requires_grad_() for t in (x1, x2, v, scales)]
    assert torch.autograd.gradcheck(lambda *t: structured(family, parameter, *t), tensors, atol=1e-7)


@pytest.mark.parametrize("family, parameter", KERNELS, ids=IDS)
def test_extreme_lengthscales_and_float32_stay_finite(family, parameter):
    # 1e-4 and 1e4 times the spread: gaps of 1e4 lengthscales (exp underflows to 0) and of 1e-4
    for lengthscale in (1e-4, 1e4):
        x1, x2, v, scales = inputs(200, 150, lengthscale, False)
        for dtype in (F64, torch.float32):
            tensors = [t.to(dtype).requires_grad_() for t in (x1, x2, v, scales)]
            out = structured(family, parameter, *tensors)
            grads = torch.autograd.grad(out.sum(), tensors)
            assert out.dtype == dtype and all(bool(torch.isfinite(t).all()) for t in (out, *grads))
            # against the inputs as rounded to dtype: float32 inputs 1e4 lengthscales from the
            # origin are only known to 1e-3 lengthscales
            ref = dense(family, parameter, *(t.detach().double() for t in tensors))
            assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6


def test_order_is_reused_while_it_still_sorts(monkeypatch):
    """A training loop divides the same inputs by new lengthscales: one sort, then O(N) checks."""
    x = torch.randn(500, 4, dtype=F64)
    calls = []
    sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda *a, **k: calls.append(1) or sort(*a, **k))
    for lengthscale in (0.5, 1.0, 2.0):
        key, order = merged_order(x / lengthscale, x / lengthscale)
        assert bool((key[:, 1:] >= key[:, :-1]).all())
    assert len(calls) == 1
    merged_order(torch.randn(500, 4, dtype=F64), x)  # other values: sorted anew
    assert len(calls) == 2
    # an order that still ascends but puts a target before a source of equal value: sorted anew
    col = lambda *t: torch.tensor(t, dtype=F64)[:, None]  # noqa: E731
    assert merged_order(col(1.0, 3.0), col(0.0, 2.0))[1].tolist() == [[0, 2, 1, 3]]
    assert merged_order(col(1.0, 3.0), col(0.0, 1.0))[1].tolist() == [[0, 1, 2, 3]]
    assert len(calls) == 4


def test_gauss_plan_bound():
    """The series' tail and the cutoff meet the bound the plan was asked for, at every box width the
    data's density may choose."""
    plans = {gauss_plan(tol, density) for tol in (1e-6, 1e-10, 1e-14) for density in (1.0, 128.0, 1e6)}
    assert len({h for _, h, _ in plans}) >= 3  # sparse and dense data take different boxes
    for tol, (p, h, reach) in ((tol, gauss_plan(tol, density)) for tol in (1e-6, 1e-10, 1e-14)
                               for density in (1.0, 128.0, 1e6)):
        cutoff = reach - h / 2
        assert cutoff * math.exp(-cutoff * cutoff / 2) <= tol / 2
        tail = 1.0865 * sum((h / 2) ** n * math.sqrt((n + 1) / math.factorial(n)) for n in range(p, p + 80))
        assert tail <= tol / 2
    with pytest.raises(ValueError, match="tol must be in"):
        gauss_plan(0.0)


@pytest.mark.parametrize("family, parameter", [("matern", 1.5), ("rbf", 1e-10)], ids=["matern1.5", "rbf"])
def test_batches_broadcast_like_the_other_engines(family, parameter):
    """(2,)-batched inputs against a batch-free right-hand side and shared scales, and a batch-free
    kernel against batched right-hand sides: each element as computed alone."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 120, 3, generator=g, dtype=F64)
    v = torch.randn(120, 2, generator=g, dtype=F64)
    scales = torch.rand(2, 3, generator=g, dtype=F64) + 0.5
    out = structured(family, parameter, x, x, v, scales)
    assert out.shape == (2, 120, 2)
    for b in range(2):
        assert torch.allclose(out[b], structured(family, parameter, x[b], x[b], v, scales[b]), rtol=0, atol=1e-14)
        assert torch.allclose(out[b], dense(family, parameter, x[b], x[b], v, scales[b]), rtol=1e-8, atol=1e-9)
    vb = torch.randn(3, 120, 2, generator=g, dtype=F64)
    out = structured(family, parameter, x[0], x[0], vb, scales[0])
    assert out.shape == (3, 120, 2)
    assert torch.allclose(out, dense(family, parameter, x[0], x[0], vb, scales[0]), rtol=1e-8, atol=1e-9)


def test_second_derivatives_are_exact():
    """A backward pass with create_graph=True takes the shared row blocks: Hessian-vector products
    equal the dense reference's (a structured backward would give zeros)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(40, 2, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(40, 1, generator=g, dtype=F64)
    scales = torch.tensor([0.7, 1.3], dtype=F64, requires_grad=True)
    direction = torch.randn(40, 2, generator=g, dtype=F64)
    results = []
    for fn in (structured, dense):
        out = fn("matern", 2.5, x, x, v, scales).sum()
        (gx,) = torch.autograd.grad(out, [x], create_graph=True)
        results.append(torch.autograd.grad((gx * direction).sum(), [x, scales]))
    for got, expected in zip(*results):
        assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-12


@pytest.mark.parametrize("family, parameter", KERNELS, ids=IDS)
def test_fused_symmetric_gradients(family, parameter):
    """The gradients of <L, K(X, X) R> for the inputs and the scales, as the chooser asks for them."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(150, 3, generator=g, dtype=F64).requires_grad_()
    scales = (torch.rand(1, 3, generator=g, dtype=F64) + 0.5).requires_grad_()
    left, right = torch.randn(150, 2, generator=g, dtype=F64), torch.randn(150, 2, generator=g, dtype=F64)
    grad_x, grad_x2, grads = ENGINE.symmetric_gradients(formula_of(family, parameter), x, x, {"scales": scales},
                                                         left, right)
    expected = torch.autograd.grad((left * dense(family, parameter, x, x, right, scales[0])).sum(), [x, scales])
    assert grad_x2 is None
    for got, want in zip((grad_x, grads["scales"]), expected):
        assert ((got - want).abs().max() / want.abs().max()).item() < (1e-12 if family == "matern" else 1e-8)


def test_tolerance_setting_reaches_the_gauss_transform():
    x = torch.randn(400, 2, generator=torch.Generator().manual_seed(8), dtype=F64) * 3
    v = torch.ones(400, 1, dtype=F64)
    exact = dense("rbf", None, x, x, v, torch.ones(2, dtype=F64))
    with settings.structured_tolerance(1e-4):
        loose = structured("rbf", None, x, x, v, torch.ones(2, dtype=F64))
    tight = structured("rbf", None, x, x, v, torch.ones(2, dtype=F64))
    assert (loose - exact).abs().max() <= 1e-4 * 2 * 400
    assert (tight - exact).abs().max() <= 1e-10 * 2 * 400
    assert (loose - exact).abs().max() > (tight - exact).abs().max()


# ------------------------------------------------------------------ through the kernels users hold
def _user_kernel(family: str, nu: float | None, lengthscale: float) -> gpytorch.kernels.Kernel:
    batch = torch.Size([2])
    base = (lazykern.MaternKernel(nu=nu, ard_num_dims=3, batch_shape=batch) if family == "matern"
            else lazykern.RBFKernel(ard_num_dims=3, batch_shape=batch))
    additive = lazykern.AdditiveStructureKernel(base, num_dims=3, component_scales=True)
    kernel = gpytorch.kernels.ScaleKernel(additive, batch_shape=batch).double()
    base.lengthscale = lengthscale * torch.tensor([[[0.5, 1.0, 2.0]], [[1.5, 0.7, 1.1]]], dtype=F64)
    additive.component_scales = torch.tensor([[[0.4, 1.3, 0.9]], [[1.1, 0.6, 1.7]]], dtype=F64)
    kernel.outputscale = torch.tensor([0.8, 1.6], dtype=F64)
    return kernel


@pytest.mark.slow
@pytest.mark.parametrize("family, nu", [("matern", 0.5), ("matern", 1.5), ("matern", 2.5), ("rbf", None)],
                         ids=["matern0.5", "matern1.5", "matern2.5", "rbf"])
def test_kernel_products_and_gradients_equal_the_pair_engine(family, nu):
    """N = M = 2,000 in float64, batch shape (2,), lengthscales 1e-3, 1 and 1e3 times the spread,
    10% duplicated inputs: K(X, X) V and K(X, Z) V and every gradient (inputs, V, lengthscales,
    component scales, output scale) from the structured engine and the compiled pair engine agree
    to 1e-12 (Matérn) or to the Gauss transform's bound (RBF)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 2000, 3, generator=g, dtype=F64)
    x[:, :200] = x[:, 200:400]
    z = torch.randn(2, 2000, 3, generator=g, dtype=F64)
    v = torch.randn(2, 2000, 3, generator=g, dtype=F64)
    weights = torch.randn(2, 2000, 3, generator=g, dtype=F64)
    for lengthscale in (1e-3, 1.0, 1e3):
        results = {}
        for engine in ("structured", "cpu"):
            kernel = _user_kernel(family, nu, lengthscale)
            leaves = [x.clone().requires_grad_(), z.clone().requires_grad_(), v.clone().requires_grad_()]
            with settings.engine(engine), settings.max_dense_bytes(0):
                outs = [kernel(leaves[0]) @ leaves[2], kernel(leaves[0], leaves[1]) @ leaves[2]]
                loss = sum((o * weights).sum() for o in outs)
                grads = torch.autograd.grad(loss, leaves + list(kernel.parameters()))
            results[engine] = [o.detach() for o in outs] + list(grads)
        for got, expected in zip(results["structured"], results["cpu"]):
            err = ((got - expected).abs().max() / expected.abs().max()).item()
            assert err < (1e-12 if family == "matern" else 1e-8), (lengthscale, err)


@pytest.mark.parametrize("family, nu", [("matern", 0.5), ("rbf", None)], ids=["matern0.5", "rbf"])
def test_gradcheck_through_kernel_calls(family, nu):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 9, 3, generator=g, dtype=F64, requires_grad=True)
    z = torch.randn(2, 6, 3, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(2, 9, 2, generator=g, dtype=F64, requires_grad=True)
    kernel = _user_kernel(family, nu, 1.0)
    with settings.engine("structured"), settings.max_dense_bytes(0):
        assert torch.autograd.gradcheck(lambda a, b: kernel(a) @ b, (x, v), atol=1e-7)
        assert torch.autograd.gradcheck(lambda a, b, c: kernel(a, b) @ c, (x, z, v[:, :6]), atol=1e-7)


def test_auto_picks_the_structured_engine_and_reports_it():
    x = torch.randn(300, 4, dtype=F64)
    kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(lazykern.MaternKernel(nu=1.5), num_dims=4))
    op = kernel.double()(x).evaluate_kernel()
    assert backend.engine_for(op.covar_func, op.x1, op.x2, op.tensor_params) == "structured"
    small = kernel(x[:50]).evaluate_kernel()
    assert backend.engine_for(small.covar_func, small.x1, small.x2, small.tensor_params) == "cpu"
    periodic = lazykern.AdditiveStructureKernel(lazykern.PeriodicKernel(), num_dims=4).double()(x).evaluate_kernel()
    assert backend.engine_for(periodic.covar_func, periodic.x1, periodic.x2, periodic.tensor_params) == "cpu"
    assert "structured engine" in backend.engine_report("cpu")
    with settings.engine("structured"), pytest.raises(ValueError, match="the structured engine evaluates"):
        lazykern.RBFKernel().double()(x) @ torch.ones(300, 1, dtype=F64)


def test_the_matrix_of_a_structured_kernel_is_compiled(monkeypatch):
    """The structured engine has no dense output: the exact (Cholesky) path's matrix and its
    gradients come from the compiled CPU engine under ``"auto"``, equal to the torch engine's."""
    x = torch.randn(300, 4, dtype=F64)
    kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(lazykern.MaternKernel(nu=1.5), num_dims=4))
    kernel = kernel.double()
    weights = torch.linspace(-1, 1, 300 * 300, dtype=F64).view(300, 300)
    results, calls = {}, []
    monkeypatch.setattr(backend.TORCH, "dense", lambda *a, orig=backend.TORCH.dense: calls.append(1) or orig(*a))
    for engine in ("auto", "torch"):
        with settings.engine(engine):
            matrix = kernel(x).to_dense()
            grads = torch.autograd.grad((matrix * weights).sum(), list(kernel.parameters()))
        results[engine] = [matrix.detach(), *grads]
        assert len(calls) == (engine == "torch")
    for got, expected in zip(results["auto"], results["torch"]):
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


def _first_order_kernel(batch: torch.Size) -> gpytorch.kernels.Kernel:
    """A first-order Newton-Girard kernel of Matérn 5/2 terms with every hyperparameter away from
    its default (the order variance, 1/D normalized, and the component scales)."""
    matern = lazykern.MaternKernel(nu=2.5, ard_num_dims=3, batch_shape=batch)
    kernel = lazykern.NewtonGirardAdditiveKernel(matern, num_dims=3, max_degree=1, component_scales=True).double()
    matern.lengthscale = torch.tensor([0.5, 1.0, 2.0], dtype=F64).expand(*batch, 1, 3)
    kernel.component_scales = torch.tensor([0.4, 1.3, 0.9], dtype=F64).expand(*batch, 1, 3)
    kernel.outputscale = 1.7
    return kernel


def test_first_order_newton_girard_equals_the_pair_engine():
    """K(X, X) V, K(X, Z) V and every gradient (inputs, V, lengthscales, component scales, order
    variance) of a first-order Newton-Girard kernel with batch shape (2,), float64: the structured
    engine (chosen by 'auto') equals the compiled pair engine to 1e-12, and gradcheck passes.
    OAK's first order stays on the pair engines (its terms are differences of the size of their
    variance, which the Gauss transform's absolute bound does not resolve)."""
    g = torch.Generator().manual_seed(13)
    x, z = torch.randn(2, 300, 3, generator=g, dtype=F64), torch.randn(2, 200, 3, generator=g, dtype=F64)
    v = torch.randn(2, 300, 2, generator=g, dtype=F64)
    results = {}
    for engine in ("auto", "cpu"):
        kernel = _first_order_kernel(torch.Size([2]))
        leaves = [x.clone().requires_grad_(), z.clone().requires_grad_(), v.clone().requires_grad_()]
        with settings.engine(engine), settings.max_dense_bytes(0):
            op = kernel(leaves[0]).evaluate_kernel()
            if engine == "auto":
                assert backend.engine_for(op.covar_func, op.x1, op.x2, op.tensor_params) == "structured"
            outs = [kernel(leaves[0]) @ leaves[2], kernel(leaves[0], leaves[1]) @ leaves[2][:, :200]]
            loss = sum((o * o.detach().sin()).sum() for o in outs)
            grads = torch.autograd.grad(loss, leaves + list(kernel.parameters()))
        results[engine] = [o.detach() for o in outs] + list(grads)
    for got, expected in zip(results["auto"], results["cpu"]):
        assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-12
    kernel = _first_order_kernel(torch.Size([]))
    a = torch.randn(7, 3, generator=g, dtype=F64, requires_grad=True)
    b = torch.randn(7, 2, generator=g, dtype=F64, requires_grad=True)
    with settings.engine("structured"), settings.max_dense_bytes(0):
        assert torch.autograd.gradcheck(lambda p, q: kernel(p) @ q, (a, b), atol=1e-7)
    oak = lazykern.OrthogonalAdditiveKernel(num_dims=3, max_degree=1).double()(x[0]).evaluate_kernel()
    assert backend.engine_for(oak.covar_func, oak.x1, oak.x2, oak.tensor_params) == "cpu"
