"""Tests for lazykern.solvers: batched PCG, preconditioners, scipy / linear_operator interop, KernelRidge.

KeOps compiles are kept to two: one additive-RBF formula (D = 26, the width of ``pol``) in float64
and float32, always applied to 8 right-hand-side columns. Smaller systems (N < 512) run on the
chunked torch engine, larger ones that may use the dense budget run on BLAS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import gpytorch
import numpy as np
import pytest
import scipy.sparse.linalg
import torch
from linear_operator.utils import linear_cg

import lazykern
from lazykern.settings import max_dense_bytes
from lazykern.solvers import (
    CGResult,
    JacobiPreconditioner,
    KernelRidge,
    PivotedCholeskyPreconditioner,
    Preconditioner,
    cg,
)

D = 26  # the number of features of pol: the lazy tests and the UCI tests share one KeOps formula
NRHS = 8
LENGTHSCALE = 1.0


def additive_rbf(num_dims: int = D, dtype: torch.dtype = torch.float64) -> lazykern.AdditiveStructureKernel:
    base = lazykern.kernels.RBFKernel().to(dtype)
    base.lengthscale = LENGTHSCALE
    return lazykern.AdditiveStructureKernel(base, num_dims=num_dims).to(dtype)


def kernel_operator(kernel: gpytorch.kernels.Kernel, x1: torch.Tensor, x2: torch.Tensor | None = None):
    with gpytorch.settings.lazily_evaluate_kernels(False):
        return kernel(x1, x1 if x2 is None else x2)


def dense_additive_rbf(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """From the math: k(x, x') = sum_d exp(-(x_d - x'_d)^2 / (2 l^2)), in float64."""
    x1, x2 = x1.double(), x2.double()
    diff = (x1[:, None, :] - x2[None, :, :]) / LENGTHSCALE
    return torch.exp(-0.5 * diff**2).sum(-1)


def relative_residual(A: torch.Tensor, X: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    A, X, B = A.double(), X.double(), B.double()
    return torch.linalg.vector_norm(B - A @ X, dim=0) / torch.linalg.vector_norm(B, dim=0)


def spd_matrix(n: int, cond_shift: float, dtype: torch.dtype) -> torch.Tensor:
    G = torch.randn(n, n, dtype=torch.float64)
    return (G @ G.T / n + cond_shift * torch.eye(n, dtype=torch.float64)).to(dtype)


class CountingOperator:
    """A bare ``@`` operator that counts its applications (and the columns of each)."""

    def __init__(self, A: torch.Tensor) -> None:
        self.A, self.shape, self.dtype, self.device = A, A.shape, A.dtype, A.device
        self.columns: list[int] = []

    def __matmul__(self, X: torch.Tensor) -> torch.Tensor:
        self.columns.append(X.shape[-1])
        return self.A @ X


# ---------------------------------------------------------------------------------------------- cg


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_cg_matches_dense_solve(dtype, tol):
    A = spd_matrix(300, 0.05, dtype)
    B = torch.randn(300, NRHS, dtype=dtype)
    X, result = cg(A, B, tol=tol)
    assert X.dtype == dtype and X.shape == B.shape
    assert result.all_converged and result.converged.shape == (NRHS,)
    assert float(relative_residual(A, X, B).max()) <= tol * (1.01 if dtype == torch.float64 else 2.0)
    exact = torch.linalg.solve(A.double(), B.double())
    cond = float(torch.linalg.cond(A.double()))
    err = torch.linalg.vector_norm(X.double() - exact, dim=0) / torch.linalg.vector_norm(exact, dim=0)
    assert float(err.max()) <= 2 * cond * tol


def test_cg_one_operator_pass_per_iteration_for_all_columns():
    A = CountingOperator(spd_matrix(200, 0.05, torch.float64))
    B = torch.randn(200, NRHS, dtype=torch.float64)
    X, result = cg(A, B, tol=1e-10)
    assert result.all_converged
    assert set(A.columns) == {NRHS}  # every application is to the whole block
    assert len(A.columns) == result.matvecs
    # matvecs beyond the iterations are the periodic and final true-residual checks only
    assert result.iterations <= result.matvecs <= result.iterations + result.iterations // 50 + NRHS + 1
    assert float(relative_residual(A.A, X, B).max()) <= 1e-10 * 1.01


def test_cg_vector_rhs_zero_column_and_callback():
    A = spd_matrix(100, 0.5, torch.float64)
    b = torch.randn(100, dtype=torch.float64)
    seen = []
    x, result = cg(A, b, tol=1e-9, callback=lambda k, X, rel: seen.append((k, rel.shape)))
    assert x.shape == (100,) and result.all_converged
    assert seen[-1] == (result.iterations, (1,))
    B = torch.stack([b, torch.zeros_like(b)], -1)
    X, result = cg(A, B, tol=1e-9)
    assert result.all_converged and bool((X[:, 1] == 0).all())
    assert float(result.relative_residuals[1]) == 0.0


def test_cg_float32_reports_true_residual():
    # Ill-conditioned in float32: the recursive residual drifts below the true one. Whatever cg
    # claims must hold for the true residual b - A x.
    A = spd_matrix(200, 1e-4, torch.float32)
    B = torch.randn(200, NRHS, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        X, result = cg(A, B, tol=1e-5, max_iter=1000)
    true = torch.linalg.vector_norm(B - A @ X, dim=0) / torch.linalg.vector_norm(B, dim=0)
    torch.testing.assert_close(result.relative_residuals, true, rtol=1e-3, atol=0)
    assert bool((result.converged == (true <= 1e-5)).all())


def test_cg_nonconvergence_warns_and_says_so():
    A = spd_matrix(200, 1e-3, torch.float64)
    B = torch.randn(200, NRHS, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="max_iter=3"):
        X, result = cg(A, B, tol=1e-12, max_iter=3)
    assert result.iterations == 3 and not bool(result.converged.any())
    torch.testing.assert_close(result.relative_residuals, relative_residual(A, X, B))


def test_cg_breakdown_on_indefinite_operator():
    A = torch.diag(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64))
    with pytest.warns(RuntimeWarning, match="not positive definite"):
        _, result = cg(A, torch.ones(3, dtype=torch.float64))
    assert not result.all_converged and bool(result.breakdown.all())


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda A, B: (A[:, :-1], B), ValueError, "square"),
        (lambda A, B: (A, B[:-1]), ValueError, "B must have shape"),
        (lambda A, B: (A, B[None]), ValueError, "B must have shape"),
        (lambda A, B: (A, B.float()), TypeError, "same dtype"),
        (lambda A, B: (A, B.index_fill(0, torch.tensor([3]), float("nan"))), ValueError, "B contains NaN"),
        (lambda A, B: (A, B.index_fill(0, torch.tensor([3]), float("inf"))), ValueError, "B contains NaN"),
        (lambda A, B: (A, B.long()), TypeError, "B must be float32 or float64"),
        (lambda A, B: (A.numpy(), B), TypeError, "A must support"),
    ],
)
def test_cg_bad_input_raises_before_any_iteration(make, error, match):
    A = spd_matrix(20, 1.0, torch.float64)
    A_bad, B = make(A, torch.randn(20, 2, dtype=torch.float64))
    op = CountingOperator(A_bad) if isinstance(A_bad, torch.Tensor) else A_bad
    with pytest.raises(error, match=match):
        cg(op, B)
    if isinstance(op, CountingOperator):
        assert op.columns == []


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"tol": 0.0}, ValueError, "tol"),
        ({"tol": float("nan")}, ValueError, "tol"),
        ({"max_iter": 0}, ValueError, "max_iter"),
        ({"max_iter": 2.5}, ValueError, "max_iter"),
        ({"precond": "nystrom"}, TypeError, "precond"),
        ({"callback": 3}, TypeError, "callback"),
        ({"precond": lambda R: R[:-1]}, ValueError, "precond must return"),
    ],
)
def test_cg_bad_arguments(kwargs, error, match):
    A = CountingOperator(spd_matrix(20, 1.0, torch.float64))
    with pytest.raises(error, match=match):
        cg(A, torch.randn(20, 2, dtype=torch.float64), **kwargs)
    assert A.columns == []


# ------------------------------------------------------------------------------------ preconditioners


def test_pivoted_cholesky_is_the_nystrom_approximation_and_woodbury_inverse():
    x = torch.randn(150, D, dtype=torch.float64)
    K = dense_additive_rbf(x, x)
    shift, rank = 0.1, 20
    P = PivotedCholeskyPreconditioner(kernel_operator(additive_rbf(), x), rank=rank, shift=shift)
    assert isinstance(P, Preconditioner) and P.rank == rank
    # Rebuild the pivots from the math (greedy largest remaining diagonal) and the Nystrom matrix.
    pivots, residual = [], K.clone()
    for _ in range(rank):
        i = int(torch.argmax(torch.diagonal(residual)))
        pivots.append(i)
        residual = residual - torch.outer(residual[:, i], residual[i, :]) / residual[i, i]
    S = torch.tensor(pivots)
    nystrom = K[:, S] @ torch.linalg.solve(K[S][:, S], K[S, :])
    M_inv = torch.linalg.inv(nystrom + shift * torch.eye(150, dtype=torch.float64))
    R = torch.randn(150, NRHS, dtype=torch.float64)
    torch.testing.assert_close(P(R), M_inv @ R, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(P(R[:, 0]), M_inv @ R[:, 0], rtol=1e-7, atol=1e-9)


def test_pivoted_cholesky_stops_at_numerical_rank():
    x = torch.randn(60, 3, dtype=torch.float64)
    K = x @ x.T  # rank 3
    P = PivotedCholeskyPreconditioner(K, rank=10, shift=1.0)
    assert P.rank == 3
    M = K + torch.eye(60, dtype=torch.float64)
    R = torch.randn(60, 2, dtype=torch.float64)
    torch.testing.assert_close(P(R), torch.linalg.solve(M, R))


def test_jacobi_preconditioner():
    diag = torch.linspace(1.0, 100.0, 50, dtype=torch.float64)
    A = torch.diag(diag) + 1e-3 * torch.ones(50, 50, dtype=torch.float64)
    P = JacobiPreconditioner(A, shift=0.5)
    R = torch.randn(50, 3, dtype=torch.float64)
    torch.testing.assert_close(P(R), R / (torch.diagonal(A) + 0.5)[:, None])
    _, plain = cg(A, R, tol=1e-10)
    _, jacobi = cg(A, R, tol=1e-10, precond=JacobiPreconditioner(A))
    assert jacobi.all_converged and jacobi.iterations < plain.iterations


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda K: PivotedCholeskyPreconditioner(K, rank=0, shift=1.0), ValueError, "rank"),
        (lambda K: PivotedCholeskyPreconditioner(K, rank=True, shift=1.0), ValueError, "rank"),
        (lambda K: PivotedCholeskyPreconditioner(K, rank=5, shift=0.0), ValueError, "shift"),
        (lambda K: PivotedCholeskyPreconditioner(K[:, :-1], rank=5, shift=1.0), ValueError, "square"),
        (lambda K: PivotedCholeskyPreconditioner(K.numpy(), rank=5, shift=1.0), TypeError, "K must be"),
        (lambda K: PivotedCholeskyPreconditioner(-K, rank=5, shift=1.0), ValueError, "non-negative diagonal"),
        (lambda K: JacobiPreconditioner(K, shift=-1.0), ValueError, "shift"),
        (lambda K: JacobiPreconditioner(-K), ValueError, "positive"),
    ],
)
def test_preconditioner_bad_input(build, error, match):
    x = torch.randn(30, 2, dtype=torch.float64)
    with pytest.raises(error, match=match):
        build(torch.exp(-torch.cdist(x, x) ** 2))


# ----------------------------------------------------------------------------- lazy additive kernels


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-8), (torch.float32, 1e-3)])
def test_cg_on_lazy_additive_kernel_matches_dense_solve(dtype, tol):
    n, alpha = 2000, 1.0
    x = torch.randn(n, D, dtype=torch.float64)
    B = torch.randn(n, NRHS, dtype=torch.float64)
    K = kernel_operator(additive_rbf(dtype=dtype), x.to(dtype))
    A = K.add_diagonal(torch.tensor(alpha, dtype=dtype))
    with max_dense_bytes(0):  # lazy: every matvec is a reduction on a lazy engine
        assert lazykern.backend.engine_for(K.covar_func, K.x1, K.x2, K.tensor_params) != "torch"
        precond = PivotedCholeskyPreconditioner(K, rank=100, shift=alpha)
        X, result = cg(A, B.to(dtype), tol=tol, precond=precond)
    assert result.all_converged and X.dtype == dtype
    A_dense = dense_additive_rbf(x.to(dtype), x.to(dtype)) + alpha * torch.eye(n, dtype=torch.float64)
    rel = relative_residual(A_dense, X, B.to(dtype))
    assert float(rel.max()) <= tol * (1.01 if dtype == torch.float64 else 2.0)
    exact = torch.linalg.solve(A_dense, B.to(dtype).double())
    eigs = torch.linalg.eigvalsh(A_dense)
    err = torch.linalg.vector_norm(X.double() - exact, dim=0) / torch.linalg.vector_norm(exact, dim=0)
    assert float(err.max()) <= 2 * float(eigs[-1] / eigs[0]) * tol


# ----------------------------------------------------------------------------------------- UCI data


def pol_subset(data_dir, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    from lazykern.data import load_uci

    data = load_uci("pol", n_train=n, data_dir=data_dir)
    return data.train_x, data.train_y


@pytest.mark.slow
def test_nystrom_cuts_iterations_on_uci_subset(data_dir):
    n, alpha, tol = 3000, 1e-2, 1e-6
    x, y = pol_subset(data_dir, n)
    assert x.shape == (n, D)
    K = kernel_operator(additive_rbf(), x)
    A = K.add_diagonal(torch.tensor(alpha, dtype=torch.float64))
    B = torch.cat([y[:, None], torch.randn(n, NRHS - 1, dtype=torch.float64)], -1)
    # (Jacobi is plain CG here: a stationary kernel has a constant diagonal.)
    _, plain = cg(A, B, tol=tol, max_iter=3000)
    _, nystrom = cg(A, B, tol=tol, precond=PivotedCholeskyPreconditioner(K, rank=100, shift=alpha))
    assert plain.all_converged and nystrom.all_converged
    assert 3 * nystrom.iterations <= plain.iterations


_MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys, warnings
    resource.setrlimit(resource.RLIMIT_AS, (16 * 2**30, 16 * 2**30))
    import gpytorch, torch
    import lazykern
    from lazykern.data import load_uci
    from lazykern.solvers import PivotedCholeskyPreconditioner, cg

    def peak_rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))

    n, alpha = int(sys.argv[2]), 1e-2
    lazykern.settings.max_dense_bytes.set_global(0)
    data = load_uci("pol", n_train=n, data_dir=sys.argv[1])
    base = lazykern.kernels.RBFKernel().double()
    base.lengthscale = 1.0
    kernel = lazykern.AdditiveStructureKernel(base, num_dims=data.train_x.shape[1]).double()
    with gpytorch.settings.lazily_evaluate_kernels(False):
        K = kernel(data.train_x)
    A = K.add_diagonal(torch.tensor(alpha, dtype=torch.float64))
    B = torch.randn(n, 8, dtype=torch.float64)
    with torch.no_grad():
        A @ B  # load the compiled reduction before the baseline
    before = peak_rss()
    P = PivotedCholeskyPreconditioner(K, rank=100, shift=alpha)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        X, result = cg(A, B, tol=1e-6, precond=P, max_iter=int(sys.argv[3]))
    print(json.dumps({"growth": peak_rss() - before, "iterations": result.iterations}))
    """
)


