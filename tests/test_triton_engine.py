"""lazykern's Triton engine (lazykern.triton) under Triton's interpreter, on CPU tensors, against
dense float64 references from the math (tests/reference.py, tests/reference_interactions.py).

``TRITON_INTERPRET=1`` runs the generated ``@triton.jit`` kernels with NumPy, exactly and slowly
(a pass over 23 x 17 pairs takes 0.2-1.5 s), so the sizes are tiny and the formulas few: the
formula-level cases of tests/test_cpu_engine.py (D = 3), and the kernels users hold at D = 3.
``TRITON_INTERPRET`` must be set before triton is imported: triton's own ``tl.sum``, ``tl.zeros``...
are ``@triton.jit`` functions, interpreted only when defined under it. This module sets it when it
is imported (collected); in a process that imported triton earlier without it, the module skips.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (see the module docstring)

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton", reason="the Triton engine's tests need the triton package (the dev extra)")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if not isinstance(triton.language.standard.sum, InterpretedFunction):
    pytest.skip("triton was imported in this process before TRITON_INTERPRET=1 was set; run this file on its own",
                allow_module_level=True)

import gpytorch  # noqa: E402

import lazykern  # noqa: E402
from lazykern import backend, settings  # noqa: E402
from lazykern import triton as lk_triton  # noqa: E402
from lazykern.formulas import StationaryFormula  # noqa: E402
from lazykern.triton import build, reductions  # noqa: E402

from . import reference  # noqa: E402
from . import test_cpu_engine as cases  # noqa: E402  (its helpers, not its tests)
from . import test_interactions as interactions  # noqa: E402
from . import test_kernels as kernel_cases  # noqa: E402
from .test_cpu_engine import assert_close, grads  # noqa: E402

DT = torch.float64
D, N, M = cases.D, cases.N, cases.M
STATIONARY = ["rbf-additive", "matern1.5-additive", "rq-additive", "periodic-additive"]
INTERACTIONS = ["newton-girard-all", "orthogonal-2", "group"]  # R = D = 3


@pytest.fixture
def launches(monkeypatch):
    """The passes launched on the Triton engine (by job), to show the engine really ran."""
    jobs: list[str] = []
    launch = reductions.TARGET.launch
    monkeypatch.setattr(reductions.TARGET, "launch", lambda red, *a: jobs.append(red) or launch(red, *a))
    return jobs


# ---------------------------------------------------------------------------- formulas
@pytest.mark.parametrize("case", STATIONARY)
def test_matmul_values_and_gradients_with_a_batch(case, launches):
    """K @ V of a (2,)-batch and its gradients for x1, x2, V and every hyperparameter (chained
    back through the input transform), component scales included; more rows and points than one
    interpreter tile (32), so partial tiles are masked."""
    hp = cases.hyperparameters()
    x1, x2 = cases.inputs(2, n=40, m=35)
    rhs = torch.randn(2, 35, 3, dtype=DT, requires_grad=True)
    tensors = [x1, x2, rhs, *cases.used(case, hp)]
    formula, a, b, params = cases.formula_args(case, x1, x2, hp)
    out = lk_triton.ENGINE.matmul(formula, a, b, params, rhs)
    expected = cases.reference_kernel(case, x1, x2, hp) @ rhs
    assert_close(out, expected)
    weights = torch.randn_like(out)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e)
    assert len(launches) == 3  # forward, and the backward passes over rows of x1 and of x2


@pytest.mark.parametrize("case", INTERACTIONS)
def test_interaction_matmul_dense_and_fused_gradients(case, launches):
    """Newton-Girard (all R = 3 orders), OAK and a group-additive formula: K(x1, x2) @ V with its
    gradients, K(x, x) dense with its one-pass backward, and the fused symmetric gradient."""
    hp = cases.interaction_hyperparameters()
    leaves = cases.interaction_leaves(case, hp)
    x1, x2 = cases.inputs()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    formula, a, b, params = cases.interaction_args(case, x1, x2, hp)
    out = lk_triton.ENGINE.matmul(formula, a, b, params, rhs)
    expected = cases.interaction_reference(case, x1, x2, hp) @ rhs
    assert_close(out, expected)
    weights = torch.randn_like(out)
    for g, e in zip(grads(out, weights, [x1, x2, rhs, *leaves]), grads(expected, weights, [x1, x2, rhs, *leaves])):
        assert_close(g, e)

    formula, a, _, params = cases.interaction_args(case, x1, x1, hp)
    K = lk_triton.ENGINE.dense(formula, a, a, params)
    expected = cases.interaction_reference(case, x1, x1, hp)
    assert_close(K, expected)
    weights = torch.randn(N, N, dtype=DT)
    for g, e in zip(grads(K, weights, [x1, *leaves]), grads(expected, weights, [x1, *leaves])):
        assert_close(g, e)

    left, right = torch.randn(N, 2, dtype=DT), torch.randn(N, 2, dtype=DT)
    formula, a, _, params = cases.interaction_args(case, x1, x1, hp)
    gx, _, gp = lk_triton.ENGINE.symmetric_gradients(formula, a, a, params, left, right)
    outputs = [(a, gx)] + [(p, gp[n]) for n, p in params.items() if p.requires_grad]
    actual = torch.autograd.grad([o for o, _ in outputs], [x1, *leaves], [g for _, g in outputs])
    S = (left @ right.T * cases.interaction_reference(case, x1, x1, hp)).sum()
    for g, e in zip(actual, torch.autograd.grad(S, [x1, *leaves])):
        assert_close(g, e)
    assert [red.store is not None for red in launches].count(True) == 1  # one dense pass


def test_gradcheck_and_float32():
    formula = StationaryFormula("rbf", additive=True)
    x1 = torch.randn(4, 2, dtype=DT, requires_grad=True)
    x2 = torch.randn(3, 2, dtype=DT)  # (the pass over rows of x2 is checked against references above)
    scales = torch.tensor([[0.7, 1.3]], dtype=DT, requires_grad=True)
    rhs = torch.randn(3, 1, dtype=DT, requires_grad=True)
    product = lambda a, s, v: lk_triton.ENGINE.matmul(formula, a, x2, {"scales": s}, v)  # noqa: E731
    assert torch.autograd.gradcheck(product, (x1, scales, rhs))
    # Second derivatives (create_graph=True) take the torch engine's row blocks, as on the C target.
    assert torch.autograd.gradgradcheck(lambda a, s: lk_triton.ENGINE.matmul(formula, a, x2, {"scales": s}, rhs.detach()),
                                        (x1, scales))
    single = lk_triton.ENGINE.matmul(formula, x1.float(), x2.float(), {"scales": scales.float()}, rhs.float())
    assert single.dtype == torch.float32
    assert_close(single.double(), lk_triton.ENGINE.matmul(formula, x1, x2, {"scales": scales}, rhs), rtol=1e-5)


@pytest.mark.parametrize("which", ["uneven", "one-sided-orders"])
def test_other_operations_match_the_cpu_target(which):
    """Formulas outside lazykern's kernels: an asymmetric one using log, sin, cos, constant powers,
    abs, relu, rsqrt and concatenations, and the recurrence on one side only (computed once per
    row): the Triton target gives the C target's products and gradients (both generated from one
    plan; the C target is checked against references in tests/test_cpu_engine.py)."""
    x1, x2 = cases.inputs()
    rhs = torch.randn(M, 2, dtype=DT, requires_grad=True)
    if which == "uneven":
        formula = cases.uneven
        params = {"p": torch.tensor([[0.7]], dtype=DT, requires_grad=True),
                  "q": torch.rand(1, D - 1, dtype=DT).add(0.2).requires_grad_()}
    else:
        formula, params = cases.one_sided_orders, {"weights": torch.rand(1, D, dtype=DT).add(0.5).requires_grad_()}
    tensors = [x1, x2, rhs, *params.values()]
    out = lk_triton.ENGINE.matmul(formula, x1, x2, params, rhs)
    expected = cases.cpu.ENGINE.matmul(formula, x1, x2, params, rhs)
    assert_close(out, expected, rtol=1e-12)
    weights = torch.randn_like(out)
    for g, e in zip(grads(out, weights, tensors), grads(expected, weights, tensors)):
        assert_close(g, e, rtol=1e-12)


def test_sobol_inner_products_match_the_cpu_target():
    """The L2(p) inner products of OAK's Sobol indices (component analysis on a GPU), with an input
    28.6 standard deviations out at a short lengthscale: the overflow guard's branches run in both
    targets' generated code, from one plan."""
    from lazykern.formulas.interactions import InteractionFormula, orthogonal_rbf_l2_features

    x = torch.randn(12, D, dtype=DT)
    x[0, 0] = 28.6
    lengthscale = torch.tensor([[0.04, 0.7, 300.0]], dtype=DT)
    features = orthogonal_rbf_l2_features(x, lengthscale, torch.zeros(1, D, dtype=DT), torch.ones(1, D, dtype=DT))
    formula = InteractionFormula(StationaryFormula("rbf"), 2, "orthogonal-l2")
    params = {"order_variances": torch.tensor([[0.6, 0.4]], dtype=DT), "scales": torch.ones(1, D, dtype=DT)}
    rhs = torch.randn(12, 1, dtype=DT)
    out = lk_triton.ENGINE.matmul(formula, features, features, params, rhs)
    assert torch.isfinite(out).all()
    assert_close(out, cases.cpu.ENGINE.matmul(formula, features, features, params, rhs), rtol=1e-12)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's log of masked-out lanes
