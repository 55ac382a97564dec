r"""Plot what an additive GP learned: one curve per input dimension.

    python3 examples/additive_components.py [DATASET] [--n-train N] [--iters N] [--out FOLDER]

With :math:`k(x, x') = s \sum_d w_d\, k_d(x_d, x'_d)`, the posterior of the function is a sum of
per-dimension functions :math:`f_d(x_d)`, each with its own posterior (all conditioned on the same
data). Only their sum's level is identified by the data, so each is shown centred on its average over
the training inputs, :math:`g_d(t) = f_d(t) - \frac1N \sum_i f_d(x_{id})`; with :math:`\hat K = K + \sigma^2 I`
and :math:`\bar k_d` the kernel of the centred component,

.. math::

    \mathbb E[g_d(t)] = s\, w_d\, \bar k_d(t, X_d)\, \hat K^{-1} (y - c), \qquad
    \operatorname{Var}[g_d(t)] = s\, w_d\, \bar k_d(t, t)
        - (s\, w_d)^2\, \bar k_d(t, X_d)\, \hat K^{-1} \bar k_d(X_d, t)

(:func:`lazykern.components.component_analysis`; :math:`\hat K` is factored once, every component
reuses it). The figure (:func:`lazykern.components.plot_components`, the one ``lazykern demo --plot``
draws) shows each mean with a band of ± 2 posterior standard deviations of the centred component,
in original units of the input (x axis) and of the target (y axis), with a rug of the training
inputs, the removed offset in the title, and the inputs' total effects and first-order shares
(for this first-order model they coincide): inputs the model found irrelevant have flat curves and
small effects. The ranking is printed as ``lazykern uci`` prints it. The figure is written to
FOLDER/additive_components_DATASET.png.

Data: --data-dir, else $LAZYKERN_DATA, else downloaded once (checksum-verified) into
~/.cache/lazykern/uci; DATASET "synthetic" (y = sin 3x0 + x1^2 + tanh 4x2 + ... + 2.5 x1 x2, x5
irrelevant) needs no data; its interaction is beyond a first-order model, whose RMSE shows it
(``lazykern demo`` fits it with the interaction kernel).
"""

import lazykern  # noqa: I001 - first: it hides a dependency's import-time notice (lazykern/__init__.py)

import gpytorch
import torch

from _common import load, output, training_parser
from lazykern.components import component_analysis, plot_components, report_lines, summary
from lazykern.regression import build_model, gaussian_metrics, predict, train

args = training_parser(__doc__).parse_args()

data = load(args.dataset, n_train=args.n_train, dtype=torch.float64, data_dir=args.data_dir)
model, likelihood = build_model(data.train_x, data.train_y, "additive-rbf")
with gpytorch.settings.max_cholesky_size(args.n_train):
    train(model, likelihood, iters=args.iters)  # the recipe of lazykern.regression.train; progress on stderr
    rmse, nlpd = gaussian_metrics(*predict(model, likelihood, data.test_x), data.test_y)
print(f"{data.name}: test RMSE {rmse:.4f}, NLPD {nlpd:.4f} (standardized units; the mean predictor scores RMSE 1)")

# One factorization of K + sigma^2 I, shared by every component's mean and variance.
with gpytorch.settings.max_cholesky_size(args.n_train):
    analysis = component_analysis(model)
print("\n".join(report_lines(summary(analysis))))
out = plot_components(analysis, output(args.out, f"additive_components_{data.name}.png"), x_mean=data.x_mean,
                      x_std=data.x_std, y_mean=data.y_mean, y_std=data.y_std,
                      title=f"{data.name}: additive RBF kernel, n_train={data.n_train}", max_panels=data.d)
print(f"wrote {out}")