def test_nystrom_pcg_never_forms_the_kernel_matrix(data_dir, tmp_path):
    n, max_iter = 4000, 10
    script = tmp_path / "pcg_memory.py"
    script.write_text(_MEMORY_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(data_dir), str(n), str(max_iter)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["iterations"] == max_iter
    # One N x N float64 matrix is 128 MB at N = 4000; the solve may use a small multiple of N x r.
    assert measured["growth"] < n * n * 8 // 4, measured


# ------------------------------------------------------------------------------ scipy / linear_cg


def small_lazy_system(n: int = 200, alpha: float = 2.0):
    x = torch.randn(n, D, dtype=torch.float64)
    K = kernel_operator(additive_rbf(), x)
    A_dense = dense_additive_rbf(x, x) + alpha * torch.eye(n, dtype=torch.float64)
    return K, A_dense, alpha


def test_as_scipy_operator_shape_dtype_and_products():
    K, A_dense, alpha = small_lazy_system()
    K_dense = A_dense - alpha * torch.eye(200, dtype=torch.float64)
    op = K.as_scipy()
    assert op.shape == (200, 200) and op.dtype == np.float64
    V = np.random.default_rng(0).standard_normal((200, 3))
    with max_dense_bytes(0):
        np.testing.assert_allclose(op.matvec(V[:, 0]), (K_dense @ torch.from_numpy(V[:, 0])).numpy(), rtol=1e-10)
        np.testing.assert_allclose(op.matmat(V), (K_dense @ torch.from_numpy(V)).numpy(), rtol=1e-10)
        np.testing.assert_allclose(op.rmatvec(V[:, 0]), (K_dense.T @ torch.from_numpy(V[:, 0])).numpy(), rtol=1e-10)
        np.testing.assert_allclose(op @ V, (K_dense @ torch.from_numpy(V)).numpy(), rtol=1e-10)


# minres stops on ||r|| / (||A|| ||x|| + ||b||), far looser than cg's ||r|| / ||b|| here
@pytest.mark.parametrize("solver, rtol", [(scipy.sparse.linalg.cg, 1e-8), (scipy.sparse.linalg.minres, 1e-12)])
def test_scipy_iterative_solvers_converge_with_lazy_operator(solver, rtol):
    K, A_dense, alpha = small_lazy_system()
    A = K.as_scipy() + alpha * scipy.sparse.linalg.aslinearoperator(scipy.sparse.identity(200))
    b = np.random.default_rng(1).standard_normal(200)
    with max_dense_bytes(0):
        x, info = solver(A, b, rtol=rtol, maxiter=1000)
    assert info == 0
    residual = relative_residual(A_dense, torch.from_numpy(x)[:, None], torch.from_numpy(b)[:, None])
    assert float(residual) <= 1e-7


def test_linear_operator_linear_cg_converges_with_lazy_operator():
    K, A_dense, alpha = small_lazy_system()
    A = K.add_diagonal(torch.tensor(alpha, dtype=torch.float64))
    B = torch.randn(200, NRHS, dtype=torch.float64)
    with max_dense_bytes(0), torch.no_grad():
        X = linear_cg(A._matmul, B, tolerance=1e-9, max_iter=1000)
    exact = torch.linalg.solve(A_dense, B)
    torch.testing.assert_close(X, exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))


