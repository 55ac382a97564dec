"""The GPU benchmark: lazykern's GPU engines against GPyTorch's KeOps kernels, in parts.

Parts (each in its own process under a hard time limit, so a crash, a hang or an out-of-memory in
one leaves the others running; each cell inside a part is guarded too):

* ``probe``: KeOps' health check as lazykern runs it (:func:`lazykern.keops.health.health`), the CUDA
  shim and NVRTC engine it used, and :func:`lazykern.backend.engine_report`;
* ``agree``: each GPU engine against the chunked torch engine on the same GPU (values of
  ``K(X, Z) @ V``, ``diag=True`` and the gradients of every parameter and of X and Z), float64 and
  float32, on an ARD RBF, an additive Matérn-5/2, a projected kernel with learned directions and the
  Newton–Girard interaction kernel: the CPU tests run the GPU engines only under Triton's
  interpreter and KeOps' CPU mode, so this is where their compiled GPU code is checked;
* ``keops_raw``: the same first reduction through plain pykeops, without lazykern's configuration
  (the outcome a KeOps user gets: on an H200 with driver 580, a segfault: docs/gpu.rst);
* ``lazy_pass``: one lazy ``K(X, X) @ V`` (16 columns) of an additive RBF kernel at d = 26, N = 13,500
  and 100,000, in pair·dim/s (N² d per second): lazykern on Triton and on KeOps, GPyTorch's KeOps
  ``RBFKernel`` (ARD, the full-dimensional kernel: the KeOps reference rate) and GPyTorch's
  ``AdditiveStructureKernel`` over its ``RBFKernel`` (its KeOps ``RBFKernel`` cannot be the base: the
  batch of one-dimensional kernels fails in ``SumBatchLinearOperator``);
* ``mll``: one exact-GP marginal-likelihood step (forward + backward, GPyTorch's defaults) at
  N = 13,500, d = 26, the same methods;
* ``seed``: the seed scenario, ``lazykern uci pol`` on the full training set, 20 Adam steps,
  additive RBF (needs the UCI ``pol`` files: ``--data-dir``, ``$LAZYKERN_DATA``);
* ``krr_cg``: one conjugate-gradient iteration of kernel ridge regression (RBF, ARD) at
  N = 1,000,000, d = 9, on each lazykern engine;
* ``ntk``: the trace NTK block of the benchmark CNN (``benchmarks/ntk.py``'s ``cifar_cnn``) at N = 4,096.

Every cell records its time, the device's peak memory in the cell
(``torch.cuda.max_memory_allocated``; on a CPU, the process's peak RSS) and its error, if any.
Results: ``<out>/<name>.json`` and ``.md``. ``--tiny`` runs every part in this process on the CPU at
toy sizes, with the CPU engines standing in for the GPU ones (a check of the driver itself, used by
the tests).

Usage::

    python benchmarks/gpu.py --name gpu-nvidia-h200            # on a CUDA machine (benchmarks/gpu.sh)
    python benchmarks/gpu.py --tiny --out /tmp/gpu-tiny         # anywhere, in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARK = "GPU_RESULT "

#: Seconds each part may take on the GPU (a part past it is killed; its finished cells are kept).
#: 500 s in all (the probe's include the first-time builds of KeOps' engine and binder): gpu.sh's 9 minutes.
BUDGETS = {"probe": 120, "agree": 60, "keops_raw": 40, "lazy_pass": 90, "mll": 60, "seed": 60, "krr_cg": 35, "ntk": 35}
FULL = {"agree": (300, 200), "lazy_pass": (13_500, 100_000), "mll": 13_500, "krr_cg": 1_000_000, "ntk": 4_096}
TINY = {"agree": (30, 20), "lazy_pass": (64,), "mll": 64, "krr_cg": 256, "ntk": 16}
D, D_KRR, D_AGREE, COLUMNS = 26, 9, 5, 16
#: Largest relative error an engine may differ from the torch engine by, per dtype.
AGREE_TOL = {"float64": 1e-10, "float32": 1e-4}
GPU_ENGINES, CPU_ENGINES = ("triton", "keops"), ("cpu", "torch")


def _emit(record: dict[str, Any]) -> None:
    print(MARK + json.dumps(record), flush=True)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: Any) -> tuple[int, str]:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kb * 1024, "process_peak_rss"


def _cell(part: str, device: Any, fields: dict[str, Any], run: Callable[[], dict[str, Any] | None]) -> None:
    """Run one cell, guarded: its result (or error), its time and the device's peak memory in it."""
    _reset_peak(device)
    start = time.perf_counter()
    record: dict[str, Any] = {"part": part, **fields}
    try:
        record.update(run() or {})
        record["status"] = "ok"
    except Exception as err:  # noqa: BLE001 - one cell's failure is recorded, the rest go on
        record.update(status="error", error=f"{type(err).__name__}: {err}"[:500])
        traceback.print_exc(file=sys.stderr)
    record["cell_seconds"] = round(time.perf_counter() - start, 3)
    record["peak_memory_bytes"], record["peak_memory_measure"] = _peak(device)
    _emit(record)


