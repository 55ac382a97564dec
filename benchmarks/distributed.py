"""Sharded kernel products on 1, 2 and 4 local processes: time per product, its parts, peak memory.

For every worker count P (``--workers``) one ``torch.multiprocessing`` spawn starts P processes
(gloo on CPU with one thread each, ``OMP_WAIT_POLICY=PASSIVE``; NCCL with one GPU each on CUDA).
They shard ``K = ScaleKernel(additive RBF over d dims)(X)`` with ``lazykern.distributed.shard``
and, for every N (``--sizes``) and mode, time per rank (median and fastest of ``--repeats``, after
a warm-up; the fastest is what a shared machine distorts least):

* ``product``: one sharded product ``K @ V``, V of N x C (C = 11: one solve and 10 probes, as
  GPyTorch's marginal likelihood uses);
* ``local``: this rank's row block product alone (no communication);
* ``gather``: the ``all_gather`` (with its right-hand-side checksum) of an (N/P) x C block alone;
* ``gradient``: the derivative of <U, K V> with respect to inputs and hyperparameters
  (block derivative and one ``all_reduce``), as the marginal likelihood's backward pass runs it;
* ``whole``: (P = 1 only) the same product on the unsharded operator, without any process group.

Modes: ``lazy`` (``max_dense_bytes(0)``: the kernel is evaluated in every product; KeOps or the
chunked torch engine, ``--engine``) and ``dense`` (the default budget: each rank forms its N/P x N
block once and multiplies by BLAS). Memory per rank: peak RSS growth of one product, dense minus
lazy (the row block) and lazy alone (what every rank holds: inputs, right-hand sides, result).

The per-rank times are then fitted by the scaling model of docs/distributed.rst,

    t(N, P) = N^2 / (R min(P, cores)) + alpha + (P - 1)/P * N C s / B,

(R: kernel pairs per second and core from the P = 1 block products; alpha, B: latency and
bandwidth from the gather times; fastest repeats) and the fit is written next to the measurements.

Usage::

    python benchmarks/distributed.py --sizes 1000 2000 --workers 1 2 --repeats 2   # smoke run
    python benchmarks/distributed.py                                               # the full run
    python benchmarks/distributed.py --device cuda --workers 1 --sizes 100000      # one GPU

Results: ``<out>/distributed.json`` (every measurement and the fit) and ``distributed.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
COLUMNS = 11


def _vmhwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_increase_mb(run) -> float:
    """Peak RSS growth of ``run()``, the high-water mark reset first. A fixed mmap threshold
    (``M_MMAP_THRESHOLD`` = -3) makes every block of 1 MiB or more a fresh mapping, never heap memory
    left resident by an earlier (freed) block, so each measurement counts its blocks in full."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 2**20)
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _vmhwm_mb()
    run()
    return _vmhwm_mb() - before


def _seconds(run, repeats: int, sync) -> dict:
    """Median and fastest of ``repeats`` timed calls after one warm-up (KeOps compile, dense
    block, allocator). On a shared machine the fastest repeat is the least distorted by others."""
    run()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "min": min(times)}


