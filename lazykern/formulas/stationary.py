r"""Stationary kernels as one expression, full-dimensional or additive over dimensions.

Every kernel here is a *profile* :math:`f` applied to non-negative per-dimension terms
:math:`q_d(x, x')`:

.. math::

    k_{\text{full}}(x, x') = f\Big(\sum_d q_d\Big), \qquad
    k_{\text{additive}}(x, x') = \sum_d s_d\, f(q_d).

For RBF, Matérn and RQ, inputs arrive pre-divided by the lengthscale, so
:math:`q_d = (x_d - x'_d)^2`. For the periodic kernel inputs arrive pre-multiplied by
:math:`\pi / p_d` and :math:`q_d = w_d \sin^2(x_d - x'_d)` with :math:`w_d = 2/\ell_d`.
The additive sum over :math:`d` happens *inside* the expression (``.sum(-1)``), so a reduction, on
any engine, never forms N x M x d, nor N x M.

Shapes: ``x1`` is ``(..., N, 1, D)`` and ``x2`` is ``(..., 1, M, D)`` (pairwise), or both
``(..., N, D)`` (elementwise, for diagonals and gathered entries); parameters broadcast against
them with a trailing ``D`` or ``1``. Like a KeOps expression, the result keeps a trailing axis of
size 1 (one value per pair), so scalar parameters such as ``alpha`` broadcast the same way before
and after the sum over dimensions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..validation import check_choice

# sqrt(q + eps) instead of sqrt(q): d sqrt/dq is infinite at q = 0, and inf * 0 = nan would poison
# gradients at coincident points (every diagonal entry of K(X, X)). eps is far below float32
# resolution of any distance, and a normal float32 number, so flush-to-zero leaves it alone.
_SQRT_EPS = 1e-30


def sum_last(q: Any) -> Any:
    """The sum over the last (feature) axis, kept as an axis of size 1 on every array-like: KeOps'
    ``.sum(-1)`` keeps it (one value per pair), so torch tensors keep it too.

    Example:
        >>> sum_last(torch.ones(2, 3)).shape
        torch.Size([2, 1])
    """
    return q.sum(-1, keepdim=True) if isinstance(q, torch.Tensor) else q.sum(-1)


def _rbf(q: Any) -> Any:
    return (-0.5 * q).exp()


def _matern(q: Any, nu: float) -> Any:
    r = (q + _SQRT_EPS).sqrt()
    if nu == 0.5:
        return (-r).exp()
    if nu == 1.5:
        r = math.sqrt(3.0) * r
        return (1.0 + r) * (-r).exp()
    r = math.sqrt(5.0) * r
    return (1.0 + r + r * r / 3.0) * (-r).exp()


def _rq(q: Any, alpha: Any) -> Any:
    # (1 + q / (2 alpha)) ** -alpha, written with exp/log because KeOps has no tensor-valued power.
    return (-alpha * (1.0 + q / (2.0 * alpha)).log()).exp()


def _periodic(q: Any) -> Any:
    return (-q).exp()


#: family name -> (profile, names of the profile's tensor parameters)
PROFILES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "rbf": (_rbf, ()),
    "matern": (_matern, ()),
    "rq": (_rq, ("alpha",)),
    "periodic": (_periodic, ()),
}

MATERN_NUS = (0.5, 1.5, 2.5)


@dataclass(frozen=True)
class StationaryFormula:
    """One stationary kernel expression.

    Args:
        family: ``"rbf"``, ``"matern"``, ``"rq"`` or ``"periodic"``.
        additive: sum the profile over dimensions (weighted by ``scales``) instead of applying it
            to the summed terms.
        nu: Matérn smoothness (0.5, 1.5 or 2.5); a structural choice, not a hyperparameter.

    Calling it with ``(x1, x2, **params)`` returns the kernel expression. Tensor parameters:
    ``alpha`` (RQ), ``weights`` (periodic, :math:`2/\\ell`), ``scales`` (additive).

    Example:
        >>> import torch
        >>> f = StationaryFormula("rbf", additive=True)
        >>> x = torch.randn(5, 3)
        >>> K = f(x[:, None, :], x[None, :, :], scales=torch.ones(1, 1, 3))
        >>> K.shape
        torch.Size([5, 5, 1])
    """

    family: str
    additive: bool = False
    nu: float | None = None

    #: True when k(x, x') = k(x', x), so that dk(x_j, x_i)/dx_i = dk(x_i, x_j)/dx_i and the engines
    #: fuse the gradients for both sides of K(X, X) into one reduction of one derivative.
    symmetric = True
    #: A broadcast over the input width, which the torch engine's row blocks assume by default.
    pair_width = None

    def __post_init__(self) -> None:
        check_choice("family", self.family, tuple(sorted(PROFILES)))
        if (self.family == "matern") != (self.nu is not None):
            raise ValueError("nu is required for (and only for) the matern family")
        if self.nu is not None:
            check_choice("nu", self.nu, MATERN_NUS)

    @property
    def param_names(self) -> tuple[str, ...]:
        names = PROFILES[self.family][1]
        if self.family == "periodic":
            names = names + ("weights",)
        if self.additive:
            names = names + ("scales",)
        return names

    def terms(self, x1: Any, x2: Any, weights: Any = None) -> Any:
        """Per-dimension terms :math:`q_d` (a D-vector per pair)."""
        diff = x1 - x2
        if self.family == "periodic":
            s = diff.sin()
            return weights * (s * s)
        return diff * diff

    def profile(self, q: Any, **params: Any) -> Any:
        fn, names = PROFILES[self.family]
        if self.family == "matern":
            return fn(q, self.nu)
        return fn(q, *(params[n] for n in names))

    def __call__(self, x1: Any, x2: Any, **params: Any) -> Any:
        q = self.terms(x1, x2, params.get("weights"))
        if self.additive:
            return sum_last(params["scales"] * self.profile(q, **params))
        return self.profile(sum_last(q), **params)
