"""One exact-GP training step of an interaction kernel on the Cholesky path, per engine.

``lazykern uci``'s default kernel, ``additive-ng`` (:class:`lazykern.kernels.NewtonGirardAdditiveKernel`,
all D orders, built and initialized by :func:`lazykern.regression.build_model`), or ``oak``, on N
standard normal points with D = 26 (the UCI ``pol`` width), float32, under
``gpytorch.settings.max_cholesky_size(N)``: the kernel matrix is built densely
(``lazykern.backend.pairwise_dense``) and its gradient flows back through the dense native. One step
is ``-mll(model(x), y)`` and its ``backward()``.

Each engine runs in a fresh subprocess: one untimed step (compiles, if any; their seconds are
reported from ``lazykern.native.compile_log``), then ``--repeats`` timed steps; the median wall
and CPU seconds are reported with the load average. The machine may be shared: compare the ratio of
one run, not absolute numbers. ``auto`` is the default engine (lazykern's CPU engine where it
supports the formula); ``torch`` is the torch row-block engine, which ``auto`` fell back to for
the dense build before the CPU engine supported interaction kernels.

Usage::

    PYTHONPATH=$PWD python benchmarks/interaction_step.py --n 600 --repeats 1   # smoke run
    PYTHONPATH=$PWD python benchmarks/interaction_step.py                       # N = 2000

(Below :class:`lazykern.settings.keops_min_size`, 512 points, ``auto`` is the torch engine too.)
Measured on a shared 2-core AMD EPYC VM on 2026-11-30 (load 4-6, so only the ratio means anything),
additive-ng at N = 2000: auto 3.6 s wall / 2.5 CPU s per step, torch 46 s / 28 CPU s (11x); before
the CPU engine supported interaction kernels, auto took 62 s / 30 CPU s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _step_worker(kernel_name: str, n: int, d: int, engine: str, repeats: int) -> dict:
    import gpytorch
    import torch

    from lazykern import settings
    from lazykern import native
    from lazykern.regression import build_model

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen)
    y = torch.sin(x[:, :3].sum(-1)) + 0.1 * torch.randn(n, generator=gen)
    model, likelihood = build_model(x, y, kernel_name)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()

    def step() -> None:
        model.zero_grad()
        with settings.engine(engine), gpytorch.settings.max_cholesky_size(n):
            loss = -mll(model(x), y)
            loss.backward()

    step()  # compiles, if any
    compiles = [s for _, s in native.compile_log]
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "kernel": kernel_name, "engine": engine, "n": n, "d": d, "dtype": "float32", "repeats": repeats,
        "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
        "compiles": len(compiles), "compile_s": round(sum(compiles), 2),
        "load": os.getloadavg()[0], "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernel", default="additive-ng", choices=["additive-ng", "oak"])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--d", type=int, default=26)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default="auto,torch")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="JSON file for the results (default: print only)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_step_worker(args.kernel, args.n, args.d, args.worker, args.repeats)))
        return
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    rows = []
    for engine in args.engines.split(","):
        cmd = [sys.executable, __file__, "--worker", engine, "--kernel", args.kernel, "--n", str(args.n),
               "--d", str(args.d), "--repeats", str(args.repeats)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{engine} worker failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["engine"] == "torch"), None)
    print("\n| engine | wall s | cpu s | vs torch (cpu) | compiles | compile s |\n|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{base['cpu_s'] / r['cpu_s']:.1f}x" if base else "-"
        print(f"| {r['engine']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {ratio} | {r['compiles']} "
              f"| {r['compile_s']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
