r"""Plot what an additive GP learned: one curve per input dimension.

    python3 examples/additive_components.py [DATASET] [--n-train N] [--iters N] [--out FOLDER]

With :math:`k(x, x') = s \sum_d w_d\, k_d(x_d, x'_d)`, the posterior of the function is a sum of
per-dimension functions :math:`f_d(x_d)`, each with its own posterior (all conditioned on the same
data). Along the axis of dimension :math:`d`, with :math:`\hat K = K + \sigma^2 I`:

.. math::

    \mathbb E[f_d(t)] = s\, w_d\, k_d(t, X_d)\, \hat K^{-1} (y - c), \qquad
    \operatorname{Var}[f_d(t)] = s\, w_d - (s\, w_d)^2\, k_d(t, X_d)\, \hat K^{-1} k_d(X_d, t).

:math:`\hat K` is factored once (Cholesky); every component reuses it. The figure shows each mean
with a ±2σ band, in original units of the input (x axis) and of the target (y axis), with a rug of
the training inputs. The component weight :math:`s\, w_d` is printed in each panel's title: inputs
the model found irrelevant have flat curves and small weights. It is written to
FOLDER/additive_components_DATASET.png.

Data: --data-dir, else $LAZYKERN_DATA, else downloaded once (checksum-verified) into
~/.cache/lazykern/uci; DATASET "synthetic" (y = sin 3x0 + x1^2 + tanh 4x2 + ..., x5 irrelevant)
needs no data.
"""

import math

import lazykern  # noqa: I001 - first: it hides a dependency's import-time notice (lazykern/__init__.py)

import gpytorch
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from tqdm.auto import tqdm  # noqa: E402

from _common import load, output, training_parser  # noqa: E402
from lazykern.regression import build_model, gaussian_metrics, predict, train  # noqa: E402

args = training_parser(__doc__).parse_args()

data = load(args.dataset, n_train=args.n_train, dtype=torch.float64, data_dir=args.data_dir)
model, likelihood = build_model(data.train_x, data.train_y, "additive-rbf")
with gpytorch.settings.max_cholesky_size(args.n_train):
    train(model, likelihood, iters=args.iters)  # the recipe of lazykern.regression.train; progress on stderr
    rmse, nlpd = gaussian_metrics(*predict(model, likelihood, data.test_x), data.test_y)
print(f"{data.name}: test RMSE {rmse:.4f}, NLPD {nlpd:.4f} (standardized units; the mean predictor scores RMSE 1)")

# One factorization of K + sigma^2 I, shared by every component's mean and variance.
X, y = data.train_x, data.train_y
additive = model.covar_module.base_kernel
with torch.no_grad():
    K = model.covar_module(X).to_dense() + likelihood.noise * torch.eye(len(X), dtype=X.dtype)
    L = torch.linalg.cholesky(K)
    alpha = torch.cholesky_solve((y - model.mean_module.constant).unsqueeze(-1), L)
    weights = (model.covar_module.outputscale * additive.component_scales).flatten()
    lengthscales = additive.base_kernel.lengthscale.flatten()

    cols = min(6, data.d)
    rows = math.ceil(data.d / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.4 * rows), squeeze=False)
    for d, ax in enumerate(tqdm(axes.flat, desc="components", total=rows * cols, leave=False)):
        if d >= data.d:
            ax.axis("off")
            continue
        t = torch.linspace(float(X[:, d].min()), float(X[:, d].max()), 200, dtype=X.dtype).unsqueeze(-1)
        k_d = lazykern.kernels.RBFKernel().to(X.dtype)  # the one-dimensional kernel of dimension d
        k_d.lengthscale = lengthscales[d]
        cross = weights[d] * k_d(t, X[:, d : d + 1]).to_dense()  # Cov(f_d(t), y) = s w_d k_d(t, X_d)
        mean = (cross @ alpha).squeeze(-1)
        v = torch.linalg.solve_triangular(L, cross.T, upper=False)
        std = (weights[d] - (v * v).sum(0)).clamp_min(0).sqrt()
        x_axis = (t.squeeze(-1) * data.x_std[d] + data.x_mean[d]).numpy()
        mean, std = (mean * data.y_std).numpy(), (std * data.y_std).numpy()
        ax.fill_between(x_axis, mean - 2 * std, mean + 2 * std, alpha=0.3, color="C0", linewidth=0)
        ax.plot(x_axis, mean, color="C0")
        rug = (X[:, d] * data.x_std[d] + data.x_mean[d]).numpy()
        ax.plot(rug, [mean.min() - 2 * std.max()] * len(rug), "|", color="k", alpha=0.05, markersize=6)
        ax.set_title(f"x{d}  (weight {float(weights[d]):.2g})", fontsize=9)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{data.name}: learned additive components, posterior mean ± 2σ (target units)")
    fig.tight_layout()
    out = output(args.out, f"additive_components_{data.name}.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
