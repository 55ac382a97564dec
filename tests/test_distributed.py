"""Sharded operators on 2 and 3 local gloo processes against the single-process operator, float64.

One ``torch.multiprocessing`` spawn of 3 gloo processes runs every case (:func:`evaluate` with
``lazykern.distributed.shard``) on a 2-rank group (ranks 0 and 1, passed as ``group=``), then on
all 3 ranks, and measures each rank's row-block memory; the test process runs the same function with the operator left
whole and compares, to 1e-10: products (square, rectangular, transposed, batched), gradients with
respect to inputs and every hyperparameter, ``lazykern.solvers.cg`` (plain and preconditioned),
``linear_operator`` solves, ``KernelRidge``, the exact marginal likelihood with all its gradients,
GP predictions, NTK operators. 37 rows split unevenly (19/18 and 13/12/12). Kernels run on the
chunked torch engine (sharding is engine-agnostic) except one case on the default lazy engine
(lazykern's CPU engine for CPU tensors; additive RBF, D=3, float64, two columns).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import gpytorch
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from linear_operator.utils.warnings import NumericalWarning

import lazykern
from lazykern.distributed import ShardedKernel, row_bounds, shard
from lazykern.ntk import NTKKernel, empirical_ntk
from lazykern.solvers import KernelRidge, PivotedCholeskyPreconditioner, cg

from . import reference
from .memory import _PRELUDE
from .test_kernels import FAMILIES, make_base

ROOT = Path(__file__).resolve().parents[1]
N, M, D = 37, 11, 3
WORLD_SIZES = (2, 3)
# GPyTorch's CG (solves) and CG/Lanczos estimates (MLL and its gradient) amplify rounding once
# CG has converged (the MLL runs at least max_lanczos_quadrature_iterations = 20 steps): on the
# single-process additive operator at N=37, merely re-chunking its rows changes the gradient by
# 150% after 20 steps, 1e-14 after 5. Sharding changes rounding the same way, so the comparison
# pins the iteration count where the estimate is a smooth function of the products (lazykern's
# own cg checks true residuals and keeps the best iterate: it needs no such cap).
CG_STEPS = 5
MEMORY_N = 3000  # a 3000 x 3000 float64 matrix is 68.7 MiB: per rank 34.3 MiB (2 ranks), 22.9 MiB (3)


def scaled_additive(lengthscale_shift: float = 0.0) -> gpytorch.kernels.Kernel:
    """outputscale * sum_d s_d k_rbf(x_d, x'_d / l_d): every lazykern hyperparameter kind at once."""
    base = make_base("rbf", ard=True)
    base.lengthscale = base.lengthscale + lengthscale_shift
    additive = lazykern.AdditiveStructureKernel(base, num_dims=D, component_scales=True).double()
    additive.component_scales = torch.linspace(0.5, 2.0, D, dtype=torch.float64).reshape(1, D)
    kernel = gpytorch.kernels.ScaleKernel(additive).double()
    kernel.outputscale = 1.7
    return kernel


def gp_kernel() -> gpytorch.kernels.Kernel:
    """A full ARD and a weighted additive RBF kernel, each scaled: every kind of hyperparameter."""
    full = make_base("rbf", ard=True)
    full.lengthscale = 0.3 * full.lengthscale
    additive = scaled_additive()
    additive.base_kernel.base_kernel.lengthscale = 0.3 * additive.base_kernel.base_kernel.lengthscale
    return gpytorch.kernels.ScaleKernel(full).double() + additive


def kernels() -> dict[str, gpytorch.kernels.Kernel]:
    out = {"scaled-additive-rbf": scaled_additive(), "sum-rbf-matern": (make_base("rbf", True) + make_base("matern2.5", False))}
    for family in FAMILIES:
        out[f"full-{family}"] = make_base(family, ard=True)
        out[f"additive-{family}"] = lazykern.AdditiveStructureKernel(make_base(family, ard=False), num_dims=D).double()
    return out


def data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)

    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g)

    x = randn(N, D)
    return {
        "x": x, "z": randn(M, D), "V": randn(N, 2), "U": randn(N, 2), "W": randn(M, 2), "B": randn(N, 3),
        "y": torch.sin(2 * x).sum(-1) + 0.1 * randn(N), "xb": randn(2, N, D), "Vb": randn(2, N, 2),
        "V14": randn(14, 2), "V9": randn(9, 2),
    }


class ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _network() -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()


@contextlib.contextmanager
def capped_cg():
    """GPyTorch's CG path (never Cholesky), stopped after CG_STEPS iterations."""
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.max_cg_iterations(CG_STEPS), \
            gpytorch.settings.max_lanczos_quadrature_iterations(CG_STEPS), warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)  # "CG terminated in 5 iterations": on purpose
        yield


