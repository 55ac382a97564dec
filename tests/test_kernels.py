"""Lazy kernels against dense references from the math: values and gradients, float64.

Every structure runs on the torch and CPU engines (the combinatorics); KeOps, which compiles each
formula and each of its gradients for 5-15 s, runs the product and the fused gradient of K(X, X)
(the path of GP training on a GPU) of every family's additive formula and of two full-dimensional
ones (the exponential profile and a Matérn), all in one formula, their sum, with KeOps' own autograd
checked on one formula."""

from __future__ import annotations

import gpytorch
import pytest
import torch

import lazykern
from lazykern import settings

from . import reference

D = 3
N, M = 23, 17  # small: engines are forced explicitly, so the size thresholds do not matter here
FAMILIES = ["rbf", "matern0.5", "matern1.5", "matern2.5", "rq", "periodic"]
ENGINES = ["torch", "cpu"]


def make_base(family: str, ard: bool, batch_shape=torch.Size()) -> gpytorch.kernels.Kernel:
    kw = dict(ard_num_dims=D if ard else None, batch_shape=batch_shape)
    if family.startswith("matern"):
        base = lazykern.MaternKernel(nu=float(family[len("matern") :]), **kw)
    else:
        base = {"rbf": lazykern.RBFKernel, "rq": lazykern.RQKernel, "periodic": lazykern.PeriodicKernel}[family](**kw)
    base = base.double()
    # Distinct, non-default hyperparameters so that a mix-up between dimensions or parameters shows.
    shape = base.raw_lengthscale.shape
    base.lengthscale = torch.linspace(0.6, 1.7, shape[-1], dtype=torch.float64).expand(shape)
    if family == "rq":
        base.alpha = torch.full_like(base.alpha, 1.3)
    if family == "periodic":
        base.period_length = torch.linspace(1.1, 2.3, shape[-1], dtype=torch.float64).expand(shape)
    return base


def reference_of(kernel: gpytorch.kernels.Kernel, x1, x2, diag=False):
    additive = isinstance(kernel, lazykern.AdditiveStructureKernel)
    base = kernel.base_kernel if additive else kernel
    family = type(base).__name__.replace("Kernel", "").lower()
    return reference.kernel(
        family,
        x1,
        x2,
        base.lengthscale,
        additive=additive,
        scales=kernel.component_scales if additive else None,
        nu=getattr(base, "nu", None),
        alpha=getattr(base, "alpha", None),
        period=getattr(base, "period_length", None),
        diag=diag,
    )


def make_kernel(family: str, structure: str, batch_shape=torch.Size()):
    """structure: 'full-shared', 'full-ard', 'additive-shared', 'additive-ard', 'additive-ard-scales'."""
    base = make_base(family, ard="ard" in structure, batch_shape=batch_shape)
    if structure.startswith("full"):
        return base
    kernel = lazykern.AdditiveStructureKernel(base, num_dims=D, component_scales=structure.endswith("scales")).double()
    if structure.endswith("scales"):
        kernel.component_scales = torch.linspace(0.5, 2.0, D, dtype=torch.float64).expand_as(kernel.component_scales)
    return kernel


STRUCTURES = ["full-shared", "full-ard", "additive-shared", "additive-ard", "additive-ard-scales"]


