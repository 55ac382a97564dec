r"""What an additive GP with interactions learned on a UCI dataset: order shares and components.

    LAZYKERN_DATA=../shared/uci python examples/interactions_uci.py [DATASET] [--kernel oak|additive-ng]
        [--max-degree R] [--n-train N] [--out FOLDER]

Trains an exact GP with an orthogonal additive kernel (OAK, default) or a Newton–Girard additive
kernel over interaction orders 1..R on a random training subset (lazykern's recipe: dimension-aware
lengthscales, L-BFGS to convergence), prints the test RMSE, the share of variance of each interaction
order and the inputs ranked by total effect (:func:`lazykern.components.report_lines`, as ``lazykern uci``
prints them), and saves the component plot (:func:`lazykern.components.plot_components`) to
``FOLDER/components_DATASET_KERNEL.png``.
"""

import argparse
from pathlib import Path

import torch

from _common import load
from lazykern.components import plot_components, report_lines
from lazykern.regression import fit_evaluate

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("dataset", nargs="?", default="kin40k")
parser.add_argument("--kernel", choices=("oak", "additive-ng"), default="oak")
parser.add_argument("--max-degree", type=int, default=None, help="highest interaction order (default: lazykern's)")
parser.add_argument("--n-train", type=int, default=1000)
parser.add_argument("--out", type=Path, default=Path("."), help="folder for the plot (created if missing)")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_flush_denormal(True)  # float32 denormals make CPU LAPACK ~10x slower
data = load(args.dataset, n_train=args.n_train, dtype=torch.float64)
result = fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=args.kernel,
                      max_degree=args.max_degree, y_scale=data.y_std, max_cholesky_size=args.n_train, progress=False)
print(f"{args.dataset}: n_train={data.n_train}, d={data.d}, kernel={args.kernel} (orders 1..{result.max_degree})")
print(f"test RMSE {result.rmse:.4f}, NLPD {result.nlpd:.4f} (standardized units)")
print("\n".join(report_lines(result.to_dict())))  # as `lazykern uci` prints them
args.out.mkdir(parents=True, exist_ok=True)
title = f"{args.dataset}: {args.kernel}, orders 1..{result.max_degree}"
path = plot_components(result.analysis, args.out / f"components_{args.dataset}_{args.kernel}.png", x_mean=data.x_mean,
                       x_std=data.x_std, y_mean=data.y_mean, y_std=data.y_std, title=title)
print(f"wrote {path}")
