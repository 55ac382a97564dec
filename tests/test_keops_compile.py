"""lazykern's KeOps compile path: fast flags equal default flags, nothing leaks, compiles are locked.

KeOps compiles each formula once per flag set and caches it; these tests reuse a handful of
formulas (one combined formula per dtype, one small additive RBF kernel) to keep compiles few.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import lazykern
from lazykern import backend, settings
from lazykern.keops import session as lk
from lazykern import native
from lazykern.formulas import StationaryFormula
from lazykern.warmup import precompile

RBF = StationaryFormula("rbf", additive=True)
MATERN = StationaryFormula("matern", additive=True, nu=2.5)
RQ = StationaryFormula("rq", additive=True)
PERIODIC = StationaryFormula("periodic", additive=True)


def _every_profile(x1, x2, scales, alpha, weights):
    # exp, sqrt(q + 1e-30), log and sin in one KeOps formula: one compile per dtype and flag set.
    return (
        RBF(x1, x2, scales=scales)
        + MATERN(x1, x2, scales=scales)
        + RQ(x1, x2, alpha=alpha, scales=scales)
        + PERIODIC(x1, x2, weights=weights, scales=scales)
    )


def _dense_every_profile(x1, x2, scales, alpha, weights):
    """The same kernel from the math, in float64 torch (the reference)."""
    diff = x1[:, None, :] - x2[None, :, :]
    q = diff**2
    r = torch.sqrt(q + 1e-30) * math.sqrt(5)
    k = torch.exp(-q / 2) + (1 + r + r**2 / 3) * torch.exp(-r) + (1 + q / (2 * alpha)) ** (-alpha)
    k = k + torch.exp(-weights * torch.sin(diff) ** 2)
    return (scales * k).sum(-1)


def _run(flags: str, dtype: torch.dtype, monkeypatch):
    monkeypatch.setenv(lk.FLAGS_ENV, flags)
    gen = torch.Generator().manual_seed(1)
    n, d = 200, 4
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    x[-1] = 60.0  # far from every other point: exp underflows to 0 in both dtypes
    x1 = x.to(dtype).requires_grad_()
    x2 = x.to(dtype)  # coincident points: the Matérn sqrt at q = 0
    params = {
        "scales": (torch.rand(1, d, generator=gen, dtype=torch.float64) + 0.5).to(dtype),
        "alpha": torch.tensor([[1.7]], dtype=dtype, requires_grad=True),
        "weights": torch.full((1, d), 0.8, dtype=dtype),
    }
    rhs = torch.randn(n, 3, generator=gen, dtype=torch.float64).to(dtype)
    with settings.engine("keops"):
        out = backend.pairwise_matmul(_every_profile, x1, x2, params, rhs)
    grad_x, grad_alpha = torch.autograd.grad((out * out).sum(), [x1, params["alpha"]])
    return out.detach(), grad_x, grad_alpha, (x, params, rhs)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


# float32, where the flags matter most (the float overloads of exp, log, ...); KeOps now runs on GPUs,
# where these CPU flags never apply, so one dtype keeps the check within the suite's compile budget.
@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5)])
def test_fast_flags_match_default_flags(dtype, tol, monkeypatch):
    fast = _run(lk.FAST_FLAGS, dtype, monkeypatch)
    default = _run("", dtype, monkeypatch)
    for a, b in zip(fast[:3], default[:3]):
        assert torch.isfinite(a).all()
        assert _rel(a, b) < tol
    x, params, rhs = fast[3]
    ref = _dense_every_profile(x, x, params["scales"].double(), params["alpha"].detach().double(), params["weights"].double())
    assert _rel(fast[0], ref @ rhs.double()) < tol
    # Loading fast-flag code left the process's floating-point mode alone (no flush-to-zero).
    assert np.float32(1e-39) * np.float32(1.0) != 0
    assert torch.tensor(1e-39, dtype=torch.float32) * 1.0 != 0


@pytest.mark.slow
def test_lazykern_reduction_leaves_keops_configuration_alone(monkeypatch):
    import keopscore.binders.LinkCompile as link_compile
    from keopscore.config import config
    from pykeops.common.keops_io import keops_binder

    before = (config.cpp_flags, link_compile.cpp_flags, config.get_build_folder(), list(sys.path))
    _run(lk.FAST_FLAGS, torch.float32, monkeypatch)
    assert (config.cpp_flags, link_compile.cpp_flags, config.get_build_folder(), list(sys.path)) == before

    # A reduction built outside keops_session goes to KeOps' own loader, untouched.
    calls = []
    monkeypatch.setattr(keops_binder["cpp"], "_keops_loader", lambda *a: calls.append(a) or "keops")
    options = {"dtype_acc": "auto", "sum_scheme": "block_sum", "use_fast_math": 1, "enable_chunks": 1}
    assert keops_binder["cpp"](0, 0, 0, False, -1, "f", [], 1, "float32", "torch", options) == "keops"
    assert len(calls) == 1


def test_flags_and_folder_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(lk.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(lk.FLAGS_ENV, "  -O2   -g ")
    assert lk.compile_flags() == "-O2 -g"
    assert lk.build_folder().startswith(str(tmp_path))
    assert lk.build_folder() == lk.build_folder("-O2 -g") != lk.build_folder("")
    monkeypatch.delenv(lk.FLAGS_ENV)
    assert lk.compile_flags() in (lk.FAST_FLAGS, "")


def test_a_truncated_compiled_module_is_rebuilt_once(monkeypatch, tmp_path):
    # A compile killed while writing its module leaves a 0-byte .so that KeOps fails to import on
    # every later run; the loader deletes it (under the compile lock) and loads, i.e. rebuilds, once.
    from pykeops.common.keops_io import LoadKeOps_cpp

    monkeypatch.setenv(lk.CACHE_ENV, str(tmp_path))
    module = os.path.join(lk.build_folder(), "pykeops_cpp_0123456789.cpython-311-x86_64-linux-gnu.so")
    os.makedirs(os.path.dirname(module), exist_ok=True)
    open(module, "wb").close()
    calls = []

    def load(*args):
        calls.append(os.path.exists(module))
        if os.path.exists(module):
            raise ImportError(f"{module}: file too short")
        return "loaded"

    monkeypatch.setattr(LoadKeOps_cpp, "LoadKeOps_cpp_class", load)
    loader = lk._LazykernLoader(keops_loader=None, lazykern_builds=True)
    assert loader("formula", {lk._MARK: lk.compile_flags()}) == "loaded"
    assert calls == [True, False]

    def other_failure(*args):
        raise ImportError("libcuda.so: cannot open shared object file")

    monkeypatch.setattr(LoadKeOps_cpp, "LoadKeOps_cpp_class", other_failure)
    with pytest.raises(ImportError, match="libcuda"):  # anything else is not ours to repair
        lk._LazykernLoader(keops_loader=None, lazykern_builds=True)("formula 2", {lk._MARK: lk.compile_flags()})


def test_precompile_is_the_function_without_a_package_patch():
    """``lazykern.precompile`` is the function; its module has another name (``lazykern.warmup``), so
    importing the module binds nothing over it and the package is a plain module."""
    import importlib
    import types

    warmup = importlib.import_module("lazykern.warmup")
    assert type(lazykern) is types.ModuleType
    assert lazykern.precompile is warmup.precompile is precompile


def test_precompile_rejects_bad_arguments():
    kernel = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(), num_dims=3)
    with pytest.raises(TypeError, match="kernel"):
        precompile(object())
    with pytest.raises(TypeError, match="dtype"):
        precompile(kernel, dtype=torch.int64)
    with pytest.raises(ValueError, match="dims is required"):
        precompile(lazykern.RBFKernel())
    with pytest.raises(ValueError, match="columns"):
        precompile(kernel, columns=(0,))
    for columns in ([], (1, True), 16):
        with pytest.raises(ValueError, match="columns must be a non-empty sequence of positive ints"):
            precompile(kernel, columns=columns)
    with pytest.raises(ValueError, match="points"):
        precompile(kernel, points=0)
    with pytest.raises(TypeError, match="on_compile must be callable"):
        precompile(kernel, on_compile="print")


CHILD = textwrap.dedent(
    """
    import json, os, sys, torch, lazykern, lazykern.keops
    from lazykern.warmup import precompile

    def modules(folder):
        return sorted(f for f in os.listdir(folder) if f.startswith("pykeops_cpp_") and f.endswith(".so"))

    kernel = lazykern.AdditiveStructureKernel(lazykern.RBFKernel(ard_num_dims=2), num_dims=2).double()
    kernel.base_kernel.lengthscale = torch.tensor([[0.7, 1.3]], dtype=torch.float64)
    with lazykern.settings.engine("keops"):  # precompile compiles for the engine in force
        report = precompile(kernel, dtype=torch.float64, columns=(1,))
    folder = lazykern.keops.build_folder()
    compiled = modules(folder)

    x = torch.linspace(-2, 2, 40, dtype=torch.float64).reshape(20, 2)
    v = torch.cos(torch.arange(20, dtype=torch.float64)).unsqueeze(-1)
    with lazykern.settings.engine("keops"), lazykern.settings.max_dense_bytes(0):
        out = kernel(x, x) @ v
        (grad,) = torch.autograd.grad(out.sum(), [kernel.base_kernel.raw_lengthscale])
    print("RESULT", json.dumps({"folder": folder, "report": report._asdict(), "after_precompile": compiled,
                                "after_run": modules(folder),
                                "out": out.squeeze(-1).tolist(), "grad": grad.reshape(-1).tolist()}))
    """
)


@pytest.mark.slow
def test_two_processes_compile_concurrently_into_an_empty_cache(tmp_path):
    env = dict(os.environ, **{lk.CACHE_ENV: str(tmp_path), native.CACHE_ENV: str(tmp_path / "cpu"), "PYKEOPS_VERBOSE": "0"})
    env.pop(lk.FLAGS_ENV, None)
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=1200)
        assert proc.returncode == 0, stderr[-3000:]
        results.append(json.loads(next(l for l in stdout.splitlines() if l.startswith("RESULT"))[7:]))

    # Reference from the math: k = sum_d exp(-(x_d - x'_d)^2 / (2 l_d^2)); d/d raw_l via l = softplus(raw_l).
    x = torch.linspace(-2, 2, 40, dtype=torch.float64).reshape(20, 2)
    v = torch.cos(torch.arange(20, dtype=torch.float64)).unsqueeze(-1)
    raw = torch.log(torch.expm1(torch.tensor([0.7, 1.3], dtype=torch.float64))).requires_grad_()
    ls = torch.nn.functional.softplus(raw)
    K = torch.exp(-0.5 * ((x[:, None, :] - x[None, :, :]) / ls) ** 2).sum(-1)
    ref = K @ v
    (ref_grad,) = torch.autograd.grad(ref.sum(), [raw])

    for result in results:
        assert result["folder"].startswith(str(tmp_path))
        # forward + the fused gradient of K(X, X) (both sides and every hyperparameter in one
        # reduction): compiled by precompile, in lazykern's folder, and nothing more needed afterwards.
        assert len(result["after_precompile"]) == 2
        # Each process loaded both, compiled by itself or found in the cache, and the grid preconditioner
        # CG would get (the structured engine's C program); the report's folder holds them.
        assert result["report"]["compiled"] + result["report"]["cached"] == 3
        assert result["folder"].startswith(result["report"]["folder"])
        assert result["after_run"] == result["after_precompile"]
        assert _rel(torch.tensor(result["out"], dtype=torch.float64), ref.squeeze(-1)) < 1e-12
        assert _rel(torch.tensor(result["grad"], dtype=torch.float64), ref_grad) < 1e-10


TRAIN_AFTER_PRECOMPILE = textwrap.dedent(
    """
    import json, torch
    from lazykern import native
    from lazykern.warmup import precompile
    from lazykern.regression import fit_evaluate, make_kernel

    calls = []
    report = precompile(make_kernel("additive-rbf", 3), dtype=torch.float64, on_compile=calls.append)
    again = precompile(make_kernel("additive-rbf", 3), dtype=torch.float64, on_compile=calls.append)
    after = len(native.compile_log)
    x = torch.rand(60, 3, dtype=torch.float64)
    y = torch.sin(4 * x).sum(-1)
    for cholesky in (100, 0):  # the exact path (dense build) and CG (lazy products)
        fit_evaluate(x[:40], y[:40], x[40:], y[40:], kernel="additive-rbf", iters=2, analyze=False,
                     max_cholesky_size=cholesky, progress=False)
    print("RESULT", json.dumps({"report": report._asdict(), "again": again._asdict(), "calls": calls,
                                "training_compiles": native.compile_log[after:]}))
    """
)


def test_precompile_covers_training_on_the_cpu_engine(tmp_path):
    env = dict(os.environ, **{lk.CACHE_ENV: str(tmp_path), native.CACHE_ENV: str(tmp_path / "cpu")})
    proc = subprocess.run([sys.executable, "-c", TRAIN_AFTER_PRECOMPILE], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[7:])
    report = result["report"]
    # Products, the fused gradient, the dense build and its backward: compiled once, announced once.
    assert report["compiled"] >= 4 and report["cached"] == 0 and report["folder"].startswith(str(tmp_path / "cpu"))
    assert result["calls"] == [report["folder"]]
    # The same process again: everything is loaded already, nothing compiled, nothing announced.
    assert (result["again"]["compiled"], result["again"]["cached"]) == (0, 0)
    assert result["training_compiles"] == [], "training compiled what precompile left out"