def _inputs(*batch):
    x1 = torch.randn(*batch, N, D, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(*batch, M, D, dtype=torch.float64, requires_grad=True)
    return x1, x2


def _grads(out: torch.Tensor, weights: torch.Tensor, tensors):
    return torch.autograd.grad((out * weights).sum(), tensors)


def assert_close(actual, expected, rtol=1e-10):
    scale = expected.abs().max().clamp_min(1e-300)
    err = (actual - expected).abs().max() / scale
    assert err <= rtol, f"relative error {err.item():.3e} > {rtol}"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("family", FAMILIES)
def test_matvec_values_and_gradients(family, structure, engine):
    kernel = make_kernel(family, structure)
    x1, x2 = _inputs()
    rhs = torch.randn(M, 2, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(N, 2, dtype=torch.float64)
    params = [p for p in kernel.parameters()]
    with settings.engine(engine), settings.max_dense_bytes(0):
        out = kernel(x1, x2) @ rhs
        grads = _grads(out, weights, [x1, x2, rhs, *params])
    expected = reference_of(kernel, x1, x2) @ rhs
    expected_grads = _grads(expected, weights, [x1, x2, rhs, *params])
    assert_close(out, expected)
    for g, e in zip(grads, expected_grads):
        assert_close(g, e)


@pytest.mark.parametrize("structure", ["full-ard", "additive-ard-scales"])
@pytest.mark.parametrize("family", FAMILIES)
def test_diag_and_dense(family, structure):
    kernel = make_kernel(family, structure)
    x1 = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    x2 = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    params = list(kernel.parameters())
    diag = kernel(x1, x2, diag=True)
    expected = reference_of(kernel, x1, x2, diag=True)
    assert diag.shape == (N,)
    assert_close(diag, expected)
    w = torch.randn(N, dtype=torch.float64)
    for g, e in zip(_grads(diag, w, [x1, x2, *params]), _grads(expected, w, [x1, x2, *params])):
        assert_close(g, e)
    dense = kernel(x1, x2).to_dense()
    assert_close(dense, reference_of(kernel, x1, x2))


@pytest.mark.parametrize("engine", ENGINES)
def test_batch_shape(engine):
    """A batch of two kernels (batched inputs and hyperparameters): products, gradients, diagonal."""
    kernel = make_kernel("rbf", "additive-ard-scales", batch_shape=torch.Size([2]))
    x1, x2 = _inputs(2)
    rhs = torch.randn(2, M, 2, dtype=torch.float64)
    weights = torch.randn(2, N, 2, dtype=torch.float64)
    params = list(kernel.parameters())
    with settings.engine(engine), settings.max_dense_bytes(0):
        op = kernel(x1, x2)
        assert op.shape == (2, N, M)
        out = op @ rhs
        grads = _grads(out, weights, [x1, x2, *params])
    expected = reference_of(kernel, x1, x2) @ rhs
    assert_close(out, expected)
    for g, e in zip(grads, _grads(expected, weights, [x1, x2, *params])):
        assert_close(g, e)
    assert_close(kernel(x1, x1, diag=True), reference_of(kernel, x1, x1, diag=True))


@pytest.mark.slow
def test_keops_batch_product():
    kernel = make_kernel("rbf", "additive-ard-scales", batch_shape=torch.Size([2]))
    x1, x2 = _inputs(2)
    rhs = torch.randn(2, M, 2, dtype=torch.float64)
    with torch.no_grad(), settings.engine("keops"), settings.max_dense_bytes(0):
        assert_close(kernel(x1, x2) @ rhs, reference_of(kernel, x1, x2) @ rhs)


def test_auto_engine_dispatches_on_device_formula_and_size(monkeypatch):
    """CPU tensors: lazykern's CPU engine at any size; where it does not apply, KeOps from
    ``keops_min_size`` points on both sides and the torch engine below."""
    from lazykern import backend

    calls = []
    monkeypatch.setattr(backend.KEOPS, "matmul", lambda *a: calls.append("keops") or backend.TORCH.matmul(*a))
    kernel = make_kernel("rbf", "additive-ard")
    x_small, x_large = torch.randn(20, D, dtype=torch.float64), torch.randn(40, D, dtype=torch.float64)
    rhs = torch.randn(40, 1, dtype=torch.float64)
    op = kernel(x_small, x_large).evaluate_kernel()
    assert backend.engine_for(op.covar_func, op.x1, op.x2, op.tensor_params) == "cpu"
    with settings.keops_min_size(30), settings.max_dense_bytes(0):
        monkeypatch.setattr(backend.CPU, "supports", lambda *a: False)  # as for CUDA tensors
        kernel(x_small, x_large) @ rhs
        assert calls == []
        kernel(x_large, x_large) @ rhs
        assert calls == ["keops"]


def test_gradcheck_torch_engine():
    kernel = make_kernel("matern1.5", "additive-ard-scales")
    x1, x2 = _inputs()
    rhs = torch.randn(M, 1, dtype=torch.float64)
    ls = kernel.base_kernel.raw_lengthscale

    def f(a, b, raw):
        kernel.base_kernel.raw_lengthscale.data.copy_(raw.detach())
        base = kernel.base_kernel
        scaled = lambda x: x / torch.nn.functional.softplus(raw)  # noqa: E731
        from lazykern.operators import LazyKernelOperator

        op = LazyKernelOperator(
            scaled(a), scaled(b), covar_func=kernel.formula, scales=kernel.component_scales.detach()
        )
        del base
        return op @ rhs

    with settings.engine("torch"):
        assert torch.autograd.gradcheck(f, (x1, x2, ls.detach().clone().requires_grad_()))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("family", ["matern0.5", "matern1.5", "matern2.5"])
def test_matern_gradients_finite_at_coincident_points(family, engine):
    kernel = make_kernel(family, "full-ard")
    additive = make_kernel(family, "additive-ard")
    x = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    rhs = torch.randn(N, 2, dtype=torch.float64)
    for k in (kernel, additive):
        with settings.engine(engine), settings.max_dense_bytes(0):
            out = k(x, x) @ rhs
            grads = torch.autograd.grad(out.sum(), [x, *k.parameters()])
        assert all(torch.isfinite(g).all() for g in grads)
        assert_close(out, reference_of(k, x, x) @ rhs, rtol=1e-12)


def test_get_indices_and_rows():
    kernel = make_kernel("rq", "additive-ard-scales")
    x = torch.randn(N, D, dtype=torch.float64)
    op, dense = kernel(x), reference_of(kernel, x, x)
    rows, cols = torch.tensor([0, 5, 7]), torch.tensor([3, 5, 1])
    assert_close(op[rows, cols], dense[rows, cols])
    assert_close(op[2:9].to_dense(), dense[2:9])
    assert_close(op.diagonal(), dense.diagonal())


def test_non_contiguous_inputs():
    kernel = make_kernel("periodic", "additive-ard-scales")
    x1 = torch.randn(D, N, dtype=torch.float64).t()
    x2 = torch.randn(M, 2 * D, dtype=torch.float64)[:, ::2]
    rhs = torch.randn(M, 2, dtype=torch.float64)
    for engine in ENGINES:
        with settings.engine(engine), settings.max_dense_bytes(0):
            assert_close(kernel(x1, x2) @ rhs, reference_of(kernel, x1, x2) @ rhs)


def test_accepts_gpytorch_base_kernels_and_trains_their_hyperparameters():
    base = gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=D).double()
    kernel = lazykern.AdditiveStructureKernel(base, num_dims=D)
    x = torch.randn(N, D, dtype=torch.float64)
    out = (kernel(x) @ torch.ones(N, 1, dtype=torch.float64)).sum()
    out.backward()
    assert base.raw_lengthscale.grad is not None and base.raw_lengthscale.grad.abs().sum() > 0
    assert_close(kernel(x).to_dense(), reference_of(kernel, x, x))


def test_active_dims_select_columns():
    base = lazykern.RBFKernel(ard_num_dims=D).double()
    kernel = lazykern.AdditiveStructureKernel(base, num_dims=D, active_dims=(0, 2, 4))
    x = torch.randn(N, 5, dtype=torch.float64)
    assert_close(kernel(x).to_dense(), reference_of(kernel, x[:, [0, 2, 4]], x[:, [0, 2, 4]]))


def test_float32_matches_float64():
    kernel = make_kernel("rbf", "additive-ard-scales")
    x = torch.randn(N, D, dtype=torch.float64)
    rhs = torch.randn(N, 2, dtype=torch.float64)
    expected = reference_of(kernel, x, x) @ rhs
    kernel32 = kernel.float()
    for engine in ENGINES:
        with settings.engine(engine), settings.max_dense_bytes(0):
            out = kernel32(x.float()) @ rhs.float()
        assert out.dtype == torch.float32
        assert_close(out.double(), expected.detach(), rtol=1e-5)


#: The terms of the one formula the KeOps tests below share: every family's additive kernel
#: (component scales, per-dimension lengthscales) and two full-dimensional ones.
KEOPS_TERMS = [(f, "additive-ard-scales") for f in FAMILIES] + [("rbf", "full-ard"), ("matern1.5", "full-ard")]


@pytest.mark.parametrize("family, structure", KEOPS_TERMS)
@pytest.mark.slow
def test_keops_product_and_fused_gradient(family, structure, monkeypatch):
    """Each formula family on KeOps as GP training runs it: K(X, X) @ V against the dense reference,
    and its gradient (X through both sides, every hyperparameter) in one fused reduction against the
    torch engine's (checked against the reference above; the reference's own gradient is NaN where
    a Matérn distance is 0, on the diagonal). Every case runs the same formula, the sum of all
    :data:`KEOPS_TERMS`, and checks its own term's hyperparameters: one formula is two KeOps
    compiles where a formula per family was sixteen (14 s against 91 s from an empty cache)."""
    from lazykern import backend

    fused_calls = []
    fused = backend.symmetric_gradients
    monkeypatch.setattr(backend, "symmetric_gradients", lambda *a: fused_calls.append(1) or fused(*a))
    terms = [make_kernel(*term) for term in KEOPS_TERMS]
    kernel = sum(terms[1:], terms[0])
    term = terms[KEOPS_TERMS.index((family, structure))]
    x = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    rhs = torch.randn(N, 2, dtype=torch.float64)
    weights = torch.randn(N, 2, dtype=torch.float64)
    params = list(term.parameters())
    with settings.engine("keops"), settings.max_dense_bytes(0):
        out = kernel(x, x) @ rhs
        grads = _grads(out, weights, [x, *params])
    assert fused_calls == [1]
    assert_close(out, sum(reference_of(t, x, x) for t in terms) @ rhs)
    with settings.engine("torch"), settings.max_dense_bytes(0):
        expected = _grads(term(x, x) @ rhs, weights, params)
        expected_x = _grads(kernel(x, x) @ rhs, weights, [x])
    for g, e in zip(grads, [*expected_x, *expected]):
        assert torch.isfinite(g).all()
        assert_close(g, e)


@pytest.mark.slow
def test_keops_autograd_of_a_product():
    """K(X1, X2) @ V on KeOps with KeOps' own autograd (gradients of both inputs, the right-hand
    side and every hyperparameter), for one formula: the plumbing is the same for every family."""
    kernel = make_kernel("rbf", "additive-ard-scales")
    x1, x2 = _inputs()
    rhs = torch.randn(M, 2, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(N, 2, dtype=torch.float64)
    params = list(kernel.parameters())
    with settings.engine("keops"), settings.max_dense_bytes(0):
        out = kernel(x1, x2) @ rhs
        grads = _grads(out, weights, [x1, x2, rhs, *params])
    expected = reference_of(kernel, x1, x2) @ rhs
    assert_close(out, expected)
    for g, e in zip(grads, _grads(expected, weights, [x1, x2, rhs, *params])):
        assert_close(g, e)


def _relative_imports(package: str) -> dict[str, list[tuple[str, list[str]]]]:
    """For each module of ``package``: the sibling modules it imports (at any depth, function bodies
    included) and the names it takes from each."""
    import ast
    import importlib
    from pathlib import Path

    folder = Path(importlib.import_module(package).__file__).parent
    found = {}
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        found[path.stem] = [
            (node.module.split(".")[0], [alias.name for alias in node.names])
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        ]
    return found


def test_kernel_modules_import_without_a_circle():
    imports = {m: {target for target, _ in found} for m, found in _relative_imports("lazykern.kernels").items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, "import circle: " + " -> ".join(path + (module,))
        if module not in done:
            for target in imports.get(module, ()):
                visit(target, path + (module,))
            done.add(module)

    for module in imports:
        visit(module, ())


@pytest.mark.parametrize("package", ["lazykern.kernels", "lazykern.formulas"])
def test_no_module_imports_a_private_name_of_another(package):
    private = [(module, target, name) for module, found in _relative_imports(package).items()
               for target, names in found for name in names if name.startswith("_")]
    assert private == []
