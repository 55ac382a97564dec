"""GPyTorch's and linear_operator's own test suites, run on lazykern's kernels and operators.

* ``gpytorch.test.base_kernel_test_case.BaseKernelTestCase`` for every lazykern kernel (no-ARD and
  ARD; each base alone, inside ``AdditiveStructureKernel``, and a product), as GPyTorch's own
  kernels pass it, and for :class:`lazykern.ntk.NTKKernel` (default backend, and products through
  the network);
* the checks of GPyTorch's KeOps kernel tests (``gpytorch.test.base_keops_test_case.BaseKeOpsTestCase``,
  which patches GPyTorch's own KeOps module and so cannot be subclassed: the lazy kernel against
  its non-KeOps namesake for ``x1 == x2`` and ``x1 != x2``, diagonals, batches, gradients), plus
  broadcast right-hand sides, with the stricter tolerance of a float64 comparison;
* ``linear_operator.test.linear_operator_test_case.LinearOperatorTestCase`` (square ``K(X, X)``,
  batch) and ``RectangularLinearOperatorTestCase`` (``K(X, Z)``) for ``LazyKernelOperator``.

Modes: KeOps forced with the dense budget at 0 (``keops``), lazykern's CPU engine likewise
(``lazy``), the torch engine likewise (``torch``), and default settings (``default``: the CPU engine
for CPU tensors, dense where the budget allows). The kernel test bases run in ``keops``, ``torch``
and ``default`` (they compare dense matrices and diagonals, which never need a KeOps reduction). The
KeOps checks run on the torch engine and with default settings for every kernel, and forced on
KeOps for the RBF kernel (``test_kernels.py`` runs every family's additive KeOps product and fused
gradient, and KeOps' autograd, whose plumbing is the same for every formula, once),
batched and with default settings at N = 600 for the RBF kernel. The operator suites run the square
``K(X, X)`` in ``lazy``, ``torch`` and ``default``, batch and rectangular operators on the torch
engine and with default settings, all at the suites' own small sizes (see OPERATOR_CASES).

Compile budget: every KeOps test uses D = 3 and float64 like ``test_kernels.py``, whose formulas
(2 right-hand-side columns) the per-family checks share; batched reductions compile a variant of
their own, so only the RBF formula runs them on KeOps; the operator suites use one formula (RQ)
and run lazily on lazykern's CPU engine (``lazy``), the torch engine and with default settings.
"""

from __future__ import annotations

import contextlib
import unittest
import warnings

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase
from torch import nn
from linear_operator.test.linear_operator_test_case import (
    LinearOperatorTestCase,
    RectangularLinearOperatorTestCase,
)

import lazykern
from lazykern import backend, settings
from lazykern.keops import engine as keops_engine
from lazykern.formulas import StationaryFormula
from lazykern.ntk import NTKKernel
from lazykern.operators import LazyKernelOperator

from .test_kernels import FAMILIES, assert_close

F64 = torch.float64
MODES = {
    "keops": lambda: (settings.engine("keops"), settings.max_dense_bytes(0)),
    "lazy": lambda: (settings.engine("cpu"), settings.max_dense_bytes(0)),
    "torch": lambda: (settings.engine("torch"), settings.max_dense_bytes(0)),
    "default": lambda: (),
}


class _InMode:
    """unittest mixin: every test of the class runs inside the settings of ``self.mode``."""

    mode = "default"

    def setUp(self) -> None:
        super().setUp()
        self._mode = contextlib.ExitStack()
        for ctx in MODES[self.mode]():
            self._mode.enter_context(ctx)

    def tearDown(self) -> None:
        self._mode.close()
        super().tearDown()


def _base(family: str, **kwargs):
    if family.startswith("matern"):
        return lazykern.MaternKernel(nu=float(family[len("matern") :]), **kwargs)
    return {"rbf": lazykern.RBFKernel, "rq": lazykern.RQKernel, "periodic": lazykern.PeriodicKernel}[family](**kwargs)


def _build(family: str, structure: str, num_dims, **kwargs):
    if structure == "alone":
        return _base(family, ard_num_dims=num_dims, **kwargs)
    if structure == "product":
        return lazykern.ProductKernel(
            _base(family, ard_num_dims=num_dims, **kwargs), _base("periodic", ard_num_dims=num_dims, **kwargs)
        )
    active_dims = kwargs.pop("active_dims", None)
    return lazykern.AdditiveStructureKernel(
        _base(family, ard_num_dims=num_dims, **kwargs), num_dims=num_dims, active_dims=active_dims
    )