# ------------------------------------------------------------------------------------- KernelRidge

_NET = torch.nn.Sequential(
    torch.nn.Linear(D, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)
).double()


def dense_trace_ntk(x1, x2):
    """sum_o <d f_o(x1)/d theta, d f_o(x2)/d theta>, by torch.func Jacobian contraction."""
    params = {k: v.detach() for k, v in _NET.named_parameters()}

    def jac(x):
        j = torch.func.vmap(
            torch.func.jacrev(lambda p, xi: torch.func.functional_call(_NET, p, (xi[None],))[0]), in_dims=(None, 0)
        )(params, x)
        return torch.cat([v.reshape(x.shape[0], 2, -1) for v in j.values()], dim=-1)

    j1, j2 = jac(x1), jac(x2)
    return torch.einsum("iop,jop->ij", j1, j2)


# name -> (kernel factory, dense kernel function written from the math).
KERNELS = {
    "ntk": (lambda: lazykern.ntk.NTKKernel(_NET), dense_trace_ntk),
    "additive_rbf": (additive_rbf, dense_additive_rbf),
    "scaled_additive_rbf": (
        lambda: gpytorch.kernels.ScaleKernel(additive_rbf()).double().initialize(outputscale=2.5),
        lambda x1, x2: 2.5 * dense_additive_rbf(x1, x2),
    ),
}


