"""A synthetic additive regression problem with one known interaction, generated in code (no files,
no network)."""

from __future__ import annotations

import numpy as np
import torch

from ..validation import check_positive_int
from .checks import MIN_TRAINING_POINTS
from .uci import UCISplit, split_of_arrays

__all__ = ["synthetic_additive"]

# One smooth, distinct shape per input dimension (cycled when d is larger), so that the learned
# additive components can be compared against known curves.
_COMPONENTS = (
    lambda t: np.sin(3.0 * t),
    lambda t: t**2 - 1.0 / 3.0,
    lambda t: np.tanh(4.0 * t),
    lambda t: np.exp(-8.0 * t**2) - 0.31,
    lambda t: 0.5 * np.cos(5.0 * t),
    lambda t: 0.0 * t,  # an irrelevant input: its learned weight should shrink
)

#: The inputs of the one interaction term ``interaction * x_1 * x_2`` (needs d >= 3).
INTERACTION_INPUTS = (1, 2)


def synthetic_additive(
    n_train: int = 1000,
    n_test: int = 500,
    d: int = 6,
    *,
    noise: float = 0.1,
    interaction: float = 2.5,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
) -> UCISplit:
    r"""Draw :math:`y = \sum_{j=1}^{d} f_j(x_j) + c\, x_1 x_2 + \varepsilon`, :math:`x \sim U[-1, 1]^d`,
    :math:`\varepsilon \sim \mathcal N(0, \text{noise}^2)`.

    The components :math:`f_j` cycle through :math:`\sin 3t`, :math:`t^2 - 1/3`, :math:`\tanh 4t`,
    :math:`e^{-8t^2} - 0.31`, :math:`\tfrac12 \cos 5t` and :math:`0` (an irrelevant input). The
    interaction :math:`c\, x_1 x_2` (``interaction``; for d >= 3) has zero mean along each of its
    inputs, so it is a pure second-order term of the Sobol (ANOVA) decomposition under the uniform
    measure, of variance :math:`c^2 / 9`. With d = 6 and c = 2.5 the variances are 0.523, 0.089,
    0.750, 0.123, 0.109 and 0 (first order, :math:`x_0 .. x_5`) and 0.694 (the interaction): the
    order shares are 0.70 and 0.30, and :math:`x_1`, with the smallest non-zero first-order share,
    has the second largest total effect. The result is standardized with the training statistics
    exactly as :func:`lazykern.data.load_uci` does, and returned in the same
    :class:`~lazykern.data.UCISplit` (``name="synthetic-additive"``).

    Args:
        n_train: number of training points.
        n_test: number of test points.
        d: number of input dimensions.
        noise: standard deviation of the observation noise.
        interaction: coefficient c of the interaction :math:`c\, x_1 x_2` (0: none).
        seed: seed of the draw.
        dtype: ``torch.float32`` or ``torch.float64``.
        device: device of the returned tensors.

    Example:
        >>> from lazykern.data import synthetic_additive
        >>> data = synthetic_additive(n_train=100, n_test=20, d=3)
        >>> data.train_x.shape, data.test_y.shape
        (torch.Size([100, 3]), torch.Size([20]))
    """
    for arg, value in (("n_train", n_train), ("n_test", n_test), ("d", d)):
        check_positive_int(arg, value)
    if n_train < MIN_TRAINING_POINTS:  # one point has no spread to standardize by (NaN inputs)
        raise ValueError(f"n_train must be at least {MIN_TRAINING_POINTS}, got {n_train}")
    if not (isinstance(noise, (int, float)) and noise >= 0):
        raise ValueError(f"noise must be a non-negative number, got {noise!r}")
    if isinstance(interaction, bool) or not isinstance(interaction, (int, float)) or not np.isfinite(interaction):
        raise ValueError(f"interaction must be a finite number, got {interaction!r}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(n_train + n_test, d))
    f = sum(_COMPONENTS[j % len(_COMPONENTS)](x[:, j]) for j in range(d))
    if d > max(INTERACTION_INPUTS):
        f = f + interaction * x[:, INTERACTION_INPUTS[0]] * x[:, INTERACTION_INPUTS[1]]
    y = f + noise * rng.standard_normal(n_train + n_test)
    x_mean, x_std = x[:n_train].mean(0), x[:n_train].std(0)
    y_mean, y_std = y[:n_train].mean(), y[:n_train].std()
    x, y = (x - x_mean) / x_std, (y - y_mean) / y_std
    return split_of_arrays("synthetic-additive", 0, x[:n_train], y[:n_train], x[n_train:], y[n_train:],
                           (x_mean, x_std, y_mean, y_std), dtype, device)