@pytest.mark.parametrize("power", [17, -1, -3])
def test_integer_powers_of_negative_numbers_match_the_cpu_target(power):
    """Integer exponents the tracer does not multiply out (-1, beyond 16) at negative bases: defined,
    as C's pow (e^(p log a) alone gave NaN)."""
    x, z = torch.randn(N, D, dtype=DT), torch.randn(M, D, dtype=DT)
    v = torch.randn(M, 2, dtype=DT)

    def formula(a, b):
        return (a - b).sum(-1) ** power

    expected = ((x[:, None] - z[None]).sum(-1) ** power) @ v
    assert_close(lk_triton.ENGINE.matmul(formula, x, z, {}, v), expected)


def test_declines_what_it_cannot_run():
    x = torch.randn(5, 3, dtype=DT)
    f = StationaryFormula("rbf")
    assert lk_triton.ENGINE.supports(f, x, x, {}) and not lk_triton.ENGINE.supports(f, x, x.float(), {})
    assert not lk_triton.ENGINE.supports(lambda a, b: (a - b).sinh().sum(-1), x, x, {})
    with pytest.raises(ValueError, match="Triton engine cannot evaluate this formula"):
        lk_triton.ENGINE.matmul(lambda a, b: (a - b).sinh().sum(-1), x, x, {}, torch.ones(5, 1, dtype=DT))


