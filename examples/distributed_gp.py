"""Exact GP regression on a UCI dataset with its kernel products sharded over K workers.

    torchrun --nproc-per-node=K examples/distributed_gp.py [DATASET] [--data-dir DIR] [--n-train N] ...

Every worker loads the same data and seeds identically; the only change to the single-process
model is ``ShardedKernel``: each worker computes 1/K of the rows of every kernel product (CG,
Lanczos, gradients of GPyTorch's exact marginal likelihood; the predictive solve) and
``torch.distributed`` assembles the rest (gloo on CPU, NCCL with one GPU per worker). Rank 0
prints the result, the same for every K up to rounding (see docs/distributed.rst on how far
GPyTorch's stochastic likelihood estimate lets rounding travel). Run as a plain script, it is a
single worker. Data: ``--data-dir``, else ``$LAZYKERN_DATA``, else downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import lazykern  # before GPyTorch imports KeOps, whose CUDA notice lazykern keeps off stdout
import gpytorch
import torch
import torch.distributed as dist

from _common import load
from lazykern.distributed import ShardedKernel  # before init_process_group (docs/distributed.rst, Running it)
from lazykern.regression import KERNELS, PeakMemory, build_model, hyperparameters, make_kernel, train
from lazykern.solvers import KernelRidge

ENGINES = ("auto", "cpu", "structured", "torch", "keops", "triton")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", default="pol")
    parser.add_argument("--data-dir", default=None, help="uci_datasets folder (default: $LAZYKERN_DATA)")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=2000, help="training subset (0: the whole split)")
    parser.add_argument("--kernel", default="additive-rbf", choices=KERNELS)
    parser.add_argument("--iters", type=int, default=20, help="Adam steps on the exact marginal likelihood")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    parser.add_argument("--engine", default="auto", choices=ENGINES,
                        help="lazykern.settings.engine for every product (default: the chooser's pick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="rank 0 writes the result here")
    return parser.parse_args()


def init_workers() -> torch.device:
    """Join the torchrun group (or start a one-worker group); returns this worker's device."""
    if "RANK" not in os.environ:  # plain `python examples/distributed_gp.py`: one worker
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def main() -> None:
    args = parse_args()
    lazykern.settings.engine.set_global(args.engine)
    device = init_workers()
    rank, workers = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same stochastic probes on every worker
    dtype = getattr(torch, args.dtype)
    data = load(args.dataset, split=args.split, n_train=args.n_train or None, seed=args.seed, dtype=dtype,
                device=device, data_dir=args.data_dir)
    model, likelihood = build_model(data.train_x, data.train_y, ShardedKernel(make_kernel(args.kernel, data.d)))
    with PeakMemory(device) as peak:
        start = time.perf_counter()
        with gpytorch.settings.max_cholesky_size(0):  # conjugate gradients: sharded products only
            losses = train(model, likelihood, iters=args.iters, lr=args.lr, progress=rank == 0)
        train_seconds = time.perf_counter() - start
        # Posterior mean c + K(X*, X) (K + s2 I)^-1 (y - c) by lazykern's batched PCG on the same
        # sharded kernel, solved to 1e-8: a converged solve, so the prediction depends smoothly on
        # the hyperparameters (GPyTorch's default predictive solve stops at a residual of 0.01).
        start = time.perf_counter()
        constant = model.mean_module.constant.detach()
        ridge = KernelRidge(model.covar_module, alpha=likelihood.noise.item(), tol=1e-8)
        mean = ridge.fit(data.train_x, data.train_y - constant).predict(data.test_x) + constant
        predict_seconds = time.perf_counter() - start
    rmse = float((mean - data.test_y).square().mean().sqrt())
    peaks: list = [None] * workers
    dist.all_gather_object(peaks, peak.mb)
    if rank == 0:
        print(f"{args.dataset}: n_train={data.n_train}, n_test={data.n_test}, d={data.d}, {args.kernel}, "
              f"{args.dtype}, {workers} worker(s) on {device.type}")
        print(f"test RMSE {rmse:.6f} (original units {rmse * data.y_std:.6g}), final loss {losses[-1]:.6f}, "
              f"CG iterations of the prediction solve {ridge.fit_result_.iterations}")
        print(f"training {train_seconds:.1f} s, prediction {predict_seconds:.1f} s, "
              f"peak memory per worker (MiB): {', '.join(f'{p:.0f}' for p in peaks)}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"dataset": args.dataset, "n_train": data.n_train, "n_test": data.n_test, "d": data.d,
                           "kernel": args.kernel, "dtype": args.dtype, "workers": workers, "device": str(device),
                           "iters": args.iters, "rmse": rmse, "rmse_original": rmse * data.y_std, "losses": losses,
                           "train_seconds": train_seconds, "predict_seconds": predict_seconds,
                           "peak_memory_mb_per_worker": peaks, "hyperparameters": hyperparameters(model)}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