@pytest.mark.parametrize(
    "name, precond, outputs",
    [(name, "nystrom", 3) for name in sorted(KERNELS)]
    + [("additive_rbf", "nystrom", None), ("additive_rbf", "jacobi", 3), ("additive_rbf", None, 3)],
)
def test_kernel_ridge_matches_dense_closed_form(name, precond, outputs):
    make_kernel, dense_kernel = KERNELS[name]
    n, m, alpha = 1000, 200, 0.1
    X, X_test = torch.randn(n, D, dtype=torch.float64), torch.randn(m, D, dtype=torch.float64)
    y = torch.randn(n, dtype=torch.float64) if outputs is None else torch.randn(n, outputs, dtype=torch.float64)
    model = KernelRidge(make_kernel(), alpha=alpha, precond=precond, rank=50, tol=1e-10, max_iter=5000)
    model.fit(X, y)
    assert model.fit_result_.all_converged
    coef = torch.linalg.solve(dense_kernel(X, X) + alpha * torch.eye(n, dtype=torch.float64), y)
    expected = dense_kernel(X_test, X) @ coef
    predicted = model.predict(X_test)
    assert predicted.shape == expected.shape
    assert float(torch.linalg.norm(predicted - expected) / torch.linalg.norm(expected)) <= 1e-6