# ---------------------------------------------------------------------------- as users reach it
def _kernel(kind: str, batch_shape=torch.Size()):
    """A D = 3 kernel with distinct hyperparameters per dimension."""
    ls = torch.linspace(0.6, 1.7, D, dtype=DT)
    if kind.endswith("-additive"):
        return kernel_cases.make_kernel(kind.removesuffix("-additive"), "additive-ard-scales", batch_shape)
    if kind == "product":
        rbf = lazykern.RBFKernel(ard_num_dims=D, batch_shape=batch_shape).double()
        periodic = lazykern.PeriodicKernel(ard_num_dims=D, batch_shape=batch_shape).double()
        periodic.period_length = torch.linspace(1.1, 2.3, D, dtype=DT).expand_as(periodic.period_length)
        periodic.lengthscale = torch.linspace(0.9, 1.4, D, dtype=DT).expand_as(periodic.lengthscale)
        kernel = rbf * periodic
        assert isinstance(kernel, lazykern.ProductKernel)
        rbf.lengthscale = ls.expand_as(rbf.lengthscale)
        return kernel
    else:
        base = lazykern.RBFKernel(ard_num_dims=D, batch_shape=batch_shape).double()
        if kind == "newton-girard":
            kernel = lazykern.NewtonGirardAdditiveKernel(base, D, D, component_scales=True).double()
            kernel.component_scales = torch.linspace(0.5, 2.0, D, dtype=DT).expand_as(kernel.component_scales)
        elif kind == "orthogonal":
            kernel = lazykern.OrthogonalAdditiveKernel(D, 2, batch_shape=batch_shape).double()
            kernel.measure_mean = torch.full((1, D), 0.2, dtype=DT)
            kernel.measure_std = torch.linspace(0.7, 1.2, D, dtype=DT).reshape(1, D)
            base = kernel.base_kernel
        else:
            kernel = lazykern.GroupAdditiveKernel(base, ((0, 1), (1, 2)), num_dims=D, component_scales=True).double()
            kernel.component_scales = torch.tensor([0.7, 1.3], dtype=DT).expand_as(kernel.component_scales)
        base.lengthscale = ls.expand_as(base.lengthscale)
        if kind != "group":
            kernel.outputscale = torch.linspace(0.3, 0.9, kernel.raw_outputscale.shape[-1], dtype=DT).expand_as(
                kernel.outputscale)
    return kernel


