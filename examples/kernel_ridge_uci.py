"""Kernel ridge regression with a lazy additive RBF kernel on a UCI dataset, with and without preconditioning.

Solves :math:`(K + \\alpha I) a = y` by batched conjugate gradients (one KeOps kernel pass per iteration),
without preconditioning, with the Jacobi preconditioner and with the rank-r Nyström (pivoted Cholesky)
preconditioner, and prints CG iterations, wall time and test RMSE (original units) for each.

Data: ``LAZYKERN_DATA`` if set, else ``../shared/uci`` beside the checkout, else the download cache of
:func:`lazykern.data.load_uci`.

Run::

    python examples/kernel_ridge_uci.py --dataset pol --n-train 3000
    python examples/kernel_ridge_uci.py --dataset elevators --n-train 10000 --lazy
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import torch

import lazykern
from lazykern.data import load_uci
from lazykern.solvers import KernelRidge


def data_dir() -> Path | None:
    if "LAZYKERN_DATA" in os.environ:
        return Path(os.environ["LAZYKERN_DATA"])
    beside = Path(__file__).resolve().parents[2] / "shared" / "uci"
    return beside if beside.is_dir() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="pol")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=3000, help="training subset size (default 3000)")
    parser.add_argument("--alpha", type=float, default=1e-2, help="ridge (noise variance)")
    parser.add_argument("--lengthscale", type=float, default=1.0, help="lengthscale of every 1-D RBF")
    parser.add_argument("--rank", type=int, default=100, help="rank of the Nystrom preconditioner")
    parser.add_argument("--tol", type=float, default=1e-6, help="relative residual tolerance of CG")
    parser.add_argument("--max-iter", type=int, default=3000)
    parser.add_argument("--float32", action="store_true", help="solve in float32 (default float64)")
    parser.add_argument(
        "--lazy", action="store_true", help="never form the N x N matrix (max_dense_bytes=0): KeOps matvecs"
    )
    args = parser.parse_args()

    dtype = torch.float32 if args.float32 else torch.float64
    data = load_uci(args.dataset, args.split, n_train=args.n_train, dtype=dtype, data_dir=data_dir())
    d = data.train_x.shape[-1]
    print(f"{args.dataset}: {data.train_x.shape[0]} train / {data.test_x.shape[0]} test points, d = {d}, {dtype}")

    if args.lazy:
        lazykern.settings.max_dense_bytes.set_global(0)
    for precond in (None, "jacobi", "nystrom"):
        base = lazykern.kernels.RBFKernel().to(dtype)
        base.lengthscale = args.lengthscale
        kernel = lazykern.AdditiveStructureKernel(base, num_dims=d).to(dtype)
        model = KernelRidge(
            kernel, alpha=args.alpha, precond=precond, rank=args.rank, tol=args.tol, max_iter=args.max_iter
        )
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # non-convergence is reported below
            model.fit(data.train_x, data.train_y)
        fit_seconds = time.perf_counter() - start
        rmse = float((model.predict(data.test_x) - data.test_y).square().mean().sqrt()) * data.y_std
        result = model.fit_result_
        print(
            f"  precond={str(precond):8s} iterations={result.iterations:5d} converged={result.all_converged} "
            f"rel. residual={float(result.relative_residuals.max()):.1e} fit {fit_seconds:6.1f} s  "
            f"test RMSE={rmse:.4f}"
        )


if __name__ == "__main__":
    main()