def _timed(device: Any, step: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``step`` after one untimed run (compiles, caches)."""
    step()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _methods(tiny: bool) -> list[tuple[str, str | None]]:
    """(method, lazykern engine or None for GPyTorch's kernels)."""
    engines = CPU_ENGINES if tiny else GPU_ENGINES
    return [*((f"lazykern-{e}", e) for e in engines), ("gpytorch-keops-rbf", None), ("gpytorch-additive-structure", None)]


def _kernel(method: str, d: int):
    import gpytorch

    from lazykern.regression import make_kernel

    if method == "gpytorch-keops-rbf":
        return gpytorch.kernels.ScaleKernel(gpytorch.kernels.keops.RBFKernel(ard_num_dims=d))
    if method == "gpytorch-additive-structure":  # dense per-dimension blocks (no KeOps base kernel takes it)
        return gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.AdditiveStructureKernel(gpytorch.kernels.RBFKernel(), num_dims=d))
    return make_kernel("additive-rbf", d)


def _engine(engine: str | None):
    import contextlib

    from lazykern import settings

    return settings.engine(engine) if engine else contextlib.nullcontext()


def part_probe(device: Any, tiny: bool) -> None:
    def run() -> dict[str, Any]:
        from lazykern import backend
        from lazykern.keops import discovery, health as keops_health, nvrtc

        if device.type != "cuda":
            return {"report": backend.engine_report(device)}
        shim = discovery.configure()
        health = keops_health.health(device)
        return {"keops_ok": health.ok, "cause": health.cause, "stack": dict(health.stack), "cached": health.cached,
                "cuda_shim": shim, "nvrtc_engine": nvrtc.select_jit_engine(),
                "report": backend.engine_report(device)}

    _cell("probe", device, {}, run)


def part_agree(device: Any, tiny: bool) -> None:
    import torch

    from lazykern import settings
    from lazykern.regression import make_kernel

    n, m = (TINY if tiny else FULL)["agree"]
    engines = CPU_ENGINES[:1] if tiny else GPU_ENGINES

    def results(kernel, x, z, v, engine: str) -> list[Any]:
        """K(X, Z) @ V, the diagonal, and the gradients of <W, K V> of every parameter, X and Z."""
        kernel.zero_grad()
        x, z = x.clone().requires_grad_(True), z.clone().requires_grad_(True)
        with settings.engine(engine), settings.max_dense_bytes(0):
            product = kernel(x, z) @ v
            diag = kernel(x, diag=True)
            weights = torch.linspace(-1, 1, product.numel(), dtype=x.dtype, device=device).view_as(product)
            (product * weights).sum().backward()
        return [product.detach(), diag.detach(), x.grad, z.grad, *(p.grad for p in kernel.parameters())]

    for name in ("rbf-ard", "additive-matern52", "dpa-matern52-learned", "additive-ng"):
        for dtype in (torch.float64, torch.float32):
            generator = torch.Generator().manual_seed(3)
            x, z = (torch.randn(2, size, D_AGREE, generator=generator, dtype=dtype).to(device) for size in (n, m))
            v = torch.randn(2, m, 3, generator=generator, dtype=dtype).to(device)
            kernel = make_kernel(name, D_AGREE).to(device=device, dtype=dtype)
            reference = results(kernel, x, z, v, "torch")
            tolerance = AGREE_TOL[str(dtype).removeprefix("torch.")]
            for engine in engines:
                def run(kernel=kernel, x=x, z=z, v=v, engine=engine, reference=reference,
                        tolerance=tolerance) -> dict[str, Any]:
                    errors = [float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                              for a, b in zip(results(kernel, x, z, v, engine), reference)
                              if a is not None or b is not None]  # (a parameter the kernel holds fixed: None)
                    if not max(errors) <= tolerance:
                        raise AssertionError(f"relative errors {['%.1e' % e for e in errors]} (product, diag, X, Z, "
                                             f"parameters) above {tolerance:.0e}")
                    return {"max_relative_error": max(errors)}

                _cell("agree", device, {"method": f"lazykern-{engine}", "kernel": name, "dtype": str(dtype),
                                        "n": n}, run)


def part_keops_raw(device: Any, tiny: bool) -> None:
    def run() -> dict[str, Any]:
        import torch
        from pykeops.torch import LazyTensor

        x = torch.randn(200, 3, device=device)
        K = (-((LazyTensor(x[:, None, :]) - LazyTensor(x[None, :, :])) ** 2).sum(-1)).exp()
        value = (K @ torch.ones(200, 1, device=device)).squeeze(-1)
        dense = torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1)).sum(-1)
        return {"relative_error": float((value - dense).abs().max() / dense.abs().max())}

    if tiny:  # a KeOps CPU compile takes 20 s: the driver check needs none
        return
    _cell("keops_raw", device, {}, run)