# ------------------------------------------------------------------ GPyTorch's BaseKernelTestCase
class _KernelCase(_InMode, BaseKernelTestCase):
    family = "rbf"
    structure = "alone"

    def create_kernel_no_ard(self, **kwargs):
        return _build(self.family, self.structure, None, **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return _build(self.family, self.structure, num_dims, **kwargs)


KERNEL_CASES = [(f, s) for f in FAMILIES for s in ("alone", "additive")] + [("rbf", "product")]
for _family, _structure in KERNEL_CASES:
    for _mode in ("keops", "torch", "default"):
        _name = f"TestKernelCase_{_family.replace('.', '')}_{_structure}_{_mode}"
        globals()[_name] = type(
            _name, (_KernelCase, unittest.TestCase), {"family": _family, "structure": _structure, "mode": _mode}
        )


class _NTKKernelCase(BaseKernelTestCase):
    """The trace NTK of a small tanh network (no ARD form: the test base's ARD tests return early)."""

    backend = "auto"
    #: The input width of a kernel built without active_dims, by test: the base case's batched data
    #: has 2 columns, and its active-dims tests compare against the 4 or 6 selected columns.
    WIDTH = {"test_active_dims_list": 4, "test_active_dims_range": 6}

    def create_kernel_no_ard(self, active_dims=None, **kwargs):
        width = len(active_dims) if active_dims is not None else self.WIDTH.get(self._testMethodName, 2)
        with torch.random.fork_rng():
            torch.manual_seed(0)  # the kernels one test compares hold the same weights
            net = nn.Sequential(nn.Linear(width, 8), nn.Tanh(), nn.Linear(8, 1))
        return NTKKernel(net, backend=self.backend, active_dims=active_dims, **kwargs)

    @unittest.skip("by design: no parameters of its own, and kernel.to() never converts the user's network")
    def test_kernel_dtype_device(self):
        pass


for _backend in ("auto", "linearized"):
    _name = f"TestNTKKernelCase_{_backend}"
    globals()[_name] = type(_name, (_NTKKernelCase, unittest.TestCase), {"backend": _backend})


# ------------------------------------------------------------------ GPyTorch's KeOps kernel checks
def _twins(family: str, structure: str, ard: bool):
    """A lazykern kernel and its non-KeOps GPyTorch namesake with the same, non-default hyperparameters."""
    d = 3 if ard else None
    mine = _build(family, structure, d).double()
    base = mine if structure == "alone" else mine.base_kernel
    parent = next(c for c in type(base).__mro__ if c.__module__.startswith("gpytorch.kernels"))
    kwargs = {"nu": base.nu} if hasattr(base, "nu") else {}
    if ard:  # GPyTorch's PeriodicKernel breaks on an explicit ard_num_dims=None
        kwargs["ard_num_dims"] = d
    theirs_base = parent(**kwargs).double()
    base.lengthscale = torch.linspace(0.7, 1.6, base.raw_lengthscale.shape[-1], dtype=F64)
    if family == "rq":
        base.alpha = 1.3
    if family == "periodic":
        base.period_length = torch.linspace(1.2, 2.1, base.raw_lengthscale.shape[-1], dtype=F64)
    theirs_base.load_state_dict(base.state_dict())
    if structure == "alone":
        return mine, theirs_base
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # GPyTorch deprecates its additive kernel
        return mine, gpytorch.kernels.AdditiveStructureKernel(theirs_base, num_dims=3).double()


def _rtol(family: str) -> float:
    # GPyTorch computes distances as |x|^2 - 2 x.x' + |x'|^2, which cancels near coincident points
    # (error ~1e-8 in r): visible only where k has a kink at r = 0. test_kernels.py holds lazykern
    # to 1e-10 against references from the math there.
    return 1e-7 if family == "matern0.5" else 1e-10


@contextlib.contextmanager
def _keops_must_run(mode: str, monkeypatch):
    """Record the lazy engines that ran (``"keops"``: a ``keops_session``, ``"cpu"``: an engine pass); in the keops
    mode the check must have used KeOps."""
    calls = []
    session = keops_engine.keops_session
    monkeypatch.setattr(keops_engine, "keops_session", lambda: calls.append("keops") or session())
    for name in ("matmul", "symmetric_gradients"):
        original = getattr(backend.CPU, name)
        monkeypatch.setattr(backend.CPU, name, lambda *a, _f=original: calls.append("cpu") or _f(*a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with contextlib.ExitStack() as stack:
            for ctx in MODES[mode]():
                stack.enter_context(ctx)
            yield calls
    if mode == "keops":
        assert "keops" in calls, "the KeOps engine never ran"


KEOPS_CHECKS = [(f, s, a) for f in FAMILIES for s in ("alone", "additive") for a in (False, True)]
#: (family, structure, ard, mode): every kernel on the torch engine and with default settings, the
#: RBF kernel forced on KeOps (compile budget, see the module docstring).
MODE_CHECKS = [(*case, mode) for case in KEOPS_CHECKS for mode in ("keops", "torch", "default")
               if mode != "keops" or case[:2] == ("rbf", "alone")]
MODE_IDS = [f"{f}-{s}-{'ard' if a else 'shared'}-{m}" for f, s, a, m in MODE_CHECKS]


@pytest.mark.parametrize("family, structure, ard, mode", MODE_CHECKS, ids=MODE_IDS)
def test_keops_checks_forward_x1_eq_x2_and_neq(family, structure, ard, mode, monkeypatch):
    mine, theirs = _twins(family, structure, ard)
    x1, x2 = torch.randn(100, 3, dtype=F64), torch.randn(50, 3, dtype=F64)
    with _keops_must_run(mode, monkeypatch):
        for a, b in ((x1, x1), (x1, x2)):
            rhs = torch.randn(b.shape[0], 2, dtype=F64)
            with torch.no_grad():
                assert_close(mine(a, b) @ rhs, theirs(a, b).to_dense() @ rhs, rtol=_rtol(family))
                assert_close(mine(a, b).to_dense(), theirs(a, b).to_dense(), rtol=_rtol(family))
            d1 = mine(a, a).diagonal(dim1=-1, dim2=-2)
            assert_close(d1, theirs(a, a).diagonal(dim1=-1, dim2=-2), rtol=_rtol(family))
            assert_close(d1, mine(a, a).to_dense().diagonal(), rtol=_rtol(family))


@pytest.mark.parametrize("family, structure, ard, mode", MODE_CHECKS, ids=MODE_IDS)
def test_keops_checks_gradient(family, structure, ard, mode, monkeypatch):
    mine, theirs = _twins(family, structure, ard)
    x = torch.randn(100, 3, dtype=F64)
    z = torch.randn(50, 3, dtype=F64)
    with _keops_must_run(mode, monkeypatch):
        for b in (x, z):
            rhs, w = torch.randn(b.shape[0], 2, dtype=F64), torch.randn(100, 2, dtype=F64)
            grads = torch.autograd.grad(((mine(x, b) @ rhs) * w).sum(), list(mine.parameters()))
            expected = torch.autograd.grad(((theirs(x, b).to_dense() @ rhs) * w).sum(), list(theirs.parameters()))
            for g, e in zip(grads, expected):
                assert_close(g, e, rtol=_rtol(family))


# Batched KeOps reductions compile a variant of their own: on KeOps (forced and default settings)
# the RBF formula only (compile budget); test_kernels.py runs the additive formula batched and
# test_dropin.py with broadcast right-hand sides. Every kernel runs them on the torch engine.
BATCH_CHECKS = [
    (*case, mode)
    for case in KEOPS_CHECKS
    for mode in ("torch", "keops", "default")
    if mode == "torch" or case[:2] == ("rbf", "alone")
]


@pytest.mark.parametrize(
    "family, structure, ard, mode",
    BATCH_CHECKS,
    ids=[f"{f}-{s}-{'ard' if a else 'shared'}-{m}" for f, s, a, m in BATCH_CHECKS],
)
@pytest.mark.slow
def test_keops_checks_batch_and_broadcast_rhs(family, structure, ard, mode, monkeypatch):
    mine, theirs = _twins(family, structure, ard)
    n = 600 if mode == "default" else 100  # sizes where default settings stay lazy on any engine
    x = torch.randn(2, 2, n, 3, dtype=F64)
    with _keops_must_run(mode, monkeypatch) as calls:
        # batch_matmul: a non-batch kernel on batched inputs
        rhs, w = torch.randn(2, 2, n, 2, dtype=F64), torch.randn(2, 2, n, 2, dtype=F64)
        out = mine(x) @ rhs
        expected = theirs(x).to_dense() @ rhs
        assert_close(out, expected, rtol=_rtol(family))
        for g, e in zip(
            torch.autograd.grad((out * w).sum(), list(mine.parameters())),
            torch.autograd.grad((expected * w).sum(), list(theirs.parameters())),
        ):
            assert_close(g, e, rtol=_rtol(family))
        # broadcast right-hand sides: batched rhs against a non-batch kernel matrix
        out = mine(x[0, 0]) @ rhs
        expected = theirs(x[0, 0]).to_dense() @ rhs
        assert_close(out, expected, rtol=_rtol(family))
        for g, e in zip(
            torch.autograd.grad((out * w).sum(), list(mine.parameters())),
            torch.autograd.grad((expected * w).sum(), list(theirs.parameters())),
        ):
            assert_close(g, e, rtol=_rtol(family))
    if mode == "default":
        assert "cpu" in calls, "default settings did not pick lazykern's CPU engine for CPU tensors"


# ------------------------------------------------------------------ linear_operator's operator suites
class _OperatorCase(_InMode):
    seed = 0
    n = 5
    batch_shape = torch.Size()
    #: the only KeOps formula these suites compile (RQ: a kernel with a tensor parameter)
    formula = StationaryFormula("rq")

    def setUp(self) -> None:
        # linear_operator's checks draw right-hand sides in the default dtype: float64 shares the
        # compiled formulas with the other float64 tests.
        self._dtype = torch.get_default_dtype()
        torch.set_default_dtype(F64)
        super().setUp()

    def tearDown(self) -> None:
        super().tearDown()
        torch.set_default_dtype(self._dtype)

    def _points(self, n: int) -> torch.Tensor:
        # Spread out for a well-conditioned K: the suites solve with it by CG to a loose tolerance.
        return torch.randn(*self.batch_shape, n, 3) * 3.0

    def _operator(self, x1: torch.Tensor, x2: torch.Tensor) -> LazyKernelOperator:
        alpha = torch.full((*self.batch_shape, 1, 1), 1.5, requires_grad=True)
        return LazyKernelOperator(x1.requires_grad_(), x2, covar_func=self.formula, alpha=alpha)

    def evaluate_linear_op(self, linear_op: LazyKernelOperator) -> torch.Tensor:
        """From the math: (1 + |x - x'|^2 / (2 alpha))^(-alpha)."""
        x1, x2 = linear_op.x1, linear_op.x2
        alpha = linear_op.tensor_params["alpha"]
        q = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).square().sum(-1)
        return (1 + q / (2 * alpha)) ** (-alpha)


class _SquareCase(_OperatorCase, LinearOperatorTestCase):
    def create_linear_op(self) -> LazyKernelOperator:
        x = self._points(self.n)
        return self._operator(x, x)


class _RectangularCase(_OperatorCase, RectangularLinearOperatorTestCase):
    def create_linear_op(self) -> LazyKernelOperator:
        return self._operator(self._points(self.n), self._points(self.n - 2))


# Forced lazy on lazykern's CPU engine: the square operator (on KeOps every right-hand-side width
# linear_operator uses compiled a reduction of its own, 4 minutes of a cold run for code paths that
# are the operator's, not the engine's); batch and rectangular operators run lazily on the torch
# engine. Default
# settings run at the suites' own small sizes (the dense-cache path): their tolerances assume a
# small operator (CG to 1e-4 against atol 1e-5, Lanczos root decompositions of full rank): at
# N = 600 a DenseLinearOperator of the same matrix fails the diagonalization, root decomposition and
# solve checks exactly as lazykern's operator does (the last two even for a jittered-grid K of
# condition number 5). KeOps under default settings runs in the kernel checks above (N = 600).
OPERATOR_CASES = [
    ("square", _SquareCase, torch.Size(), ("lazy", "torch", "default")),
    ("batch", _SquareCase, torch.Size([2]), ("torch", "default")),
    ("rectangular", _RectangularCase, torch.Size(), ("torch", "default")),
]
for _kind, _base_case, _batch, _modes in OPERATOR_CASES:
    for _mode in _modes:
        _name = f"TestLazyKernelOperator_{_kind}_{_mode}"
        globals()[_name] = type(_name, (_base_case, unittest.TestCase), {"mode": _mode, "batch_shape": _batch})
