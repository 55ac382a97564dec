r"""BoTorch's pathwise posterior sampling for lazykern's kernels: random features and a CG update.

BoTorch draws posterior sample paths by Matheron's rule (Wilson et al., 2020),

.. math::

    (f \mid y)(\cdot) = f(\cdot) + K(\cdot, X)\,(K + \Sigma)^{-1}\,(y - f(X) - \varepsilon),

with the prior path :math:`f` a random-feature approximation :math:`f(x) = \phi(x)^\top w`,
:math:`w \sim \mathcal N(0, I)`, of the kernel. Its feature maps are found by the dispatcher
``botorch.sampling.pathwise.features.gen_kernel_features``, which knows GPyTorch's RBF, Matérn
and ``ScaleKernel`` only. Importing this module registers feature maps for

* lazykern's :class:`~lazykern.kernels.RQKernel` and :class:`~lazykern.kernels.PeriodicKernel`
  (lazykern's RBF and Matérn kernels subclass GPyTorch's and already use BoTorch's maps);
* the sums of terms: lazykern's :class:`~lazykern.kernels.AdditiveStructureKernel` and
  :class:`~lazykern.kernels.GroupAdditiveKernel`, and GPyTorch's own ``AdditiveStructureKernel``;
* all interaction orders of :class:`~lazykern.kernels.NewtonGirardAdditiveKernel`
  (:func:`order_features`) and :class:`~lazykern.kernels.OrthogonalAdditiveKernel`
  (:class:`OrthogonalFeatureMap`);

and replaces BoTorch's exact Gaussian update for ``ExactGP`` models whose covariance contains a
lazykern kernel by :func:`gaussian_update`, which solves with conjugate gradients
(:func:`lazykern.solvers.cg`) above GPyTorch's ``max_cholesky_size``: BoTorch's own update factors
the dense N x N matrix. Every other model keeps BoTorch's update unchanged. Nothing in lazykern
imports this module (importing lazykern does not import BoTorch): import it once, before drawing
paths.

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

**Priors.** :func:`additive_priors` sets, in one call, BoTorch's dimension-scaled lengthscale prior
for the dimensions each term of an additive kernel acts on, and priors on the term weights that give
the sum a prior variance of about 1.

**Not supported** (raises a one-line ``NotImplementedError`` naming itself):
:class:`~lazykern.kernels.ProductKernel`.

Example:
    >>> import torch, gpytorch, lazykern, lazykern.botorch
    >>> from botorch.models import SingleTaskGP
    >>> from botorch.sampling.pathwise import draw_matheron_paths
    >>> X = torch.rand(20, 3, dtype=torch.float64)
    >>> Y = torch.sin(6 * X).sum(-1, keepdim=True)
    >>> kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(
    ...     lazykern.RBFKernel(ard_num_dims=3), num_dims=3, component_scales=True))
    >>> model = SingleTaskGP(X, Y, covar_module=kernel)
    >>> paths = draw_matheron_paths(model, sample_shape=torch.Size([8]))
    >>> paths(torch.rand(5, 3, dtype=torch.float64)).shape   # 8 posterior functions at 5 points
    torch.Size([8, 5])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import gpytorch
import numpy as np
import scipy.special
import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.sampling.pathwise.features import KernelEvaluationMap, KernelFeatureMap
from botorch.sampling.pathwise.features.maps import FeatureMap
from botorch.sampling.pathwise.features.generators import GenKernelFeatures
from botorch.sampling.pathwise.paths import GeneralizedLinearPath
from botorch.sampling.pathwise.update_strategies import GaussianUpdate, _gaussian_update_ExactGP
from botorch.sampling.pathwise.utils import (
    ChainedTransform,
    FeatureSelector,
    InverseLengthscaleTransform,
    SineCosineTransform,
    TensorTransform,
    get_input_transform,
    get_train_inputs,
    get_train_targets,
)
from botorch.utils.transforms import is_ensemble
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.likelihoods import _GaussianLikelihoodBase
from gpytorch.models import ExactGP
from gpytorch.priors import LogNormalPrior
from linear_operator.operators import LinearOperator, ZeroLinearOperator
from torch import Size, Tensor

from .formulas.interactions import orthogonal_rbf_features
from .kernels import (
    AdditiveStructureKernel,
    GroupAdditiveKernel,
    NewtonGirardAdditiveKernel,
    OrthogonalAdditiveKernel,
    PeriodicKernel,
    ProductKernel,
    RQKernel,
)
from .kernels.base import LazyKernel, WeightedTermsKernel
from .kernels.stationary import formula_for
from .solvers import PivotedCholeskyPreconditioner, cg

__all__ = ["OrthogonalFeatureMap", "additive_priors", "gaussian_update", "order_features", "term_features"]

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

    def __init__(self, kernel: Kernel, term_weights: Callable[[Kernel], Tensor], term_of_pair: Tensor,
                 pairs_per_term: Tensor) -> None:
        super().__init__()
        self.kernel = kernel
        self.term_weights = term_weights
        self.register_buffer("term_of_pair", term_of_pair)
        self.register_buffer("pairs_per_term", pairs_per_term)

    def forward(self, values: Tensor) -> Tensor:
        weights = self.term_weights(self.kernel).to(values)  # (*batch, 1, terms)
        amplitude = (weights / self.pairs_per_term.to(values)).sqrt()[..., self.term_of_pair]
        return values * torch.cat([amplitude, amplitude], dim=-1)


class _InversePeriodTransform(TensorTransform):
    """Multiplies the inputs by :math:`2\\pi / p`, so the integer harmonics are the frequencies."""

    def __init__(self, kernel: Kernel) -> None:
        super().__init__()
        self.kernel = kernel

    def forward(self, values: Tensor) -> Tensor:
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

    @property
    def num_outputs(self) -> int:
        """The number of features F."""
        return self.frequency.shape[-2]

    @property
    def batch_shape(self) -> Size:
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
        return product


class _ImportanceWeights(TensorTransform):
    """Multiplies each feature by the square root of its importance weight (:class:`_Subsets`)."""

    def __init__(self, kernel: NewtonGirardAdditiveKernel, subsets: _Subsets) -> None:
        super().__init__()
        self.kernel = kernel
        self.subsets = subsets

    def forward(self, values: Tensor) -> Tensor:
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
    if isinstance(kernel, OrthogonalAdditiveKernel):
        return OrthogonalFeatureMap(kernel, num_outputs)
    if kernel.max_degree > 1:
        return order_features(kernel, num_outputs)
    # Order 1 alone is sigma_1^2 / D times the additive kernel of the weighted terms: stratified per
    # dimension, as the additive kernel (a lower variance than drawing the dimension of each pair).
    num_dims = kernel.num_dims
    return term_features(kernel, kernel.base_kernel, [(d,) for d in range(num_dims)],
                         lambda k: k.term_scales() * k.outputscale[..., :1, None] / num_dims, num_inputs, num_outputs)


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


def _contains_lazykern_kernel(kernel: Kernel) -> bool:
    return any(isinstance(module, LazyKernel) for module in kernel.modules())


def gaussian_update(
    model: ExactGP,
    likelihood: _GaussianLikelihoodBase,
    *,
    sample_values: Tensor,
    target_values: Tensor | None = None,
    points: Tensor | None = None,
    noise_covariance: Tensor | LinearOperator | None = None,
    scale_tril: Tensor | LinearOperator | None = None,
    tol: float = 1e-6,
    rank: int = 100,
) -> GeneralizedLinearPath:
    r"""Matheron's update :math:`K(\cdot, X)\, v` with :math:`v = (K + \Sigma)^{-1}(y - f(X) - \varepsilon)`,
    solved by preconditioned conjugate gradients: every sample path is one right-hand side of one
    :func:`lazykern.solvers.cg` call, whose iterations apply the lazy kernel operator to all of them
    at once, so nothing N x N is formed. Models at or below GPyTorch's ``max_cholesky_size``
    (and models whose covariance holds no lazykern kernel) get BoTorch's exact update, which
    factors :math:`K + \Sigma`.

    Registered for ``ExactGP`` models with a Gaussian likelihood when this module is imported, so
    ``botorch.sampling.pathwise.draw_matheron_paths`` and everything built on it (Thompson
    sampling, ``get_optimal_samples``) use it.

    Args:
        model: the GP, an ``ExactGP`` with a Gaussian likelihood.
        likelihood: its likelihood.
        sample_values: the prior paths at the training inputs, ``(*sample_shape, *batch, N)``.
        target_values: the training targets (default: the model's, transformed).
        points: the training inputs (default: the model's, transformed).
        noise_covariance: :math:`\Sigma` (default: the likelihood's at ``points``).
        scale_tril: a Cholesky factor of :math:`K + \Sigma`; given, BoTorch's update uses it.
        tol: CG's relative residual tolerance per path.
        rank: rank of the pivoted-Cholesky preconditioner (capped at N).

    Example:
        >>> import torch, gpytorch, lazykern, lazykern.botorch
        >>> from botorch.models import SingleTaskGP
        >>> from botorch.sampling.pathwise import draw_matheron_paths
        >>> X = torch.rand(50, 2, dtype=torch.float64)
        >>> model = SingleTaskGP(X, X.sum(-1, keepdim=True), covar_module=lazykern.AdditiveStructureKernel(
        ...     lazykern.MaternKernel(nu=2.5), num_dims=2))
        >>> with gpytorch.settings.max_cholesky_size(0):     # CG at any N
        ...     paths = draw_matheron_paths(model, sample_shape=torch.Size([4]))
        >>> paths(X[:3]).shape
        torch.Size([4, 3])
    """
    if points is None:
        (points,) = get_train_inputs(model, transformed=True)
    kernel = model.covar_module
    if (scale_tril is not None or not _contains_lazykern_kernel(kernel)
            or points.shape[-2] <= gpytorch.settings.max_cholesky_size.value()):
        return _gaussian_update_ExactGP(
            model, likelihood, sample_values=sample_values, target_values=target_values, points=points,
            noise_covariance=noise_covariance, scale_tril=scale_tril)
    if target_values is None:
        target_values = get_train_targets(model, transformed=True)
    if noise_covariance is None:
        noise_covariance = likelihood.noise_covar(shape=points.shape[:-1])
    covariance = kernel(points)
    if not isinstance(noise_covariance, ZeroLinearOperator):
        noise = noise_covariance.cholesky() @ torch.randn_like(sample_values).unsqueeze(-1)
        sample_values = sample_values + noise.squeeze(-1)
        covariance = covariance + noise_covariance
    errors = target_values - sample_values  # (*sample_shape, *batch, N)

    # One CG per batch member of the kernel, all sample paths of it as columns.
    batch, n = kernel.batch_shape, points.shape[-2]
    columns = errors.reshape(-1, batch.numel(), n)
    weight = torch.empty_like(columns)
    shift = float(likelihood.noise.detach().mean()) if not isinstance(noise_covariance, ZeroLinearOperator) else 1e-6
    for i, index in enumerate(np.ndindex(*batch)):
        K = covariance[index] if index else covariance
        precond = PivotedCholeskyPreconditioner(kernel(points)[index] if index else kernel(points),
                                                rank=min(rank, n), shift=shift)
        solution, _ = cg(K, columns[:, i, :].T.contiguous(), precond=precond, tol=tol)
        weight[:, i, :] = solution.T
    feature_map = KernelEvaluationMap(kernel=kernel, points=points, input_transform=get_input_transform(model))
    return GeneralizedLinearPath(feature_map=feature_map, weight=weight.reshape(errors.shape),
                                 is_ensemble=is_ensemble(model))


GaussianUpdate.register(ExactGP, _GaussianLikelihoodBase)(gaussian_update)


# Hvarfner, Hellsten & Nardi (2024), BoTorch's defaults: lengthscale ~ LogNormal(sqrt(2) + log(d) / 2, sqrt(3))
# for a kernel on d dimensions.
_LENGTHSCALE_LOC, _LENGTHSCALE_SCALE = math.sqrt(2.0), math.sqrt(3.0)
# Term weights and variances: a factor e either way is one standard deviation.
_WEIGHT_SCALE = 1.0


def _register_lognormal(module: gpytorch.Module, name: str, loc: float | Tensor, scale: float,
                        initial: Tensor | float) -> None:
    """A LogNormal prior on the positive hyperparameter ``name`` of ``module`` (read and set through its
    property), and the hyperparameter set to ``initial``."""
    loc = torch.as_tensor(loc, dtype=torch.float64)
    module.register_prior(f"{name}_prior", LogNormalPrior(loc, torch.full_like(loc, scale)),
                          lambda m: getattr(m, name), lambda m, v: setattr(m, name, v))
    setattr(module, name, initial)


def additive_priors(kernel: Kernel) -> Kernel:
    r"""Sets priors suited to an additive kernel's terms on ``kernel`` (in place) and returns it: the
    lengthscale prior BoTorch's ``SingleTaskGP`` uses by default (Hvarfner, Hellsten & Nardi, 2024,
    *Vanilla Bayesian optimization performs great in high dimensions*), applied to the dimensions each
    term acts on rather than to all of them, and priors on the term weights that give the sum a prior
    variance of about 1 (BoTorch standardises the outcomes).

    BoTorch's lengthscale prior for a kernel on :math:`d` dimensions is
    :math:`\log \ell \sim \mathcal N(\sqrt 2 + \tfrac12 \log d,\ 3)`: distances between points of the
    unit cube grow as :math:`\sqrt d`, so the lengthscale does too. A term on :math:`k` dimensions
    gets the prior for :math:`d = k`:

    * :class:`~lazykern.kernels.AdditiveStructureKernel` (and GPyTorch's): one-dimensional terms,
      :math:`k = 1` (median :math:`\ell = e^{\sqrt 2} \approx 4.1`, mode
      :math:`e^{\sqrt 2 - 3} \approx 0.20`);
    * :class:`~lazykern.kernels.GroupAdditiveKernel`: each dimension's lengthscale the prior of the
      largest group it is in;
    * :class:`~lazykern.kernels.NewtonGirardAdditiveKernel` and
      :class:`~lazykern.kernels.OrthogonalAdditiveKernel`: the order-:math:`r` term is a product over
      :math:`r` dimensions of one-dimensional kernels sharing each dimension's lengthscale, so the
      prior is that of the highest order, :math:`k =` ``max_degree``.

    Lengthscales start at the prior's mode, as BoTorch's do. The weights: a sum of :math:`T` terms of
    unit variance has variance :math:`T`, so

    * learned per-term weights ``component_scales`` of an additive or group kernel get
      :math:`\log s_t \sim \mathcal N(-\log T, 1)` and start at :math:`1/T`, and a ``ScaleKernel``
      around the kernel :math:`\log \sigma^2 \sim \mathcal N(0, 1)`, starting at 1; without
      ``component_scales`` the ``ScaleKernel``'s outputscale takes the :math:`1/T` prior instead;
    * the :math:`R` order variances of an interaction kernel get :math:`\log \sigma_r^2 \sim
      \mathcal N(-\log R, 1)`, starting at :math:`1/R` (each order has variance :math:`\sigma_r^2`
      when the per-dimension weights are 1), its per-dimension weights :math:`\log s_d \sim
      \mathcal N(0, 1)` and a ``ScaleKernel`` around it :math:`\log \sigma^2 \sim \mathcal N(0, 1)`.

    An additive kernel with neither learned weights nor a ``ScaleKernel`` keeps its fixed variance
    :math:`T`. The likelihood keeps BoTorch's noise prior. What they change is measured in
    :doc:`/botorch` (``examples/bo_additive.py``): on 20-dimensional Styblinski–Tang after 25 points,
    the lazykern additive RBF model fitted without priors ends with a tenth of its lengthscales (over
    10 runs) below :math:`10^{-17}` and a tenth above 2,000 on the unit cube; with them the middle 80%
    lie between 0.16 and 0.28 (the mode is 0.205).

    Args:
        kernel: a lazykern :class:`~lazykern.kernels.AdditiveStructureKernel`,
            :class:`~lazykern.kernels.GroupAdditiveKernel`,
            :class:`~lazykern.kernels.NewtonGirardAdditiveKernel` (or
            :class:`~lazykern.kernels.OrthogonalAdditiveKernel`), or GPyTorch's
            ``AdditiveStructureKernel``, whose base kernel has a lengthscale; bare or inside a
            ``ScaleKernel``.

    Returns:
        ``kernel``, with the priors registered and the hyperparameters at their starting values.

    Example:
        >>> import torch, gpytorch, lazykern, lazykern.botorch
        >>> from botorch.models import SingleTaskGP
        >>> kernel = lazykern.botorch.additive_priors(gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(
        ...     lazykern.RBFKernel(ard_num_dims=20), num_dims=20, component_scales=True)))
        >>> sorted(name for name, *_ in kernel.named_priors())
        ['base_kernel.base_kernel.lengthscale_prior', 'base_kernel.component_scales_prior', 'outputscale_prior']
        >>> round(float(kernel.base_kernel.base_kernel.lengthscale.detach()[0, 0]), 3)   # the prior's mode
        0.205
        >>> model = SingleTaskGP(torch.rand(8, 20, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64),
        ...                      covar_module=kernel)
    """
    outer = kernel if isinstance(kernel, ScaleKernel) else None
    terms_kernel = kernel.base_kernel if outer is not None else kernel
    base = getattr(terms_kernel, "base_kernel", None)
    if not isinstance(terms_kernel, (WeightedTermsKernel, gpytorch.kernels.AdditiveStructureKernel)) \
            or getattr(base, "lengthscale", None) is None:
        raise TypeError(
            "additive_priors: kernel must be an AdditiveStructureKernel (lazykern's or GPyTorch's), GroupAdditiveKernel "
            "or NewtonGirardAdditiveKernel whose base kernel has a lengthscale, bare or inside ScaleKernel; "
            f"got {type(kernel).__name__}" + (f"({type(terms_kernel).__name__})" if outer is not None else ""))
    num_dims = base.lengthscale.shape[-1] if terms_kernel.num_dims is None else terms_kernel.num_dims
    outer_share = 1.0
    if isinstance(terms_kernel, NewtonGirardAdditiveKernel):
        term_dims = torch.full((num_dims,), float(terms_kernel.max_degree), dtype=torch.float64)
        orders = terms_kernel.max_degree
        _register_lognormal(terms_kernel, "outputscale", -math.log(orders), _WEIGHT_SCALE,
                            torch.full_like(terms_kernel.outputscale, 1.0 / orders))
        weight_share = 1.0
    else:
        groups = terms_kernel.groups if isinstance(terms_kernel, GroupAdditiveKernel) else [(d,) for d in range(num_dims)]
        term_dims = torch.ones(num_dims, dtype=torch.float64)
        for group in groups:
            term_dims[list(group)] = torch.clamp(term_dims[list(group)], min=float(len(group)))
        weight_share = 1.0 / len(groups)
    if hasattr(terms_kernel, "raw_component_scales"):
        _register_lognormal(terms_kernel, "component_scales", math.log(weight_share), _WEIGHT_SCALE, weight_share)
    else:
        outer_share = weight_share
    if outer is not None:
        _register_lognormal(outer, "outputscale", math.log(outer_share), _WEIGHT_SCALE, outer_share)
    if base.lengthscale.shape[-1] == 1:
        term_dims = term_dims.max(dim=0, keepdim=True).values
    loc = _LENGTHSCALE_LOC + 0.5 * term_dims.log()
    _register_lognormal(base, "lengthscale", loc, _LENGTHSCALE_SCALE,
                        (loc - _LENGTHSCALE_SCALE**2).exp().to(base.lengthscale).expand_as(base.lengthscale))
    return kernel