def _worker(rank: int, workers: int, port: int, config: dict, folder: str) -> None:
    import gpytorch
    import torch
    import torch.distributed as dist

    import lazykern
    from lazykern.distributed import shard
    from lazykern.distributed.collectives import gather_rows

    torch.set_num_threads(1)
    if config["chunk_mib"]:
        lazykern.settings.chunk_bytes.set_global(config["chunk_mib"] * 2**20)
    cuda = config["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=workers)
    dtype = getattr(torch, config["dtype"])

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    out = []
    for n in config["sizes"]:
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, config["d"], generator=g, dtype=torch.float64).to(device, dtype)
        V = torch.randn(n, COLUMNS, generator=g, dtype=torch.float64).to(device, dtype)
        base = lazykern.RBFKernel(ard_num_dims=config["d"])
        kernel = gpytorch.kernels.ScaleKernel(
            lazykern.AdditiveStructureKernel(base, num_dims=config["d"], component_scales=True)
        ).to(device, dtype)
        row = {"n": n, "workers": workers, "rank": rank}
        with lazykern.settings.engine(config["engine"]):
            # built with grad on (its inputs carry the lengthscales); products run without, as in CG
            K = shard(kernel(x))
            row["rows"] = K.local_rows.stop - K.local_rows.start
            W = kernel(x).evaluate_kernel() if workers == 1 else None
            for mode, budget in (("lazy", 0), ("dense", lazykern.settings.max_dense_bytes.value())):
                with lazykern.settings.max_dense_bytes(budget), torch.no_grad():
                    if mode == "lazy":
                        K._matmul(V)  # warm-up (KeOps compile, allocator), so that the peak is the product's
                    if not cuda:  # the dense mode's first product forms this rank's block
                        row[f"{mode}_peak_mb"] = _peak_increase_mb(lambda: K._matmul(V))
                    row[f"{mode}_product_s"] = _seconds(lambda: K._matmul(V), config["repeats"], sync)
                    row[f"{mode}_local_s"] = _seconds(lambda: K.local_block._matmul(V), config["repeats"], sync)
                    if W is not None:
                        row[f"{mode}_whole_s"] = _seconds(lambda: W._matmul(V), config["repeats"], sync)
                    if mode == "lazy":
                        block = V[K.local_rows]
                        row["gather_s"] = _seconds(
                            lambda: gather_rows(block, V, K.bounds, K.group), config["repeats"], sync
                        )
                        U = torch.randn_like(V)
                        with torch.enable_grad():
                            row["gradient_s"] = _seconds(
                                lambda: K._bilinear_derivative(U, V), max(1, config["repeats"] // 2), sync
                            )
        out.append(row)
        print(f"[rank {rank}/{workers}] N={n}: " + ", ".join(
            f"{k}={v['min'] if isinstance(v, dict) else v:.4g}" for k, v in row.items() if k.endswith(("_s", "_mb"))),
            flush=True)
    Path(folder, f"{workers}-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fit(rows: list[dict], cores: int, itemsize: int) -> dict:
    """The scaling model's constants from the fastest repeats (see the module docstring)."""
    import numpy as np

    single = [r for r in rows if r["workers"] == 1]
    rate = {m: statistics.median(r["n"] ** 2 / r[f"{m}_local_s"]["min"] for r in single) for m in ("lazy", "dense")}
    gathers = [r for r in rows if r["workers"] > 1]
    alpha, bandwidth = 0.0, float("inf")
    if gathers:
        A = np.array([[1.0, (r["workers"] - 1) / r["workers"] * r["n"] * COLUMNS * itemsize] for r in gathers])
        b = np.array([r["gather_s"]["min"] for r in gathers])
        (alpha, inv_bandwidth), *_ = np.linalg.lstsq(A, b, rcond=None)
        alpha = float(alpha)
        bandwidth = float(1 / inv_bandwidth) if inv_bandwidth > 0 else float("inf")
    predictions = []
    for r in rows:
        p = r["workers"]
        comm = 0.0 if p == 1 else alpha + (p - 1) / p * r["n"] * COLUMNS * itemsize / bandwidth
        for mode in ("lazy", "dense"):
            compute = r["n"] ** 2 / (rate[mode] * min(p, cores))
            predictions.append({"n": r["n"], "workers": p, "rank": r["rank"], "mode": mode,
                                "predicted_s": compute + comm, "compute_s": compute, "communication_s": comm,
                                "measured_min_s": r[f"{mode}_product_s"]["min"],
                                "measured_median_s": r[f"{mode}_product_s"]["median"]})
    return {"pairs_per_second_per_core": rate, "latency_s": alpha, "bandwidth_bytes_per_s": bandwidth,
            "cores": cores, "predictions": predictions}


def _markdown(result: dict) -> str:
    fit = result["fit"]
    lines = [
        f"Machine: {result['machine']}; {result['cores']} cores; device {result['device']}; lazy engine "
        f"{result['engine']}; {result['dtype']}; d={result['d']}; C={COLUMNS}; {result['repeats']} repeats; "
        f"load average at start {result['load_average']:.1f}.",
        "",
        f"Fit (fastest repeats): R = {fit['pairs_per_second_per_core']['lazy']:.3g} (lazy) and "
        f"{fit['pairs_per_second_per_core']['dense']:.3g} (dense) kernel pairs/s per core; "
        f"gather latency {fit['latency_s'] * 1e3:.3g} ms, bandwidth {fit['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s.",
        "",
        "| N | P | mode | product median (s) | product fastest (s) | predicted (s) | speed-up (fastest) | "
        "local block (s) | gather (s) | gradient (s) | row block (MiB/rank) | lazy peak (MiB/rank) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = result["rows"]
    preds = {(p["n"], p["workers"], p["rank"], p["mode"]): p for p in fit["predictions"]}

    def slowest(ranks, key):  # the step waits for the slowest rank
        return max(r[key]["min"] for r in ranks)

    for n in sorted({r["n"] for r in rows}):
        for mode in ("lazy", "dense"):
            ones = [r for r in rows if r["n"] == n and r["workers"] == 1]
            for p in sorted({r["workers"] for r in rows}):
                ranks = [r for r in rows if r["n"] == n and r["workers"] == p]
                if not ranks:
                    continue
                fastest = slowest(ranks, f"{mode}_product_s")
                pred = max(preds[(n, p, r["rank"], mode)]["predicted_s"] for r in ranks)
                speedup = f"{slowest(ones, f'{mode}_product_s') / fastest:.2f}" if ones else ""
                block = lazy = ""
                if "dense_peak_mb" in ranks[0]:
                    block = f"{max(r['dense_peak_mb'] - r['lazy_peak_mb'] for r in ranks):.1f}"
                    lazy = f"{max(r['lazy_peak_mb'] for r in ranks):.1f}"
                lines.append(
                    f"| {n} | {p} | {mode} | {max(r[f'{mode}_product_s']['median'] for r in ranks):.4g} | "
                    f"{fastest:.4g} | {pred:.4g} | {speedup} | {slowest(ranks, f'{mode}_local_s'):.4g} | "
                    f"{slowest(ranks, 'gather_s'):.3g} | {slowest(ranks, 'gradient_s'):.4g} | {block} | {lazy} |"
                )
    whole = [r for r in rows if "lazy_whole_s" in r]
    if whole:
        lines += ["", "Unsharded operator (no process group), same products, fastest: " + "; ".join(
            f"N={r['n']}: lazy {r['lazy_whole_s']['min']:.4g} s, dense {r['dense_whole_s']['min']:.4g} s"
            for r in whole) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 4000, 8000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    parser.add_argument("--engine", default="keops", choices=("keops", "torch"), help="engine of the lazy mode")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mib", type=int, default=None,
                        help="lazykern.settings.chunk_bytes for the torch engine (larger on GPUs)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")  # inherited by the workers
    import torch
    import torch.multiprocessing as mp

    config = {"sizes": args.sizes, "d": args.d, "dtype": args.dtype, "engine": args.engine, "device": args.device,
              "repeats": args.repeats, "chunk_mib": args.chunk_mib}
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for workers in args.workers:
            mp.spawn(_worker, args=(workers, _free_port(), config, folder), nprocs=workers, join=True)
            for rank in range(workers):
                rows += json.loads(Path(folder, f"{workers}-{rank}.json").read_text())
    cores = torch.cuda.device_count() if args.device == "cuda" else len(os.sched_getaffinity(0))
    result = {**config, "machine": platform.processor() or platform.machine(), "cores": cores,
              "load_average": load, "rows": rows}
    result["fit"] = _fit(rows, cores, torch.finfo(getattr(torch, args.dtype)).bits // 8)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distributed.json").write_text(json.dumps(result, indent=1))
    (args.out / "distributed.md").write_text(_markdown(result))
    print(_markdown(result))


if __name__ == "__main__":
    sys.exit(main())