def _reference(kernel, x1, x2):
    if isinstance(kernel, lazykern.ProductKernel):
        rbf, periodic = kernel.kernels
        return reference.kernel("rbf", x1, x2, rbf.lengthscale, additive=False) * reference.kernel(
            "periodic", x1, x2, periodic.lengthscale, additive=False, period=periodic.period_length)
    if isinstance(kernel, lazykern.AdditiveStructureKernel) and not hasattr(kernel, "max_degree"):
        return kernel_cases.reference_of(kernel, x1, x2)
    return interactions.reference_of(kernel, x1, x2)


KINDS = [*(f"{family}-additive" for family in ("rbf", "matern2.5", "rq", "periodic")), "newton-girard", "orthogonal",
         "group", "product"]


@pytest.mark.parametrize("kind", KINDS)
def test_kernel_of_x_products_dense_diagonal_and_gradients(kind, launches):
    """``kernel(X1, X2)`` and ``kernel(X)`` (GPyTorch's lazily evaluated wrapper) under
    ``engine("triton")``: the product and its gradients for the inputs and every hyperparameter
    (lengthscales, component scales, order variances), the dense matrix and the diagonal. (The
    gradients at distinct points: the Matern reference's sqrt has no derivative at distance 0.)"""
    kernel = _kernel(kind)
    x1, x2 = (torch.randn(N, D, dtype=DT, requires_grad=True) for _ in range(2))
    rhs = torch.randn(N, 2, dtype=DT)
    tensors = [x1, x2, *kernel.parameters()]
    expected = _reference(kernel, x1, x2)
    with settings.engine("triton"), settings.max_dense_bytes(0):
        lazy = kernel(x1, x2)
        assert isinstance(lazy, gpytorch.lazy.LazyEvaluatedKernelTensor)
        out = lazy @ rhs
        weights = torch.randn_like(out)
        actual = grads(out, weights, tensors)
        dense = kernel(x1).to_dense()
        diag = kernel(x1, x2, diag=True)
    assert_close(out, expected @ rhs)
    for g, e in zip(actual, grads(expected @ rhs, weights, tensors)):
        assert_close(g, e)
    assert_close(dense, _reference(kernel, x1, x1))
    assert_close(diag, expected.diagonal())  # (diagonals are elementwise: the torch engine's, any device)
    assert launches, "nothing ran on the Triton engine"


def test_exact_gp_mll_backward_with_a_batch(launches):
    """One MLL ``backward()`` of a (2,)-batch ExactGP with a Newton-Girard kernel on the Triton
    engine: the gradients of every raw hyperparameter equal those of the dense reference MLL."""

    class GP(gpytorch.models.ExactGP):
        def __init__(self, x, y, kernel):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([2])))
            self.mean, self.covar = gpytorch.means.ZeroMean(), kernel

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))

    x = torch.randn(2, N, D, dtype=DT)
    y = torch.randn(2, N, dtype=DT)
    model = GP(x, y, _kernel("newton-girard", torch.Size([2]))).double()
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with settings.engine("triton"):
        mll(model(x), y).sum().backward()
    actual = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    cov = _reference(model.covar, x, x) + model.likelihood.noise.unsqueeze(-1) * torch.eye(N, dtype=DT)
    torch.distributions.MultivariateNormal(torch.zeros(2, N, dtype=DT), cov).log_prob(y).div(N).sum().backward()
    for name, p in model.named_parameters():
        assert_close(actual[name], p.grad)
    assert launches, "nothing ran on the Triton engine"