def whole(op):
    """The single-process operator: ``kernel(X)`` evaluated to the lazykern operator (as shard does)."""
    return op.evaluate_kernel()


def evaluate(wrap, wrap_kernel) -> dict[str, torch.Tensor]:
    """Every checked quantity, with operators passed through ``wrap`` and kernels through ``wrap_kernel``."""
    d, out = data(), {}
    alpha = torch.tensor(0.1, dtype=torch.float64)
    with lazykern.settings.engine("torch"), lazykern.settings.max_dense_bytes(0):
        for name, kernel in kernels().items():
            x = d["x"].clone().requires_grad_(True)
            KV = wrap(kernel(x)) @ d["V"]
            out[f"{name}/matvec"] = KV.detach()
            grads = torch.autograd.grad((d["U"] * KV).sum(), [x, *kernel.parameters()])
            out.update({f"{name}/grad{i}": g for i, g in enumerate(grads)})
            Kxz = wrap(kernel(d["x"], d["z"]))
            out[f"{name}/rectangular"] = (Kxz @ d["W"]).detach()
            out[f"{name}/transposed"] = (Kxz.mT @ d["V"]).detach()

        batch = make_base("rbf", ard=True, batch_shape=torch.Size([2]))
        xb = d["xb"].clone().requires_grad_(True)
        KVb = wrap(batch(xb)) @ d["Vb"]
        out["batch/matvec"] = KVb.detach()
        out.update({f"batch/grad{i}": g for i, g in enumerate(torch.autograd.grad(KVb.square().sum(), [xb, *batch.parameters()]))})

        kernel = scaled_additive()
        with torch.no_grad():
            K = wrap(kernel(d["x"]))
            out["cg"], _ = cg(K.add_diagonal(alpha), d["B"], tol=1e-12)
            precond = PivotedCholeskyPreconditioner(K, rank=10, shift=0.1)
            out["cg/nystrom"], _ = cg(K.add_diagonal(alpha), d["B"], precond=precond, tol=1e-12)
            with capped_cg():
                out["linear_operator-solve"] = K.add_diagonal(alpha).solve(d["B"])
            ridge = KernelRidge(wrap_kernel(kernel), alpha=0.1, rank=10, tol=1e-12).fit(d["x"], d["y"])
            out["kernel-ridge/coef"], out["kernel-ridge/predict"] = ridge.dual_coef_, ridge.predict(d["z"])

        model = ExactGP(d["x"], d["y"], wrap_kernel(gp_kernel())).double()
        model.likelihood.noise = 0.1
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with capped_cg():
            torch.manual_seed(7)  # the stochastic trace probes: the same on every rank
            loss = -mll(model(d["x"]), d["y"])
            out["mll"] = loss.detach()
            out.update({f"mll/grad{i}": g for i, g in enumerate(torch.autograd.grad(loss, list(model.parameters())))})
            model.eval()
            with torch.no_grad(), gpytorch.settings.skip_posterior_variances():
                torch.manual_seed(8)
                out["gp-predictive-mean"] = model(d["z"]).mean

        net = _network()
        out["ntk-full/matvec"] = wrap(empirical_ntk(net, d["x"][:7], mode="full", backend="dense")) @ d["V14"]
        ntk_kernel = gpytorch.kernels.ScaleKernel(NTKKernel(net, backend="dense")).double()
        KV = wrap(ntk_kernel(d["x"][:9])) @ d["V9"]
        out["ntk-trace/matvec"] = KV.detach()
        (out["ntk-trace/grad-outputscale"],) = torch.autograd.grad(KV.square().sum(), [ntk_kernel.raw_outputscale])

    kernel = scaled_additive()
    with lazykern.settings.max_dense_bytes(0):  # the default lazy engine (lazykern's CPU engine here)
        x = d["x"].clone().requires_grad_(True)
        KV = wrap(kernel(x)) @ d["V"]
        out["lazy/matvec"] = KV.detach()
        grads = torch.autograd.grad((d["U"] * KV).sum(), [x, *kernel.parameters()])
        out.update({f"lazy/grad{i}": g for i, g in enumerate(grads)})
    return out


def _expect_error(kind, build) -> str:
    try:
        build()
    except kind as err:
        return str(err)
    return "no error"


def _errors(rank: int, wrap) -> dict[str, str]:
    """Ranks that disagree must all raise, with a message naming what differs (no hang)."""
    d = data()
    x = d["x"]
    with lazykern.settings.engine("torch"):
        kernel = scaled_additive()
        return {
            "shape": _expect_error(ValueError, lambda: wrap(kernel(x[: N - rank]))),
            "dtype": _expect_error(
                ValueError, lambda: wrap(kernel(x)) if rank == 0 else wrap(scaled_additive().float()(x.float()))
            ),
            "hyperparameter": _expect_error(ValueError, lambda: wrap(scaled_additive(0.1 * rank)(x))),
            "data-order": _expect_error(ValueError, lambda: wrap(kernel(x.roll(rank, 0)))),
            "rhs": _expect_error(RuntimeError, lambda: wrap(kernel(x)) @ (d["V"] + rank)),
            "not-an-operator": _expect_error(TypeError, lambda: wrap(x)),
        }