def test_kernel_ridge_on_a_lazy_engine_without_forming_the_kernel_matrix():
    n, m, alpha = 1000, 600, 0.1
    X, X_test = torch.randn(n, D, dtype=torch.float64), torch.randn(m, D, dtype=torch.float64)
    Y = torch.randn(n, NRHS, dtype=torch.float64)
    with max_dense_bytes(0):  # fit and predict are lazy passes (both sides have >= 512 points)
        K = kernel_operator(additive_rbf(), X_test, X)
        assert lazykern.backend.engine_for(K.covar_func, K.x1, K.x2, K.tensor_params) != "torch"
        model = KernelRidge(additive_rbf(), alpha=alpha, rank=100, tol=1e-10).fit(X, Y)
        predicted = model.predict(X_test)
    assert isinstance(model.fit_result_, CGResult) and model.fit_result_.all_converged
    coef = torch.linalg.solve(dense_additive_rbf(X, X) + alpha * torch.eye(n, dtype=torch.float64), Y)
    expected = dense_additive_rbf(X_test, X) @ coef
    assert float(torch.linalg.norm(predicted - expected) / torch.linalg.norm(expected)) <= 1e-6


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"alpha": 0.0}, ValueError, "alpha"),
        ({"alpha": -1.0}, ValueError, "alpha"),
        ({"alpha": float("inf")}, ValueError, "alpha"),
        ({"rank": 0}, ValueError, "rank"),
        ({"precond": "cholesky"}, ValueError, "precond"),
        ({"tol": -1.0}, ValueError, "tol"),
        ({"max_iter": 0}, ValueError, "max_iter"),
    ],
)
def test_kernel_ridge_bad_constructor_arguments(kwargs, error, match):
    # scikit-learn's convention: the constructor stores its arguments, fit checks them.
    model = KernelRidge(additive_rbf(), **kwargs)
    with pytest.raises(error, match=match):
        model.fit(torch.randn(20, D, dtype=torch.float64), torch.randn(20, dtype=torch.float64))


def test_kernel_ridge_bad_kernel_and_data():
    X, y = torch.randn(20, 2, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    with pytest.raises(TypeError, match="gpytorch.kernels.Kernel"):
        KernelRidge(lambda x: x).fit(X, y)
    model = KernelRidge(additive_rbf(num_dims=2), alpha=1.0)
    with pytest.raises(ValueError, match="before fit"):
        model.predict(X)
    with pytest.raises(ValueError, match="y must have shape"):
        model.fit(X, y[:-1])
    with pytest.raises(ValueError, match="y contains NaN"):
        model.fit(X, y.index_fill(0, torch.tensor([0]), float("nan")))
    with pytest.raises(ValueError, match="X contains NaN"):
        model.fit(X.index_fill(0, torch.tensor([0]), float("inf")), y)
    assert not hasattr(model, "dual_coef_")
    model.fit(X, y)
    with pytest.raises(ValueError, match=r"X must have shape \(M, 2\)"):
        model.predict(torch.randn(5, 3, dtype=torch.float64))
    # Mixed dtypes promote to the wider one (GPyTorch's rule) instead of being refused.
    assert model.predict(X.float()).dtype == torch.float64
    assert model.fit(X, y.float()).dual_coef_.dtype == torch.float64