def test_gp_backward_takes_the_fused_symmetric_gradient(monkeypatch):
    """A backward pass through ``kernel(X)`` on the Triton engine takes the one fused pass for
    K(X, X) (as on the CPU engine), with the gradients of the three-pass way."""
    fused = []
    symmetric = backend.symmetric_gradients
    def counted(*args):  # counts the fused passes that ran (None: the chosen engine has none)
        result = symmetric(*args)
        if result is not None:
            fused.append(1)
        return result

    monkeypatch.setattr(backend, "symmetric_gradients", counted)
    kernel = _kernel("rbf-additive", torch.Size([2]))
    x = torch.randn(2, N, D, dtype=DT, requires_grad=True)
    rhs = torch.randn(2, N, 2, dtype=DT)
    tensors = [x, *kernel.parameters()]
    got = {}
    for engine in ("triton", "torch"):
        with settings.engine(engine), settings.max_dense_bytes(0):
            got[engine] = grads(kernel(x) @ rhs, rhs, tensors)
    assert fused == [1]
    for g, e in zip(*got.values()):
        assert_close(g, e)


def test_backend_dispatches_forced_triton(launches):
    x = torch.randn(N, D, dtype=DT)
    f, s = StationaryFormula("rbf", additive=True), {"scales": torch.ones(1, D, dtype=DT)}
    with settings.engine("triton"):
        assert backend.engine_for(f, x, x, s) == "triton"
        assert_close(backend.pairwise_matmul(f, x, x, s, torch.ones(N, dtype=DT)),
                     reference.kernel("rbf", x, x, torch.ones(1, D, dtype=DT), additive=True).sum(-1))
    assert len(launches) == 1 and build.interpreted()


def test_ntk_symbolic_product_runs_on_the_triton_engine(launches, monkeypatch):
    """The NTK's symbolic backend (``"keops"``) on the engine :func:`lazykern.backend.preferred`
    picks: where that is Triton (a GPU whose KeOps fails its health check; here the interpreter),
    the trace and full products of pairwise (implicit) layer terms equal the dense backend's."""
    from lazykern.ntk import empirical_ntk

    monkeypatch.setattr(backend, "preferred", lambda name, device: backend.Choice(backend.ENGINES[
        "triton" if name == "keops" else name]))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
    x = torch.randn(6, 3, dtype=DT)
    for mode, rows in (("trace", 6), ("full", 12)):
        v = torch.randn(rows, 2, dtype=DT)
        lazy = empirical_ntk(net, x, mode=mode, backend="keops", forms="implicit") @ v
        assert_close(lazy, empirical_ntk(net, x, mode=mode, backend="dense").to_dense() @ v)
    assert launches, "nothing ran on the Triton engine"


@pytest.mark.slow
def test_generated_kernels_compile_for_a_gpu():
    """The interpreter runs what Triton's compiler may reject: the passes of a product, its backward
    pass over rows of x2, a one-tensor dense backward and the fused gradient of Newton-Girard
    (esym and its vector-Jacobian product) are compiled for sm_90 (H200) down to a cubin with the
    ptxas Triton ships, no GPU needed: in a subprocess, since this one interprets. The kernels do
    not specialize on sizes or batch strides (one compile serves every size)."""
    script = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lazykern.compiler.plan import program
from lazykern.triton import build
from lazykern.triton.codegen import generate
from lazykern.triton.reductions import BLOCK, NUM_WARPS
from lazykern.formulas import InteractionFormula, StationaryFormula
rbf, ng = StationaryFormula("rbf", additive=True), InteractionFormula(StationaryFormula("rbf"), 3)
s, sv = (("scales", 3),), (("scales", 3), ("order_variances", 3))
for f, job, ps, want in [(rbf, "mm", s, ()), (rbf, "gradB", s, ("x", "scales", "rhs")),
                         (rbf, "sym-pair", s, ("x", "scales")), (ng, "sym", sv, ("x", "scales", "order_variances"))]:
    red = program(f, job, 3, 3, ps, "double", want)
    n = len(red.operands())
    sig = {**{f"B{i}": "*fp64" for i in range(n)}, **{f"S{i}": "i32" for i in range(n)}, "N": "i32", "M": "i32",
           "C": "i32", "BLOCK_N": "constexpr", "BLOCK_M": "constexpr", "BLOCK_C": "constexpr", "DT": "constexpr"}
    kernel = build.load(red)
    # one compile for every size: no specialization on sizes or batch strides
    assert all(p.do_not_specialize == (p.name in ("N", "M", "C") or p.name.startswith("S")) for p in kernel.params)
    src = ASTSource(kernel, sig, {"BLOCK_N": BLOCK, "BLOCK_M": BLOCK, "BLOCK_C": 16, "DT": tl.float64})
    options = {"enable_fp_fusion": False, "num_warps": NUM_WARPS}
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    assert out.asm["cubin"]
print("compiled")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
