r"""Interaction orders, orthogonal additive terms and groups, each as one pairwise expression.

**Orders.** With per-dimension kernel values :math:`z_d = k_d(x_d, x'_d)` (:math:`d = 1..D`), the
interaction of order :math:`r` is the elementary symmetric polynomial
:math:`e_r(z) = \sum_{|S| = r} \prod_{d \in S} z_d` (Duvenaud, Nickisch & Rasmussen, 2011). lazykern
uses it normalized by the number of subsets,

.. math::

    \tilde e_r(z) = e_r(z) / \tbinom Dr, \qquad k(x, x') = \sum_{r=1}^R \sigma_r^2\, \tilde e_r(s \odot z),

so that :math:`\sigma_r^2` is the prior variance of order r wherever :math:`z_d = s_d = 1` (for
:math:`R = D`, the top term is the ARD product kernel itself). All R orders come out of one
O(D R) recurrence inside the expression (:func:`elementary_symmetric`).

**Orthogonal terms (OAK).** For a one-dimensional RBF kernel :math:`k(x, y)` and a Gaussian input
measure :math:`p = \mathcal N(\mu, \delta^2)`, the kernel of the functions with zero mean under
:math:`p` is :math:`\tilde k(x, y) = k(x, y) - m(x) m(y) / v` with :math:`m(x) = \int k(x, t) p(t) dt`
and :math:`v = \iint k\, p\, p` (Lu, Boukouvalas & Hensman, 2022). In coordinates
:math:`u = (x - \mu) / \ell`, with :math:`\beta = \delta^2 / \ell^2`:

.. math::

    \tilde k(u, u') = e^{-(u - u')^2 / 2} - \rho\, e^{-c (u^2 + u'^2) / 2}, \qquad
    c = \frac 1{1 + \beta}, \quad \rho = \frac{\sqrt{1 + 2\beta}}{1 + \beta}.

Both terms are close to 1 where the kernel is smooth (:math:`\beta \ll 1`: long lengthscales,
where the orthogonal term, divided by its average variance, tends to the linear kernel
:math:`(x - \mu)(x' - \mu) / \delta^2`), so their difference cancels: in float32 it is accurate to
:math:`8 \cdot 10^{-6}` at :math:`\ell = 10 \delta` and :math:`5 \cdot 10^{-4}` at
:math:`\ell = 180 \delta` (a lengthscale training reached on a linear effect). lazykern evaluates
it without cancellation, to :math:`3 \cdot 10^{-7}` at any lengthscale (measured up to
:math:`10^4 \delta`), as

.. math::

    \tilde k(u, u') = a(u)\, a(u')\, \operatorname{expm1}\big(u u' - g(u) - g(u')\big), \qquad
    a(u) = \sqrt\rho\, e^{-c u^2 / 2}, \quad g(u) = \tfrac12 \beta c\, u^2 + \tfrac12 \log\rho,

from per-point features (:func:`orthogonal_rbf_features`), with :math:`\log \rho` from ``log1p``
(it is :math:`-\beta^2/2 + O(\beta^3)`). That form is for :math:`\beta \le 1`; at short
lengthscales (:math:`\beta = \delta^2/\ell^2 \gg 1`, met training OAK on UCI bike, where a
lengthscale went to :math:`10^{-5}`) :math:`u u'` and :math:`g` are huge numbers that cancel, and
float32 lost every digit. There the same exponent is evaluated as
:math:`-\tfrac12 (u - u')^2 + \tfrac12 c\,(u^2 + u'^2) - \log\rho`, whose terms stay small
(:math:`c u^2 = (x - \mu)^2 / (\ell^2 + \delta^2)`), chosen per dimension by a 0/1 feature.

**Groups.** :math:`k(x, x') = \sum_g s_g\, k(x_{G_g}, x'_{G_g})` for given (possibly overlapping)
sets of dimensions :math:`G_g`: one stationary profile applied to each group's summed terms.

Shapes and conventions are those of :mod:`lazykern.formulas.stationary`: pairwise
``(..., N, 1, D)`` / ``(..., 1, M, D)`` or elementwise ``(..., N, D)`` inputs, parameters with a
trailing axis, a trailing axis of size 1 on the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .composite import split_columns
from .stationary import StationaryFormula, sum_last

__all__ = [
    "elementary_symmetric",
    "orthogonal_rbf_features",
    "orthogonal_rbf_terms",
    "orthogonal_rbf_variance",
    "orthogonal_rbf_l2_features",
    "orthogonal_rbf_l2_terms",
    "InteractionFormula",
    "GroupFormula",
]


def _is_lazy(t: Any) -> bool:
    return not isinstance(t, torch.Tensor)


#: The names the formulas write into a KeOps ``LazyTensor``'s formula for lazykern's own nodes, the
#: elementary symmetric polynomials and ``expm1``; the KeOps engine defines the nodes under these
#: names (:mod:`lazykern.keops.nodes`, before it makes any ``LazyTensor``). KeOps caches compiled
#: formulas by their text, so a change of a node's generated code changes its name here.
KEOPS_ELEMENTARY_SYMMETRIC = "LazykernElemSym1"
KEOPS_EXPM1 = "LazykernExpm1"


def _is_traced(t: Any) -> bool:
    """A placeholder of lazykern's CPU engine (:class:`lazykern.compiler.trace.Sym`; duck-typed, the
    formulas never import the engines)."""
    return getattr(type(t), "traced", False)


def elementary_symmetric(z: Any, max_degree: int) -> Any:
    r"""Normalized elementary symmetric polynomials :math:`\tilde e_1..\tilde e_R` of the last axis.

    :math:`\tilde e_r(z) = \binom Dr^{-1} \sum_{|S| = r} \prod_{d \in S} z_d`, computed by the
    summation recurrence (one input at a time, orders kept normalized):

    .. math::

        \tilde e^{(j)}_r = \Big(1 - \frac rj\Big) \tilde e^{(j-1)}_r + \frac rj\, z_j\, \tilde e^{(j-1)}_{r-1},
        \qquad \tilde e^{(0)} = (1, 0, \dots, 0).

    For :math:`r \le j` each step is a convex combination, so no intermediate exceeds the
    largest product of inputs and nothing cancels for non-negative inputs. It costs D R
    multiply-adds per pair.

    The textbook route, the Newton–Girard identities
    :math:`e_r = \frac 1r \sum_{m=1}^r (-1)^{m-1} e_{r-m} p_m` on the power sums
    :math:`p_m = \sum_d z_d^m` (GPyTorch's algorithm), alternates signs and is not usable in float32
    beyond a few orders. Measured (``benchmarks/interaction_accuracy.py``: float32 against this
    recurrence in float64, R = D, 2,000 random pairs, error relative to :math:`\tilde e_r(|z|)`):
    for nearby points (:math:`z_d \in (0.99, 1]`) Newton–Girard's largest error over the orders
    is 0.16 at D = 20 and :math:`2 \cdot 10^{12}` at D = 64 (high orders drown in the rounding of
    :math:`e_{D/2} \approx 10^{18}`); for uniform :math:`z_d \in (0, 1]` it is
    :math:`3 \cdot 10^{9}` at D = 20. Rescaling (power sums of :math:`z / D`, rescaled back) does
    not help: cancellation, not range, is the problem (and at D >= 32 it returns NaN). This
    recurrence stays within :math:`2 \cdot 10^{-6}` (about 30 float32 ulps) on every order, for
    D = 8 to 64, for nearby, uniform, distant (RBF values down to :math:`10^{-20}`) and signed
    (OAK-like, in (-0.2, 1]) inputs.

    On KeOps ``LazyTensor`` inputs the recurrence is one formula node
    (:mod:`lazykern.keops.nodes`), on torch tensors a loop over the last axis; both with
    the same hand-written reverse mode (first derivatives only); lazykern's compiler generates the
    KeOps node's loops, in the same order of operations. All of them are tested against one
    specification, ``lazykern.formulas.interactions.elementary_symmetric_reference``.

    Args:
        z: ``(..., D)`` tensor or KeOps ``LazyTensor`` with D-vectors.
        max_degree: R, the highest order (1 <= R <= D).

    Returns:
        ``(..., R)``: :math:`\tilde e_1, \dots, \tilde e_R`.

    Example:
        >>> import torch
        >>> elementary_symmetric(torch.tensor([1.0, 2.0, 3.0]), 3)  # (1+2+3)/3, (2+3+6)/3, 6
        tensor([2.0000, 3.6667, 6.0000])
    """
    d = z.shape[-1] if isinstance(z, torch.Tensor) else z.ndim
    if not 1 <= max_degree <= d:
        raise ValueError(f"max_degree must be between 1 and the number of dimensions {d}, got {max_degree}")
    if _is_traced(z):
        return z.elementary_symmetric(max_degree)
    if _is_lazy(z):
        return z.unary(KEOPS_ELEMENTARY_SYMMETRIC, dimres=max_degree, opt_arg=max_degree)
    return _ElementarySymmetric.apply(z, max_degree)


def elementary_symmetric_reference(z: torch.Tensor, max_degree: int) -> torch.Tensor:
    r"""The specification of the summation recurrence of :func:`elementary_symmetric`, on torch
    tensors: one input at a time, all orders at once, out of place, as the formula reads,

    .. math::

        \tilde e^{(j)}_r = \Big(1 - \frac rj\Big) \tilde e^{(j-1)}_r + \frac rj\, z_j\, \tilde e^{(j-1)}_{r-1},
        \qquad \tilde e^{(0)} = (1, 0, \dots, 0).

    Every other implementation is tested against it and its autograd derivative
    (``tests/test_elementary_symmetric.py``, float64): the in-place torch version below with its
    hand-written reverse mode, KeOps' node (:mod:`lazykern.keops.nodes`), the loops the C
    target generates (:mod:`lazykern.cpu.codegen`) and the unrolled blocks of the Triton target
    (:mod:`lazykern.triton.codegen`). The compiled ones compute ``(j - r) * e_r + r * z_j * e_{r-1}``
    times ``1 / j``, the same convex combination in another order of operations: they agree with it
    to rounding. A backward pass that must itself be differentiable (``create_graph=True``)
    differentiates this function.

    Args:
        z: ``(..., D)`` tensor.
        max_degree: R, the highest order (1 <= R <= D).

    Returns:
        ``(..., R)``: :math:`\tilde e_1, \dots, \tilde e_R`, differentiable by autograd to any order.

    Example:
        >>> elementary_symmetric_reference(torch.tensor([1.0, 2.0, 3.0]), 2)  # (1+2+3)/3, (2+3+6)/3
        tensor([2.0000, 3.6667])
    """
    d = z.shape[-1]
    steps = torch.arange(1, max_degree + 1, dtype=z.dtype, device=z.device)
    state = torch.cat([torch.ones_like(z[..., :1]), z.new_zeros(*z.shape[:-1], max_degree)], dim=-1)
    for j in range(1, d + 1):
        mix = steps / j
        higher = (1 - mix) * state[..., 1:] + mix * z[..., j - 1 : j] * state[..., :-1]
        state = torch.cat([state[..., :1], higher], dim=-1)
    return state[..., 1:]


class _ElementarySymmetric(torch.autograd.Function):
    """The recurrence on torch tensors, in place, with the reverse mode of the KeOps node: about
    twice as fast as autograd through the loop and with a fifth of its memory (one saved state per
    input instead of the intermediates of every operation). A backward pass that must itself be
    differentiable (``create_graph=True``) differentiates :func:`elementary_symmetric_reference`
    instead."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, max_degree: int) -> torch.Tensor:  # noqa: D102 - autograd protocol
        d = z.shape[-1]
        flat = z.reshape(-1, d)
        steps = torch.arange(max_degree + 1, dtype=z.dtype, device=z.device)
        state = z.new_zeros(flat.shape[0], max_degree + 1)
        state[:, 0] = 1
        history = z.new_empty(d, *state.shape) if ctx.needs_input_grad[0] else None
        for j in range(1, d + 1):
            if history is not None:
                history[j - 1] = state
            top = min(j, max_degree)  # orders above j are still zero
            gain = state[:, :top] * flat[:, j - 1 : j]  # read before state[:, 1:] is overwritten
            gain.mul_(steps[1 : top + 1] / j)
            state[:, 1 : top + 1].mul_(1 - steps[1 : top + 1] / j).add_(gain)
        ctx.save_for_backward(flat, history, z)
        ctx.shape = z.shape
        return state[:, 1:].reshape(*z.shape[:-1], max_degree)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102 - autograd protocol
        flat, history, z = ctx.saved_tensors
        d, max_degree = flat.shape[-1], history.shape[-1] - 1
        if torch.is_grad_enabled():
            (grad_z,) = torch.autograd.grad(elementary_symmetric_reference(z, max_degree), z, grad, create_graph=True)
            return grad_z, None
        steps = torch.arange(max_degree + 1, dtype=flat.dtype, device=flat.device)
        adjoint = flat.new_zeros(flat.shape[0], max_degree + 1)
        adjoint[:, 1:] = grad.reshape(-1, max_degree)
        grad_z = torch.empty_like(flat)
        for j in range(d, 0, -1):
            top = min(j, max_degree)
            coef = steps[1 : top + 1] / j
            grad_z[:, j - 1] = (adjoint[:, 1 : top + 1] * history[j - 1][:, :top]) @ coef
            carry = adjoint[:, 1 : top + 1] * flat[:, j - 1 : j]
            carry.mul_(coef)
            adjoint[:, 1 : top + 1].mul_(1 - coef)
            adjoint[:, :top].add_(carry)
        return grad_z.reshape(ctx.shape), None


def _expm1(x: Any) -> Any:
    if _is_traced(x):
        return x.expm1()
    if _is_lazy(x):
        return x.unary(KEOPS_EXPM1)
    return torch.expm1(x)


def _measure_constants(lengthscale: torch.Tensor, measure_std: torch.Tensor):
    r""":math:`\beta, c` and :math:`\log\rho` (from ``log1p``: no cancellation for small :math:`\beta`)."""
    beta = (measure_std / lengthscale) ** 2
    return beta, 1 / (1 + beta), 0.5 * torch.log1p(2 * beta) - torch.log1p(beta)


def orthogonal_rbf_features(
    x: torch.Tensor, lengthscale: torch.Tensor, measure_mean: torch.Tensor, measure_std: torch.Tensor
) -> torch.Tensor:
    r"""Per-point inputs of the orthogonalized RBF terms: ``(..., N, 5D)``,
    :math:`[u, g(u), a(u), \log a(u), m]`.

    :math:`u = (x - \mu) / \ell`, :math:`a(u) = \sqrt\rho\, e^{-c u^2 / 2}`, with
    :math:`c = 1 / (1 + \beta)`, :math:`\rho = \sqrt{1 + 2\beta} / (1 + \beta)`,
    :math:`\beta = \delta^2 / \ell^2` (see the module docstring); :math:`m = 1` where
    :math:`\beta > 1`, else 0, selects the form of the exponent, and
    :math:`g(u) = \frac12 (\beta c - m) u^2 + \frac12 \log\rho` (for :math:`m = 1`,
    :math:`\beta c - 1 = -c`). Computed once per point, differentiable in :math:`\ell` by torch.

    Args:
        x: ``(..., N, D)`` inputs.
        lengthscale, measure_mean, measure_std: :math:`\ell, \mu, \delta`, broadcasting against ``x``.

    Example:
        >>> f = orthogonal_rbf_features(torch.zeros(1, 1), torch.ones(1), torch.zeros(1), torch.ones(1))
        >>> f  # u = 0, g(0) = log(rho) / 2, a(0) = sqrt(rho), rho = sqrt(3) / 2, beta = 1: m = 0
        tensor([[ 0.0000, -0.0719,  0.9306, -0.0719,  0.0000]])
    """
    beta, c, log_rho = _measure_constants(lengthscale, measure_std)
    u = (x - measure_mean) / lengthscale
    square = u * u
    log_a = 0.5 * (log_rho - c * square)
    short = beta > 1
    g = 0.5 * (torch.where(short, -c, beta * c) * square + log_rho)
    m = short.to(u.dtype).expand_as(u)
    return torch.cat([u, g, torch.exp(log_a), log_a, m], -1)


def orthogonal_rbf_terms(x1: Any, x2: Any) -> Any:
    r"""Per-dimension values :math:`\tilde k(u_d, u'_d) = a_d a'_d\, \operatorname{expm1}(s_d)`,
    :math:`s_d = u_d u'_d - g_d - g'_d` (where :math:`m_d = 1`: :math:`s_d = -\frac12 (u_d - u'_d)^2 - g_d - g'_d`),
    of the RBF kernel made orthogonal to a Gaussian input measure, from the features of
    :func:`orthogonal_rbf_features` (trailing axis 5D). The 0/1 selector multiplies each form, so
    the result is exactly one of them.

    Far from the measure's mean at short lengthscales (standardized inputs of 10 or more, found in
    UCI data) :math:`a a'` underflows to 0 while :math:`e^{s}` overflows, and their product would be
    NaN. With :math:`r = \max(s - 1, 0)` and :math:`L = \log a + \log a' + 1`, the same value is

    .. math::

        a a'\, \operatorname{expm1}(s - r) + e^{L + r} - e^{L},

    exact where :math:`s \le 1` (:math:`r = 0`: the last two terms are the same number) and free of
    overflow beyond (:math:`L + r = -(u - u')^2 / 2 + \dots` stays bounded)."""
    (u1, g1, a1, la1, m1), (u2, g2, a2, la2, _) = split_columns(x1, 5), split_columns(x2, 5)
    diff = u1 - u2
    s = m1 * (-0.5 * diff * diff) + (1 - m1) * (u1 * u2) - g1 - g2
    return _product_expm1(a1, a2, la1, la2, s)


def _product_expm1(a1: Any, a2: Any, log_a1: Any, log_a2: Any, s: Any) -> Any:
    r""":math:`a_1 a_2 \operatorname{expm1}(s)` where :math:`a_1 a_2` may underflow while :math:`e^s`
    overflows: with :math:`r = \max(s - 1, 0)` and :math:`L = \log a_1 + \log a_2 + 1`,
    :math:`a_1 a_2 \operatorname{expm1}(s - r) + (e^{L + r} - e^L)`, the same value. The difference
    is taken first: where :math:`r = 0` it is exactly 0; added to the small first term before the
    subtraction, :math:`e^L` rounded that term to its own precision (relative errors of 3e-12 at
    lengthscale 300 in :func:`orthogonal_rbf_terms`)."""
    r = (s - 1).relu()
    log_scale = log_a1 + log_a2 + 1
    return a1 * a2 * _expm1(s - r) + ((log_scale + r).exp() - log_scale.exp())


def orthogonal_rbf_variance(lengthscale: torch.Tensor, measure_std: torch.Tensor) -> torch.Tensor:
    r"""Average variance :math:`\bar v = \int \tilde k(x, x)\, p(x)\, dx = 1 - \rho / \sqrt{1 + 2 c \beta}`
    of the orthogonalized RBF term under its measure (:math:`c, \rho, \beta` as in
    :func:`orthogonal_rbf_features`; by ``expm1``): the smoother the term, the more of it the
    constant took.

    Example:
        >>> v = orthogonal_rbf_variance(torch.tensor([1.0]), torch.tensor([1.0]))
        >>> round(v.item(), 4)   # 1 - (sqrt(3) / 2) / sqrt(2)
        0.3876
    """
    beta, c, log_rho = _measure_constants(lengthscale, measure_std)
    return -torch.expm1(log_rho - 0.5 * torch.log1p(2 * c * beta))


def orthogonal_rbf_l2_features(
    x: torch.Tensor, lengthscale: torch.Tensor, measure_mean: torch.Tensor, measure_std: torch.Tensor
) -> torch.Tensor:
    r"""Per-point inputs of :func:`orthogonal_rbf_l2_terms`: ``(..., N, 6D)``.

    The :math:`L^2(p)` inner product of two orthogonalized RBF functions,
    :math:`C(a, b) = \int \tilde k(t, a)\, \tilde k(t, b)\, p(t)\, dt`, is a sum of four Gaussian
    integrals, :math:`I_{AA} - I_{AB} - I_{BA} + I_{BB}`, one per product of the two exponentials of
    :math:`\tilde k(t, a) = e^{A(t, a)} - e^{B(t, a)}` (:math:`p = \mathcal N(0, \beta)` in
    :math:`u` coordinates). Each is close to the others where the terms are smooth, and their
    alternating sum is of order :math:`\beta^2`; written relative to :math:`I_{BB}`,

    .. math::

        C(a, b) = w(a)\, w(b) \Big[\operatorname{expm1} X(a)\, \operatorname{expm1} X(b)
                  + e^{X(a) + X(b)} \operatorname{expm1} Z(a, b)\Big],

    with :math:`w(a) = \rho\, (1 + 2c\beta)^{-1/4} e^{-c a^2 / 2}` (so :math:`I_{BB} = w(a) w(b)`),
    :math:`X(a) = \log(I_{AB} / I_{BB}) = \kappa - \frac{(c \beta)^2 a^2}{2 s}` and

    .. math::

        Z(a, b) = \log \frac{I_{AA} I_{BB}}{I_{AB} I_{BA}} = 2 z_0 - \eta\, (a - b)^2 + \gamma\, a b,

    where :math:`s = 1 + (1 + c)\beta`,
    :math:`\kappa = \frac12 \log(1 + 2c\beta) - \frac12 \log s - \log\rho
    = \frac12 \log\big(1 + \frac{\beta^3}{(1 + 2\beta)(1 + 3\beta + \beta^2)}\big)`,
    :math:`z_0 = \frac12 [\log s - \frac12 \log(1 + 2\beta) - \frac12 \log(1 + 2c\beta)]
    = \frac14 \log\big(1 + \frac{\beta^4}{(1 + \beta)(1 + 2\beta)(1 + 3\beta)}\big)`,
    :math:`\eta = \frac{c \beta^3}{2 (1 + 2\beta) s}` and
    :math:`\gamma = \frac{\beta}{1 + 2\beta} - 2\eta = \frac{\beta (1 + 3\beta)}{(1 + 2\beta)(1 + \beta) s}`.
    Every small quantity is computed directly from its second form (``log1p``, ``expm1``): no
    cancellation. (The first forms of :math:`\kappa` and :math:`z_0`, differences of logarithms of
    size :math:`\beta`, lost digits as :math:`\epsilon / \beta` at long lengthscales: relative
    errors of 2e-11 in :math:`C` at lengthscale 1,000; :math:`Z` as :math:`\frac{\beta}{1 + 2\beta} ab - \eta (a^2 + b^2) + 2 z_0`
    cancels terms of size :math:`u^2/4`: relative errors of 3e-4 in :math:`C` at a lengthscale of
    :math:`10^{-6}`, overflow below :math:`10^{-7}`.) The features are
    :math:`[w \operatorname{expm1} X,\ w e^X,\ \log w + X,\ \sqrt\eta\, a,\ \sqrt\gamma\, a,\ z_0]`:
    the products :func:`orthogonal_rbf_l2_terms` takes, and the logarithm it needs where they underflow.

    Lengthscales below :math:`10^4 \sqrt{t}\, \delta` (:math:`t` the dtype's smallest normal number:
    1.5e-150 in float64, 1e-15 in float32) are computed at that bound, where :math:`\beta` and
    :math:`u^2` stay finite for inputs up to :math:`10^4 \delta` out: the term is then a spike whose
    :math:`L^2(p)` norm, proportional to its lengthscale, is 0 against any other term's (OAK on UCI
    bike learned 4e-150 for a binary input).
    """
    lengthscale = torch.maximum(lengthscale, 1e4 * torch.finfo(lengthscale.dtype).tiny ** 0.5 * measure_std)
    beta, c, log_rho = _measure_constants(lengthscale, measure_std)
    u = (x - measure_mean) / lengthscale
    square = u * u
    s, log_2cb = 1 + (1 + c) * beta, torch.log1p(2 * c * beta)
    c_beta, beta_2b = c * beta, beta / (1 + 2 * beta)  # each below 1, so nothing overflows
    kappa = 0.5 * torch.log1p(beta * beta_2b / (beta + 3 + 1 / beta))
    big_x = kappa - c_beta * c_beta * square / (2 * s)
    z0 = 0.25 * torch.log1p(beta * c_beta * beta_2b * (beta / (1 + 3 * beta)))
    eta = 0.5 * c_beta * beta_2b * (beta / s)
    gamma = beta_2b * ((1 + 3 * beta) / (1 + beta)) / s
    log_w = log_rho - 0.25 * log_2cb - 0.5 * c * square
    w = torch.exp(log_w)
    return torch.cat([w * torch.expm1(big_x), w * torch.exp(big_x), log_w + big_x, eta.sqrt() * u, gamma.sqrt() * u,
                      z0.expand_as(u)], -1)


def orthogonal_rbf_l2_terms(x1: Any, x2: Any) -> Any:
    r"""Per-dimension :math:`C_d(a_d, b_d)` from the features of :func:`orthogonal_rbf_l2_features`:
    with :math:`v = w e^X`,
    :math:`C = (w \operatorname{expm1} X)(a)\,(w \operatorname{expm1} X)(b) + v(a)\, v(b) \operatorname{expm1} Z`.

    Far out at a short lengthscale (UCI protein: a standardized input of 28.6 at lengthscale 0.04)
    :math:`v(a) v(b)` underflows to 0 while :math:`e^Z` overflows (:math:`Z \approx \frac32 ab / \beta`,
    1,200 there), and their product was NaN; the second term is formed as
    :func:`orthogonal_rbf_terms`' is, in logarithms beyond :math:`Z = 1`."""
    p1, v1, lv1, e1, g1, z1 = split_columns(x1, 6)
    p2, v2, lv2, e2, g2, z2 = split_columns(x2, 6)
    gap = e1 - e2
    return p1 * p2 + _product_expm1(v1, v2, lv1, lv2, z1 + z2 - gap * gap + g1 * g2)


@dataclass(frozen=True)
class InteractionFormula:
    r"""All interaction orders 1..R of per-dimension kernels, as one expression.

    .. math::

        k(x, x') = \sum_{r=1}^R \sigma_r^2\, \tilde e_r\big(s_1 z_1, \dots, s_D z_D\big)

    with :math:`z_d` given by ``kind``:

    * ``"base"``: the one-dimensional ``base`` kernel (inputs pre-divided by their lengthscales,
      as for :class:`~lazykern.formulas.stationary.StationaryFormula`);
    * ``"orthogonal"``: the orthogonalized RBF term (OAK) :func:`orthogonal_rbf_terms` (inputs: the
      5D features of :func:`orthogonal_rbf_features`);
    * ``"orthogonal-l2"``: the :math:`L^2(p)` inner products of orthogonalized RBF terms,
      :func:`orthogonal_rbf_l2_terms` (inputs: the 6D features of
      :func:`orthogonal_rbf_l2_features`), from which the Sobol indices of an OAK model follow.

    Args:
        base: the one-dimensional profile (a non-additive :class:`~lazykern.formulas.stationary.StationaryFormula`;
            ``StationaryFormula("rbf")`` for the orthogonal kinds).
        max_degree: R, the highest interaction order.
        kind: ``"base"``, ``"orthogonal"`` or ``"orthogonal-l2"``.

    Tensor parameters: ``order_variances`` (:math:`\sigma^2`, trailing R), ``scales``
    (:math:`s`, trailing D) and the base's own (``alpha``, ``weights``).

    Example:
        >>> import torch
        >>> f = InteractionFormula(StationaryFormula("rbf"), max_degree=2)
        >>> x = torch.randn(5, 3)
        >>> K = f(x[:, None], x[None], order_variances=torch.ones(1, 1, 2), scales=torch.ones(1, 1, 3))
        >>> K.shape
        torch.Size([5, 5, 1])
    """

    base: StationaryFormula
    max_degree: int
    kind: str = "base"

    KINDS = ("base", "orthogonal", "orthogonal-l2")

    def __post_init__(self) -> None:
        if self.base.additive:
            raise ValueError("base must be a non-additive StationaryFormula (the sum over dimensions is the orders')")
        if self.kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {self.kind!r}")
        if self.kind != "base" and self.base.family != "rbf":
            raise ValueError(f"orthogonal terms are derived for the rbf family, got {self.base.family!r}")

    #: Every kind's terms are symmetric in the two points (the orthogonal ones depend on where the
    #: points are, not only on their difference, but swap with them).
    symmetric = True
    #: A broadcast over the input width.
    pair_width = None

    @property
    def param_names(self) -> tuple[str, ...]:
        return ("order_variances", "scales") + (self.base.param_names if self.kind == "base" else ())

    def terms(self, x1: Any, x2: Any, **params: Any) -> Any:
        """Per-dimension values :math:`z_d` (a D-vector per pair), before ``scales``."""
        if self.kind == "orthogonal":
            return orthogonal_rbf_terms(x1, x2)
        if self.kind == "orthogonal-l2":
            return orthogonal_rbf_l2_terms(x1, x2)
        return self.base.profile(self.base.terms(x1, x2, params.get("weights")), **params)

    def __call__(self, x1: Any, x2: Any, **params: Any) -> Any:
        z = params["scales"] * self.terms(x1, x2, **params)
        return sum_last(params["order_variances"] * elementary_symmetric(z, self.max_degree))


@dataclass(frozen=True)
class GroupFormula:
    r"""A sum of one stationary profile over (possibly overlapping) groups of dimensions.

    .. math::

        k(x, x') = \sum_{g=1}^G s_g\, f\Big(\sum_{d} M_{gd}\, q_d(x, x')\Big)

    with the membership matrix :math:`M \in \{0, 1\}^{G \times D}` passed as the tensor parameter
    ``membership`` (trailing :math:`G D`, row-major), per-group weights ``scales`` (trailing G),
    and the profile f and terms :math:`q_d` of the non-additive ``base``. On KeOps the group sums are
    one matrix-vector product per pair.

    Example:
        >>> import torch
        >>> f = GroupFormula(StationaryFormula("rbf"))
        >>> m = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]).reshape(1, 1, 6)
        >>> x = torch.randn(4, 3)
        >>> f(x[:, None], x[None], membership=m, scales=torch.ones(1, 1, 2)).shape
        torch.Size([4, 4, 1])
    """

    base: StationaryFormula

    symmetric = True
    #: A broadcast over the input width.
    pair_width = None

    def __post_init__(self) -> None:
        if self.base.additive:
            raise ValueError("base must be a non-additive StationaryFormula (the sum is over groups)")

    @property
    def param_names(self) -> tuple[str, ...]:
        return ("membership", "scales") + self.base.param_names

    def __call__(self, x1: Any, x2: Any, **params: Any) -> Any:
        q = self.base.terms(x1, x2, params.get("weights"))
        membership = params["membership"]
        if _is_lazy(q):
            grouped = membership.matvecmult(q)
        else:
            d = q.shape[-1]
            matrix = membership.reshape(*membership.shape[:-1], -1, d)  # (..., G, D)
            grouped = (matrix @ q.unsqueeze(-1)).squeeze(-1)
        return sum_last(params["scales"] * self.base.profile(grouped, **params))