def part_lazy_pass(device: Any, tiny: bool) -> None:
    import torch

    from lazykern import settings

    generator = torch.Generator().manual_seed(0)
    for n in (TINY if tiny else FULL)["lazy_pass"]:
        x = torch.randn(n, D, generator=generator).to(device)
        v = torch.randn(n, COLUMNS, generator=generator).to(device)
        for method, engine in _methods(tiny):
            def run(method=method, engine=engine, x=x, v=v, n=n) -> dict[str, Any]:
                kernel = _kernel(method, D).to(device)
                with torch.no_grad(), _engine(engine), settings.max_dense_bytes(0):
                    seconds = _timed(device, lambda: kernel(x) @ v, repeats=3)
                return {"seconds": seconds, "pair_dim_per_s": n * n * D / seconds}

            _cell("lazy_pass", device, {"method": method, "n": n, "d": D}, run)


def part_mll(device: Any, tiny: bool) -> None:
    import gpytorch
    import torch

    from lazykern.regression import build_model

    n = (TINY if tiny else FULL)["mll"]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, D, generator=generator).to(device)
    y = torch.sin(x[:, :3].sum(-1)) + 0.1 * torch.randn(n, generator=generator).to(device)
    for method, engine in _methods(tiny):
        def run(method=method, engine=engine) -> dict[str, Any]:
            model, likelihood = build_model(x, y, _kernel(method, D).to(device))
            mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
            model.train()
            likelihood.train()

            def step() -> None:
                model.zero_grad()
                (-mll(model(x), y)).backward()

            with _engine(engine):
                return {"seconds": _timed(device, step, repeats=1)}

        _cell("mll", device, {"method": method, "n": n, "d": D}, run)


def part_seed(device: Any, tiny: bool, data_dir: str | None = None) -> None:
    def run() -> dict[str, Any]:
        folder = data_dir or os.environ.get("LAZYKERN_DATA")
        if not folder or not os.path.isfile(os.path.join(folder, "pol", "data.csv.gz")) and \
                not os.path.isdir(os.path.join(folder, "pol")):
            raise FileNotFoundError("no UCI pol folder: pass --data-dir or set LAZYKERN_DATA")
        out = Path(os.environ.get("GPU_SEED_JSON", "/tmp/lazykern-gpu-seed.json"))
        command = [sys.executable, "-m", "lazykern.cli", "uci", "pol", "--device", device.type, "--kernel",
                   "additive-rbf", "--optimizer", "adam", "--iters", "20", "--data-dir", folder, "--json", str(out),
                   "--quiet", *(["--n-train", "200"] if tiny else [])]
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"lazykern uci exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
        return {"seconds_wall": seconds, "result": json.loads(out.read_text())}

    _cell("seed", device, {"dataset": "pol", "kernel": "additive-rbf", "adam_steps": 20}, run)


def part_krr_cg(device: Any, tiny: bool) -> None:
    import warnings

    import torch

    import lazykern
    from lazykern import settings
    from lazykern.solvers import cg

    n = (TINY if tiny else FULL)["krr_cg"]
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(n, D_KRR, generator=generator).to(device)
    b = torch.randn(n, 1, generator=generator).to(device)
    kernel = lazykern.RBFKernel(ard_num_dims=D_KRR).to(device)
    for engine in CPU_ENGINES if tiny else GPU_ENGINES:
        def run(engine=engine) -> dict[str, Any]:
            with torch.no_grad(), settings.engine(engine), settings.max_dense_bytes(0), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # one iteration does not converge: by design
                A = kernel(x).evaluate_kernel().add_diagonal(torch.tensor(0.1, device=device))
                seconds = _timed(device, lambda: cg(A, b, max_iter=1), repeats=1)
            return {"seconds": seconds, "pair_dim_per_s": n * n * D_KRR / seconds}

        _cell("krr_cg", device, {"method": f"lazykern-{engine}", "n": n, "d": D_KRR}, run)


