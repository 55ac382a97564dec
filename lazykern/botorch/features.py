r"""Random features of lazykern's kernels for BoTorch's pathwise sampling, registered with
``botorch.sampling.pathwise.features.gen_kernel_features`` when this module is imported (by
:mod:`lazykern.botorch`).

**The features.** A stationary kernel is the Fourier transform of its spectral measure
(Bochner), :math:`k(\tau) = \mathbb E_{\omega}[\cos(\omega^\top \tau)]`, so :math:`p` pairs
:math:`\sqrt{1/p}\,(\sin \omega_j^\top x, \cos \omega_j^\top x)` with :math:`\omega_j` drawn from it
approximate :math:`k` without bias (Rahimi & Recht, 2007). The spectral measures, for inputs
divided by the lengthscale:

* RBF: :math:`\omega \sim \mathcal N(0, I)`; Matérn-:math:`\nu`: a Student-t with :math:`2\nu`
  degrees of freedom, :math:`\omega = z / \sqrt g`, :math:`g \sim \Gamma(\nu, \nu)`;
* RQ: a scale mixture of RBFs, :math:`(1 + r^2 / 2\alpha)^{-\alpha} = \mathbb E_{g \sim
  \Gamma(\alpha, \alpha)}[e^{-g r^2 / 2}]`, so :math:`\omega = \sqrt g\, z`, one precision
  :math:`g` per feature;
* periodic (GPyTorch's :math:`\exp(-2 \sin^2(\pi \tau / p) / \ell)` per dimension): the integer
  harmonics of :math:`2\pi / p`, :math:`\omega = 2\pi K / p` with
  :math:`P(K = k) = e^{-1/\ell} I_{|k|}(1/\ell)` (from :math:`e^{a \cos\theta} = \sum_k I_k(a)
  e^{ik\theta}`), drawn independently per dimension. These probabilities depend on :math:`\ell`,
  so a periodic map is drawn for the lengthscale it was made with (as every path is drawn for the
  model's current hyperparameters).

A sum of terms :math:`\sum_t s_t k_t(x_{G_t}, x'_{G_t})` gets the pairs split evenly among its
terms (stratified: each term's frequencies come from its own spectral measure, over its own
dimensions :math:`G_t`), term :math:`t`'s pairs weighted by :math:`\sqrt{s_t / p_t}`. The
relative error of the approximated kernel is then that of a single full-dimensional kernel with
as many features, :math:`O(1/\sqrt{p})`. Lengthscales, periods' scaling and the weights
:math:`s_t` are read when the map is evaluated, as BoTorch's own maps read theirs.

Interaction orders are a mixture over subsets of dimensions, each a product of one-dimensional
kernels: its spectral measure draws a subset, then a frequency per dimension of it
(:func:`order_features`). The orthogonalised terms of
:class:`~lazykern.kernels.OrthogonalAdditiveKernel` are not stationary; each of its features
projects a random cosine onto the functions that integrate to zero under the input measure, in
closed form (:class:`OrthogonalFeatureMap`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import gpytorch
import numpy as np
import scipy.special
import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.sampling.pathwise.features import KernelFeatureMap
from botorch.sampling.pathwise.features.maps import FeatureMap
from botorch.sampling.pathwise.features.generators import GenKernelFeatures
from botorch.sampling.pathwise.utils import (
    ChainedTransform,
    FeatureSelector,
    InverseLengthscaleTransform,
    SineCosineTransform,
    TensorTransform,
)
from gpytorch.kernels import Kernel
from torch import Size, Tensor

from ..formulas.interactions import orthogonal_rbf_features
from ..kernels import (
    AdditiveStructureKernel,
    GroupAdditiveKernel,
    NewtonGirardAdditiveKernel,
    OrthogonalAdditiveKernel,
    PeriodicKernel,
    ProductKernel,
    RQKernel,
)
from ..kernels.stationary import formula_for

__all__ = ["OrthogonalFeatureMap", "order_features", "term_features"]

_SUPPORTED = (
    "RBF, Matérn, RQ and periodic kernels, AdditiveStructureKernel (lazykern's and GPyTorch's), "
    "GroupAdditiveKernel, NewtonGirardAdditiveKernel and OrthogonalAdditiveKernel, inside ScaleKernel"
)

# Harmonics of a periodic kernel beyond this many standard deviations of K (about sqrt(1/l)) carry
# less than 1e-30 of the spectral mass: the truncation is below float64's resolution.
_PERIODIC_TAIL_SDS = 12


class _TermAmplitudes(TensorTransform):
    """Multiplies the sine and cosine of each frequency by :math:`\\sqrt{s_t / p_t}`, with the term
    weights :math:`s_t` read from the kernel when the map is evaluated."""

    term_of_pair: Tensor  # buffers (registered below)
    pairs_per_term: Tensor

    def __init__(self, kernel: Kernel, term_weights: Callable[[Kernel], Tensor], term_of_pair: Tensor,
                 pairs_per_term: Tensor) -> None:
        super().__init__()
        self.kernel = kernel
        self.term_weights = term_weights
        self.register_buffer("term_of_pair", term_of_pair)
        self.register_buffer("pairs_per_term", pairs_per_term)

    def forward(self, values: Tensor) -> Tensor:  # type: ignore[override]  # BoTorch's own transforms take no **kwargs either
        weights = self.term_weights(self.kernel).to(values)  # (*batch, 1, terms)
        amplitude = (weights / self.pairs_per_term.to(values)).sqrt()[..., self.term_of_pair]
        return values * torch.cat([amplitude, amplitude], dim=-1)


class _InversePeriodTransform(TensorTransform):
    """Multiplies the inputs by :math:`2\\pi / p`, so the integer harmonics are the frequencies."""

    def __init__(self, kernel: Kernel) -> None:
        super().__init__()
        self.kernel = kernel

    def forward(self, values: Tensor) -> Tensor:  # type: ignore[override]  # BoTorch's own transforms take no **kwargs either
        return values * (2 * math.pi / self.kernel.period_length)


def _per_dimension(value: Tensor, batch: Size, num_dims: int) -> Tensor:
    """A ``(*batch, 1, 1 or D)`` hyperparameter as ``(batch.numel(), D)``, detached (sampling only)."""
    return value.detach().expand(*batch, 1, num_dims).reshape(-1, num_dims)


def _harmonics(lengthscale: float, n: int, device: torch.device) -> Tensor:
    """``n`` integers drawn with :math:`P(K = k) = e^{-a} I_{|k|}(a)`, :math:`a = 1/\\ell`."""
    a = 1.0 / lengthscale
    top = int(math.ceil(_PERIODIC_TAIL_SDS * math.sqrt(a + 1.0))) + 1
    k = np.arange(-top, top + 1)
    probabilities = torch.as_tensor(scipy.special.ive(np.abs(k), a), dtype=torch.float64)
    draws = torch.multinomial(probabilities, n, replacement=True)
    return torch.as_tensor(k, device=device)[draws.to(device)]


def _frequencies(base: Kernel, dims: Sequence[int], num_dims: int, n: int) -> Tensor:
    """``(batch.numel(), n, len(dims))`` frequencies from the spectral measure of ``base`` on the
    dimensions ``dims``, in the units of its input transform (inputs over lengthscale, or inputs
    times :math:`2\\pi / p` for the periodic kernel)."""
    batch = base.batch_shape
    b, g = batch.numel(), len(dims)
    dtype, device = base.raw_lengthscale.dtype, base.raw_lengthscale.device
    formula = formula_for(base, additive=False)
    if formula.family == "periodic":
        lengthscale = _per_dimension(base.lengthscale, batch, num_dims)[:, list(dims)]
        return torch.stack([
            torch.stack([_harmonics(float(lengthscale[i, j]), n, device) for j in range(g)], dim=-1)
            for i in range(b)
        ]).to(dtype)
    z = torch.randn(b, n, g, dtype=dtype, device=device)
    if formula.family == "rbf":
        return z
    if formula.family == "matern":
        nu = torch.tensor(formula.nu, dtype=dtype, device=device)
        return z * torch.distributions.Gamma(nu, nu).sample((b, n, 1)).rsqrt()
    alpha = base.alpha.detach().reshape(b, 1, 1).to(dtype)  # rq
    return z * torch.distributions.Gamma(alpha.expand(b, n, 1), alpha.expand(b, n, 1)).sample().sqrt()


def term_features(
    kernel: Kernel,
    base: Kernel,
    groups: Sequence[Sequence[int]],
    term_weights: Callable[[Kernel], Tensor],
    num_inputs: int,
    num_outputs: int,
) -> KernelFeatureMap:
    r"""Random Fourier features of :math:`\sum_t s_t\, k_{\text{base}}(x_{G_t}, x'_{G_t})`:
    ``num_outputs / 2`` sine-cosine pairs split evenly among the terms, each term's frequencies drawn
    from the spectral measure of ``base`` on its dimensions :math:`G_t` (see the module's text).

    Args:
        kernel: the kernel the map represents (its ``active_dims`` select the input columns).
        base: the base kernel whose lengthscales (and periods) apply, one or one per dimension.
        groups: the dimensions :math:`G_t` of each term (after ``active_dims``).
        term_weights: returns the weights :math:`s_t` from ``kernel``, shape ``(*batch, 1, terms)``;
            called whenever the map is evaluated, so trained weights are the ones used.
        num_inputs: the number of input columns.
        num_outputs: the number of features, even and at least two per term.

    Example:
        >>> import torch, lazykern, lazykern.botorch
        >>> kernel = lazykern.RQKernel().double()
        >>> phi = lazykern.botorch.term_features(kernel, kernel, [(0, 1)], lambda k: torch.ones(1, 1),
        ...                                      num_inputs=2, num_outputs=4096)
        >>> x = torch.randn(4, 2, dtype=torch.float64)
        >>> bool((phi(x) @ phi(x).T - kernel(x).to_dense()).abs().max() < 0.1)
        True
    """
    terms = len(groups)
    pairs = num_outputs // 2
    if num_outputs % 2 or pairs < terms:
        raise UnsupportedError(
            f"{type(kernel).__name__} needs an even number of features, at least 2 per term "
            f"({2 * terms} for {terms} terms), got num_outputs={num_outputs}"
        )
    pairs_per_term = torch.tensor([pairs // terms + (t < pairs % terms) for t in range(terms)])
    term_of_pair = torch.repeat_interleave(torch.arange(terms), pairs_per_term)

    num_dims = num_inputs if kernel.active_dims is None else len(kernel.active_dims)
    weight = _zero_frequencies(base, pairs, num_dims)
    start = 0
    for dims, count in zip(groups, pairs_per_term.tolist()):
        weight[:, start:start + count, list(dims)] = _frequencies(base, dims, num_dims, count)
        start += count
    return _fourier_map(kernel, base, weight, _TermAmplitudes(kernel, term_weights, term_of_pair, pairs_per_term))


def _zero_frequencies(base: Kernel, pairs: int, num_dims: int) -> Tensor:
    return torch.zeros(base.batch_shape.numel(), pairs, num_dims, dtype=base.raw_lengthscale.dtype,
                       device=base.raw_lengthscale.device)


def _fourier_map(kernel: Kernel, base: Kernel, weight: Tensor, amplitudes: _TermAmplitudes) -> KernelFeatureMap:
    r"""BoTorch's feature map :math:`a \odot (\sin, \cos)(W \tilde x)` for frequencies ``weight``
    ``(batch.numel(), pairs, D)``, with :math:`\tilde x` the selected columns over the lengthscale
    (periodic: times :math:`2\pi / p`)."""
    if formula_for(base, additive=False).family == "periodic":
        input_transform: TensorTransform = _InversePeriodTransform(base)
    else:
        input_transform = InverseLengthscaleTransform(base)
    if kernel.active_dims is not None:
        input_transform = ChainedTransform(input_transform, FeatureSelector(indices=kernel.active_dims))
    return KernelFeatureMap(kernel=kernel, weight=weight.reshape(*base.batch_shape, *weight.shape[1:]),
                            input_transform=input_transform,
                            output_transform=ChainedTransform(amplitudes, SineCosineTransform()))


def order_features(kernel: NewtonGirardAdditiveKernel, num_outputs: int) -> KernelFeatureMap:
    r"""Random Fourier features of all interaction orders of a
    :class:`~lazykern.kernels.NewtonGirardAdditiveKernel`, by its spectral measure: the kernel is the
    mixture

    .. math::

        k(x, x') = \sum_{r=1}^R \sigma_r^2 \binom Dr^{-1} \sum_{|S| = r} \prod_{d \in S} s_d\, z_d(x_d, x'_d),

    and a product of one-dimensional stationary kernels over :math:`S` has independent
    one-dimensional frequencies on :math:`S` (zero elsewhere). Each of the ``num_outputs / 2`` pairs
    draws an order :math:`r` with probability :math:`\pi_r \propto \sigma_r^2 \tilde e_r(s)` (the
    hyperparameters when the map is made), a subset :math:`S` of :math:`r` dimensions uniformly,
    and a frequency per dimension of :math:`S`; its amplitude is the importance weight
    :math:`\sqrt{\sigma_r^2 \prod_{d \in S} s_d / (\pi_r P)}` with the hyperparameters read when
    the map is evaluated, so :math:`\Phi \Phi^\top` is an unbiased estimate of the kernel for any
    hyperparameters (and a good one near those it was made with).

    Args:
        kernel: the kernel (an :class:`~lazykern.kernels.OrthogonalAdditiveKernel`'s terms are not
            stationary: :class:`OrthogonalFeatureMap` is its map).
        num_outputs: the number of features, even.

    Example:
        >>> import torch, lazykern, lazykern.botorch
        >>> kernel = lazykern.NewtonGirardAdditiveKernel(lazykern.RBFKernel(), num_dims=4, max_degree=3).double()
        >>> phi = lazykern.botorch.order_features(kernel, num_outputs=8192)
        >>> x = torch.randn(3, 4, dtype=torch.float64)
        >>> bool((phi(x) @ phi(x).T - kernel(x).to_dense()).abs().max() < 0.1)
        True
    """
    if num_outputs % 2:
        raise UnsupportedError(f"{type(kernel).__name__} needs an even number of features, got num_outputs={num_outputs}")
    pairs, num_dims, base = num_outputs // 2, kernel.num_dims, kernel.base_kernel
    subsets = _Subsets(kernel, pairs)
    weight = _zero_frequencies(base, pairs, num_dims)
    for d in range(num_dims):
        weight[:, :, d] = _frequencies(base, (d,), num_dims, pairs)[:, :, 0]
    weight = weight * subsets.member.to(weight.device)
    amplitudes = _TermAmplitudes(kernel, subsets.weights, torch.arange(pairs), torch.ones(pairs, dtype=torch.long))
    return _fourier_map(kernel, base, weight, amplitudes)


class _Subsets:
    r"""The order and subset of dimensions of each of ``count`` features of an interaction kernel
    :math:`\sum_r \sigma_r^2 \binom Dr^{-1} \sum_{|S|=r} \prod_{d \in S} t_d k_d` (``t`` its
    ``term_scales()``), drawn with :math:`P(r) = \pi_r \propto \sigma_r^2 \tilde e_r(t)` from the
    batch-averaged hyperparameters and :math:`S` uniform, and their importance weights."""

    def __init__(self, kernel: NewtonGirardAdditiveKernel, count: int) -> None:
        num_dims, degree = kernel.num_dims, kernel.max_degree
        with torch.no_grad():
            scales = kernel.term_scales().reshape(-1, num_dims).mean(0).double()
            elementary = torch.zeros(degree + 1, dtype=torch.float64)
            elementary[0] = 1.0
            for t in scales:
                elementary[1:] = elementary[1:] + t * elementary[:-1].clone()
            binomials = torch.tensor([math.comb(num_dims, r) for r in range(1, degree + 1)], dtype=torch.float64)
            mass = kernel.outputscale.reshape(-1, degree).mean(0).double() * elementary[1:] / binomials
            probability = mass / mass.sum()
        self.order = torch.multinomial(probability, count, replacement=True)  # order - 1
        # A uniform subset of r dimensions: the r smallest of D uniform keys.
        ranks = torch.rand(count, num_dims).argsort(-1).argsort(-1)
        self.member = (ranks <= self.order[:, None]).to(kernel.base_kernel.raw_lengthscale.dtype)  # (count, D)
        self.inverse_probability = probability[self.order].reciprocal() / count

    def weights(self, kernel: NewtonGirardAdditiveKernel) -> Tensor:
        r""":math:`\sigma_r^2 \prod_{d \in S} t_d / (\pi_r\, \text{count})` of each feature, with the
        kernel's hyperparameters now, ``(*batch, 1, count)``."""
        scales = kernel.term_scales().unsqueeze(-2)  # (*batch, 1, 1, D)
        # A product, not exp(log @ member): a scale that underflowed to 0 would make that 0 * -inf.
        member = self.member.to(scales).bool()
        subset_products = torch.where(member, scales, torch.ones_like(scales)).prod(-1)  # (*batch, 1, count)
        return kernel.outputscale[..., self.order].unsqueeze(-2) * subset_products * self.inverse_probability.to(scales)


class OrthogonalFeatureMap(FeatureMap):
    r"""Random features of an :class:`~lazykern.kernels.OrthogonalAdditiveKernel`, unbiased:
    :math:`\mathbb E[\phi(x)^\top \phi(x')] = k(x, x')` exactly.

    In :math:`u = (x - \mu) / \ell` the orthogonalised term is
    :math:`\tilde k(u, u') = k(u, u') - a(u)\, a(u')`, with :math:`k` the RBF kernel and
    :math:`a = m / \sqrt v` (:func:`lazykern.formulas.interactions.orthogonal_rbf_features`).
    If :math:`f \sim GP(0, k)`, then :math:`f - m \langle f, p \rangle / v \sim GP(0, \tilde k)`; for one random feature
    :math:`\psi(u) = \sqrt2 \cos(\omega u + b)` (:math:`\omega \sim \mathcal N(0, 1)`, :math:`b`
    uniform) that is

    .. math::

        \tilde\psi(u) = \psi(u) - a(u)\, \frac{\mathbb E_{t \sim p}\, \psi(t)}{\sqrt v}
        = \sqrt2 \Big[\cos(\omega u + b) - a(u) \cos b\; e^{-\omega^2 \beta / 2} (1 + 2\beta)^{1/4}\Big],

    :math:`\beta = \delta^2 / \ell^2`, and :math:`\mathbb E[\tilde\psi(u) \tilde\psi(u')] = \tilde k(u, u')`
    (the closed forms of :math:`\mathbb E_p \psi` and :math:`v` make it exact). A feature of
    the interaction kernel is the product of independent :math:`\tilde\psi_d` over a subset
    :math:`S` drawn as for :func:`order_features`, times its importance weight, so products of
    terms need nothing of size :math:`2^D`. Evaluating costs O(n F D) time and O(n F) memory for
    F features at n points.

    Args:
        kernel: the kernel.
        num_outputs: the number of features F.

    Example:
        >>> import torch, lazykern, lazykern.botorch
        >>> kernel = lazykern.OrthogonalAdditiveKernel(num_dims=3, max_degree=2).double()
        >>> phi = lazykern.botorch.OrthogonalFeatureMap(kernel, num_outputs=20000)
        >>> x = torch.randn(3, 3, dtype=torch.float64)
        >>> bool((phi(x) @ phi(x).T - kernel(x).to_dense()).abs().max() < 0.1)
        True
    """

    frequency: Tensor  # buffers (registered below)
    phase: Tensor

    def __init__(self, kernel: OrthogonalAdditiveKernel, num_outputs: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.subsets = _Subsets(kernel, num_outputs)
        shape = (kernel.batch_shape.numel(), num_outputs, kernel.num_dims)
        ref = kernel.base_kernel.raw_lengthscale
        self.register_buffer("frequency", torch.randn(shape, dtype=ref.dtype, device=ref.device).reshape(
            *kernel.batch_shape, num_outputs, kernel.num_dims))
        self.register_buffer("phase", 2 * math.pi * torch.rand_like(self.frequency))
        self.input_transform = None
        # The importance weights, read from the kernel when evaluated (BoTorch's ScaleKernel map
        # chains its outputscale onto this transform).
        self.output_transform = _ImportanceWeights(kernel, self.subsets)

    # BoTorch's FeatureMap declares these as attributes, its own maps (KernelFeatureMap) as properties.
    @property
    def num_outputs(self) -> int:  # type: ignore[override]
        """The number of features F."""
        return self.frequency.shape[-2]

    @property
    def batch_shape(self) -> Size:  # type: ignore[override]  # as num_outputs
        """The kernel's batch shape."""
        return self.kernel.batch_shape

    def forward(self, x: Tensor) -> Tensor:
        """The features before their importance weights (the output transform applies those),
        ``(..., n, F)`` for inputs ``(..., n, d)``."""
        kernel = self.kernel
        if kernel.active_dims is not None:
            x = x.index_select(-1, kernel.active_dims)
        lengthscale = kernel.base_kernel.lengthscale  # (*batch, 1, D)
        terms = orthogonal_rbf_features(x, lengthscale, kernel.measure_mean, kernel.measure_std)
        num_dims = kernel.num_dims
        u, a = terms[..., :num_dims], terms[..., 2 * num_dims:3 * num_dims]  # (..., n, D)
        beta = (kernel.measure_std / lengthscale) ** 2
        member = self.subsets.member.to(x).T  # (D, F)
        product = None
        for d in range(num_dims):  # one dimension at a time: O(n F) memory
            omega, phase = self.frequency[..., d].unsqueeze(-2), self.phase[..., d].unsqueeze(-2)  # (*batch, 1, F)
            mean_of_psi = phase.cos() * torch.exp(-0.5 * omega**2 * beta[..., d:d + 1]) \
                * (1 + 2 * beta[..., d:d + 1]) ** 0.25
            psi = math.sqrt(2) * (torch.cos(omega * u[..., d:d + 1] + phase) - a[..., d:d + 1] * mean_of_psi)
            factor = torch.where(member[d].bool(), psi, torch.ones_like(psi))
            product = factor if product is None else product * factor
        assert product is not None  # one dimension at least
        return product


class _ImportanceWeights(TensorTransform):
    """Multiplies each feature by the square root of its importance weight (:class:`_Subsets`)."""

    def __init__(self, kernel: NewtonGirardAdditiveKernel, subsets: _Subsets) -> None:
        super().__init__()
        self.kernel = kernel
        self.subsets = subsets

    def forward(self, values: Tensor) -> Tensor:  # type: ignore[override]  # BoTorch's own transforms take no **kwargs either
        return values * self.subsets.weights(self.kernel).sqrt()


def _num_dims(kernel: Kernel, num_inputs: int) -> int:
    declared = getattr(kernel, "num_dims", None)
    if declared is not None:
        return declared
    return num_inputs if kernel.active_dims is None else len(kernel.active_dims)


@GenKernelFeatures.register((RQKernel, PeriodicKernel))
def _features_full_dimensional(kernel: Kernel, *, num_inputs: int, num_outputs: int) -> KernelFeatureMap:
    num_dims = _num_dims(kernel, num_inputs)
    return term_features(kernel, kernel, [tuple(range(num_dims))],
                         lambda k: torch.ones(*k.batch_shape, 1, 1), num_inputs, num_outputs)


@GenKernelFeatures.register(AdditiveStructureKernel)
def _features_additive(kernel: AdditiveStructureKernel, *, num_inputs: int, num_outputs: int) -> KernelFeatureMap:
    num_dims = _num_dims(kernel, num_inputs)
    return term_features(kernel, kernel.base_kernel, [(d,) for d in range(num_dims)],
                         lambda k: k.component_scales.expand(*k.batch_shape, 1, num_dims), num_inputs, num_outputs)


@GenKernelFeatures.register(GroupAdditiveKernel)
def _features_groups(kernel: GroupAdditiveKernel, *, num_inputs: int, num_outputs: int) -> KernelFeatureMap:
    return term_features(kernel, kernel.base_kernel, kernel.groups, lambda k: k.component_scales,
                         num_inputs, num_outputs)


@GenKernelFeatures.register(NewtonGirardAdditiveKernel)
def _features_orders(kernel: NewtonGirardAdditiveKernel, *, num_inputs: int, num_outputs: int) -> KernelFeatureMap:
    if kernel.max_degree > 1:
        return order_features(kernel, num_outputs)
    # Order 1 alone is sigma_1^2 / D times the additive kernel of the weighted terms: stratified per
    # dimension, as the additive kernel (a lower variance than drawing the dimension of each pair).
    num_dims = kernel.num_dims
    return term_features(kernel, kernel.base_kernel, [(d,) for d in range(num_dims)],
                         lambda k: k.term_scales() * k.outputscale[..., :1, None] / num_dims, num_inputs, num_outputs)


@GenKernelFeatures.register(OrthogonalAdditiveKernel)
def _features_orthogonal(kernel: OrthogonalAdditiveKernel, *, num_inputs: int, num_outputs: int) -> FeatureMap:
    return OrthogonalFeatureMap(kernel, num_outputs)


@GenKernelFeatures.register(ProductKernel)
def _features_product(kernel: ProductKernel, *, num_inputs: int, num_outputs: int) -> KernelFeatureMap:
    raise NotImplementedError(f"ProductKernel has no random features; supported: {_SUPPORTED}")


@GenKernelFeatures.register(gpytorch.kernels.AdditiveStructureKernel)
def _features_gpytorch_additive(
    kernel: gpytorch.kernels.AdditiveStructureKernel, *, num_inputs: int, num_outputs: int
) -> KernelFeatureMap:
    base = kernel.base_kernel
    lengthscale = getattr(base, "lengthscale", None)
    if lengthscale is None or lengthscale.shape[-1] != 1 or base.active_dims is not None:
        raise NotImplementedError(
            "gpytorch.kernels.AdditiveStructureKernel has random features for an RBF, Matérn, RQ or periodic "
            f"base kernel with one shared lengthscale and no active_dims of its own, got {type(base).__name__}"
        )
    num_dims = kernel.num_dims
    return term_features(kernel, base, [(d,) for d in range(num_dims)],
                         lambda k: torch.ones(*k.base_kernel.batch_shape, 1, num_dims), num_inputs, num_outputs)