def _peak_rss_increase_mb(run) -> float:
    """Peak RSS growth of ``run()`` in this (long-lived) process, new large blocks counted in full."""
    scope: dict = {}
    exec(_PRELUDE, scope)
    libc = ctypes.CDLL("libc.so.6")
    # A fixed mmap threshold (M_MMAP_THRESHOLD = -3): every block of 1 MiB or more is a fresh
    # mapping, never heap memory freed by an earlier measurement (glibc raises its threshold
    # after large frees, so a second, smaller block could land in already-resident heap).
    libc.mallopt(-3, 2**20)
    libc.malloc_trim(0)
    scope["_reset_peak"]()
    before = scope["_vmhwm_mb"]()
    run()
    return scope["_vmhwm_mb"]() - before


def row_block_memory_mb(wrap) -> float:
    """Peak RSS growth of one product with the dense budget on (each rank forms and keeps its
    N/P x N row block) minus that of the same product kept lazy (the same row chunks, no block)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(MEMORY_N, D, dtype=torch.float64, generator=g)
    v = torch.randn(MEMORY_N, 1, dtype=torch.float64, generator=g)
    K = wrap(lazykern.RBFKernel(ard_num_dims=D).double()(x))
    peaks = []
    for budget in (0, 2**30):

        def run():
            with torch.no_grad(), lazykern.settings.max_dense_bytes(budget), lazykern.settings.engine("torch"):
                K._matmul(v)

        peaks.append(_peak_rss_increase_mb(run))
    return peaks[1] - peaks[0]


def _worker(rank: int, port: int, folder: str) -> None:
    """Runs on 3 processes: the 2-rank case on a subgroup of ranks 0 and 1, then the 3-rank case."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=max(WORLD_SIZES))
    groups = {size: dist.new_group(list(range(size))) for size in WORLD_SIZES}  # every rank creates every group
    try:
        for size, group in groups.items():
            if rank >= size:
                continue
            wrap = functools.partial(shard, group=group)
            results = evaluate(wrap, functools.partial(ShardedKernel, group=group))
            errors = _errors(rank, wrap)
            memory = row_block_memory_mb(wrap)
            torch.save({"results": results, "errors": errors, "memory_mb": memory}, Path(folder) / f"{size}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, list[dict]]:
    folder = tmp_path_factory.mktemp("ranks")
    mp.spawn(_worker, args=(_free_port(), str(folder)), nprocs=max(WORLD_SIZES), join=True)
    return {size: [torch.load(folder / f"{size}-{r}.pt") for r in range(size)] for size in WORLD_SIZES}


@pytest.fixture(scope="module")
def one_process_memory_mb() -> float:
    """The same measurement on the whole operator, in a fresh process."""
    code = "from tests.test_distributed import row_block_memory_mb, whole; print(row_block_memory_mb(whole))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(proc.stdout.split()[-1])


@pytest.fixture(scope="module")
def single() -> dict[str, torch.Tensor]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny products: threads only add contention (as in the workers)
    try:
        return evaluate(whole, lambda kernel: kernel)
    finally:
        torch.set_num_threads(threads)


def assert_close(actual, expected, rtol=1e-10, name=""):
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    scale = expected.abs().max().clamp_min(1e-300)
    err = ((actual - expected).abs().max() / scale).item()
    assert err <= rtol, f"{name}: relative error {err:.3e} > {rtol}"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_matvecs_match_single_process(runs, single, world_size):
    """Square, rectangular K(X, Z) and transposed products of every kernel family (full and
    additive), a sum, a scaled kernel, a batch of kernels and the default lazy engine."""
    names = [n for n in single if n.endswith(("/matvec", "/rectangular", "/transposed"))]
    assert len(names) == 3 * (2 + 2 * len(FAMILIES)) + 4
    for name in names:
        assert_close(runs[world_size][0]["results"][name], single[name], name=name)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gradients_wrt_inputs_and_every_hyperparameter_match(runs, single, world_size):
    names = [n for n in single if "/grad" in n and not n.startswith("mll")]
    assert len([n for n in names if n.startswith("scaled-additive-rbf/")]) == 4  # x, outputscale, lengthscale, scales
    for name in names:
        assert_close(runs[world_size][0]["results"][name], single[name], name=name)


def test_sharded_matvec_and_gradients_match_the_dense_math():
    """The single-process reference itself against the kernel written from the math (tests/reference.py)."""
    d = data()
    kernel = scaled_additive()
    base = kernel.base_kernel.base_kernel
    x = d["x"].clone().requires_grad_(True)
    params = list(kernel.parameters())
    dense = kernel.outputscale * reference.kernel(
        "rbf", x, x, base.lengthscale, additive=True, scales=kernel.base_kernel.component_scales
    )
    expected = dense @ d["V"]
    expected_grads = torch.autograd.grad((d["U"] * expected).sum(), [x, *params])
    single = evaluate(whole, lambda k: k)
    assert_close(single["scaled-additive-rbf/matvec"], expected.detach())
    assert_close(single["lazy/matvec"], expected.detach())
    for i, g in enumerate(expected_grads):
        assert_close(single[f"scaled-additive-rbf/grad{i}"], g, name=f"grad{i}")
        assert_close(single[f"lazy/grad{i}"], g, name=f"lazy grad{i}")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_cg_kernel_ridge_and_linear_operator_solves_match(runs, single, world_size):
    results = runs[world_size][0]["results"]
    for name in ("cg", "cg/nystrom", "linear_operator-solve", "kernel-ridge/coef", "kernel-ridge/predict"):
        assert_close(results[name], single[name], name=name)
    d = data()
    with torch.no_grad():
        dense = scaled_additive()(d["x"]).to_dense() + 0.1 * torch.eye(N, dtype=torch.float64)
    assert_close(results["cg"], torch.linalg.solve(dense, d["B"]), rtol=1e-9, name="cg vs dense solve")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_exact_mll_its_gradients_and_predictions_match(runs, single, world_size):
    results = runs[world_size][0]["results"]
    grads = [n for n in single if n.startswith("mll/grad")]
    assert len(grads) == 7  # mean, noise, 2 outputscales, 2 ARD lengthscales, component scales
    for name in ["mll", *grads, "gp-predictive-mean"]:
        assert_close(results[name], single[name], name=name)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ntk_operators_shard_by_whole_samples(runs, single, world_size):
    for name in ("ntk-full/matvec", "ntk-trace/matvec", "ntk-trace/grad-outputscale"):
        assert_close(runs[world_size][0]["results"][name], single[name], name=name)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_rank_holds_the_same_results(runs, world_size):
    first = runs[world_size][0]["results"]
    for other in runs[world_size][1:]:
        for name, value in first.items():
            assert torch.equal(other["results"][name], value), name


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_disagreeing_ranks_all_raise_a_clear_error(runs, world_size):
    for rank, run in enumerate(runs[world_size]):
        errors = run["errors"]
        assert "disagree on the operator's shapes or dtypes" in errors["shape"] and "(37, 3)" in errors["shape"]
        assert "float32" in errors["dtype"] and "float64" in errors["dtype"]
        for case in ("hyperparameter", "data-order"):
            assert "holds different values of LazyKernelOperator.x1" in errors[case], errors[case]
        assert "different right-hand side" in errors["rhs"] and "seed" in errors["rhs"]
        assert "op must be a linear_operator LinearOperator" in errors["not-an-operator"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_per_rank_memory_of_the_row_block_falls_as_one_over_workers(runs, one_process_memory_mb, world_size):
    """The 3000 x 3000 float64 kernel matrix is 68.7 MiB in one process; each rank holds only its
    row block (34.3 MiB on 2 ranks, 22.9 MiB on 3). Measured as peak RSS, dense budget on minus
    off, within a band for allocator noise (a few MiB on this shared machine)."""
    block = MEMORY_N**2 * 8 / 2**20
    per_rank = [run["memory_mb"] for run in runs[world_size]]
    print(f"row-block memory (MiB): 1 process {one_process_memory_mb:.1f}, {world_size} ranks {per_rank}")
    for measured, expected in [(one_process_memory_mb, block), *((mb, block / world_size) for mb in per_rank)]:
        assert 0.7 * expected < measured < 1.2 * expected, (measured, expected)


def test_row_blocks_are_balanced_and_respect_whole_samples():
    assert row_bounds(37, 3) == [(0, 13), (13, 25), (25, 37)]
    assert row_bounds(14, 3, unit=2) == [(0, 6), (6, 10), (10, 14)]
    assert row_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]


def test_shard_needs_an_initialized_process_group():
    K = lazykern.RBFKernel().double()(torch.randn(5, 2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        shard(K)
    with pytest.raises(TypeError, match="group must be a torch.distributed.ProcessGroup"):
        ShardedKernel(lazykern.RBFKernel(), group="world")
    with pytest.raises(TypeError, match="base_kernel must be a gpytorch.kernels.Kernel"):
        ShardedKernel(K)