def part_ntk(device: Any, tiny: bool) -> None:
    import torch
    from torch import nn

    from lazykern.ntk import empirical_ntk

    n = (TINY if tiny else FULL)["ntk"]

    def run() -> dict[str, Any]:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)
        x = torch.randn(n, 3, 16, 16, device=device)
        seconds = _timed(device, lambda: empirical_ntk(net, x, mode="trace").to_dense(), repeats=1)
        return {"seconds": seconds, "plan": str(empirical_ntk(net, x, mode="trace", plan=True))}

    _cell("ntk", device, {"model": "cifar_cnn", "n": n, "mode": "trace"}, run)


PARTS = {"probe": part_probe, "agree": part_agree, "keops_raw": part_keops_raw, "lazy_pass": part_lazy_pass, "mll": part_mll, "seed": part_seed,
         "krr_cg": part_krr_cg, "ntk": part_ntk}


def _records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(MARK):]) for line in text.splitlines() if line.startswith(MARK)]


def _run_part(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One part in its own process under its budget; what it finished is kept if it is killed."""
    budget = BUDGETS[name] * args.budget_scale
    command = [sys.executable, __file__, "--part", name, *(["--data-dir", args.data_dir] if args.data_dir else [])]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=budget)
        records, status = _records(proc.stdout), proc.returncode
        ending = None if status == 0 else (f"crashed (signal {-status})" if status < 0 else f"exited {status}")
        tail = proc.stderr
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        records, ending = _records(out), f"killed after its budget of {budget:.0f} s"
        tail = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
    sys.stderr.write(tail[-3000:])
    if ending is not None:
        records.append({"part": name, "status": "part " + ending, "error": tail.strip()[-500:],
                        "cell_seconds": round(time.perf_counter() - start, 1)})
    return records


def _table(records: list[dict[str, Any]]) -> str:
    lines = ["| part | method | N | seconds | pair·dim/s | peak memory (MB) | status |", "|---|---|---|---|---|---|---|"]
    for r in records:
        rate = f"{r['pair_dim_per_s']:.3g}" if "pair_dim_per_s" in r else ""
        seconds = r.get("seconds", r.get("seconds_wall"))
        peak = r.get("peak_memory_bytes")
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error', '')[:120]}"
        if "max_relative_error" in r:
            status += f" (largest relative difference {r['max_relative_error']:.1e})"
        label = " ".join(str(r[key]) for key in ("method", "kernel", "dtype") if key in r) or r.get("model", "")
        lines.append(f"| {r['part']} | {label} | {r.get('n', '')} | "
                     f"{'' if seconds is None else f'{seconds:.4g}'} | {rate} | "
                     f"{'' if peak is None else f'{peak / 2**20:.0f}'} | {status} |")
    ratios = []
    for r in records:
        if r.get("method") == "lazykern-triton" and r["status"] == "ok":
            keops = next((k for k in records if k.get("method") == "lazykern-keops" and k["part"] == r["part"]
                          and k.get("n") == r.get("n") and k["status"] == "ok"), None)
            if keops is not None:
                ratios.append(f"{r['part']} N={r.get('n')}: Triton/KeOps time {r['seconds'] / keops['seconds']:.2f}")
    return "\n".join(lines + ([""] + [f"- {line}" for line in ratios] if ratios else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS), help="results folder (default benchmarks/results)")
    parser.add_argument("--name", default=None, help="results file name (default gpu-<device name>)")
    parser.add_argument("--parts", nargs="*", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--tiny", action="store_true", help="toy sizes on the CPU, in this process")
    parser.add_argument("--data-dir", default=None, help="folder holding the UCI pol folder (seed scenario)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiply every part's time budget")
    parser.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)  # worker: one part, this process
    args = parser.parse_args(argv)

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.part:
        kwargs = {"data_dir": args.data_dir} if args.part == "seed" else {}
        PARTS[args.part](device, args.tiny, **kwargs)
        return 0
    if device.type != "cuda" and not args.tiny:
        print("gpu.py: torch sees no CUDA device (use --tiny for a CPU check of the driver)", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu-{platform.machine()}"
    name = args.name or "gpu-" + "-".join("".join(c if c.isalnum() else " " for c in gpu.lower()).split())
    records: list[dict[str, Any]] = []
    for part in args.parts:
        print(f"== {part}", file=sys.stderr, flush=True)
        if args.tiny:
            import contextlib
            import io

            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                PARTS[part](device, True, **({"data_dir": args.data_dir} if part == "seed" else {}))
            records += _records(buffer.getvalue())
        else:
            records += _run_part(part, args)
    meta = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "tiny": args.tiny,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "gpu_memory_bytes": torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": records}, indent=1) + "\n")
    table = _table(records)
    (out / f"{name}.md").write_text(f"# {gpu}\n\n{json.dumps(meta)}\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
