r"""What an additive GP learned: its first-order components, its variance by order, each input's effect.

For a trained exact GP whose covariance is additive over dimensions (possibly with interactions),
:func:`component_analysis` returns tensors:

* the posterior mean and, where a Cholesky factor is affordable, the variance of every first-order
  component :math:`f_d` along its own axis, **centred** on its average over the training inputs
  (the averages, with the GP's constant mean, form the additive offset, returned separately: a
  component's level is not identifiable from the data, only its shape is);
* the **order shares**, **first-order shares** and **total effects** defined below.

**Vocabulary** (the command ``lazykern``, the plots, the examples and the docs use these terms with
these meanings). Write :math:`m(x)` for the posterior mean and :math:`\operatorname{Var} m` for its
variance over the inputs:

* *order share* of order r: the share of :math:`\operatorname{Var} m` in the terms of exactly r inputs;
* *first-order share* of input i (``dimension_shares``): the share in input i's first-order
  component :math:`f_i(x_i)` alone;
* *total effect* of input i (``total_effects``): the share in every term that involves input i, of
  every order: the total Sobol index

  .. math::

      T_i = \frac{\mathbb E_{x_{\sim i}}\big[\operatorname{Var}_{x_i} \big(m(x) \mid x_{\sim i}\big)\big]}
                 {\operatorname{Var} m}.

  Total effects rank the inputs. They sum to at least 1 (an interaction counts once for each of
  its inputs); an input whose effect is all in interactions has a first-order share of 0 and a
  large total effect.

**Components.** With :math:`\alpha = (K + \sigma^2 I)^{-1} (y - \mu)` (GPyTorch's cached mean solve) and the
first-order term of the kernel :math:`c_d\, z_d(x_d, x'_d)` (:math:`c_d = \sigma_1^2 s_d / D` for
:class:`~lazykern.kernels.NewtonGirardAdditiveKernel` and
:class:`~lazykern.kernels.OrthogonalAdditiveKernel`, times a ``ScaleKernel``'s outputscale if any;
:math:`c_d = s\, w_d` for a scaled :class:`~lazykern.kernels.AdditiveStructureKernel`), the
centred component :math:`g_d(t) = f_d(t) - \frac1N \sum_i f_d(x_{id})` is Gaussian under the posterior with

.. math::

    \mathbb E[g_d(t)] = c_d\, \tilde z_d(t, X_d)\, \alpha, \qquad
    \operatorname{Var}[g_d(t)] = c_d\, \bar z_d(t, t) - c_d^2\, \tilde z_d(t, X_d) (K + \sigma^2 I)^{-1} \tilde z_d(X_d, t),

with :math:`\tilde z_d(t, x_{jd}) = z_d(t, x_{jd}) - \frac1N \sum_i z_d(x_{id}, x_{jd})` (the
covariance of :math:`g_d(t)` with the training targets: centred on the side of :math:`t` only; the
row means are one lazy reduction) and :math:`\bar z_d(t, t) = z_d(t, t) - \frac2N \sum_i z_d(t, x_{id})
+ \frac1{N^2} \sum_{ij} z_d(x_{id}, x_{jd})` (the prior variance of the centred component). The
offset of component d is :math:`\frac1N \sum_{ij} c_d z_d(x_{id}, x_{jd}) \alpha_j`.

**Order shares and total effects for OAK: Sobol indices, exact.** Components of different subsets of dimensions are
orthogonal under the input measure :math:`p`, so the variance of the posterior mean splits into
:math:`\sum_S \lVert m_S \rVert^2`. Order r contributes
:math:`\lVert m_r \rVert^2 = \frac{\sigma_r^4}{\binom Dr}\, \alpha^\top \tilde E_r(s^2 \odot C)\, \alpha`,
with :math:`C_d(x_i, x_j) = \int \tilde k_d(t, x_{id})\, \tilde k_d(t, x_{jd})\, p_d(t)\, dt` in closed
form (:func:`lazykern.formulas.interactions.orthogonal_rbf_l2_features`) and :math:`\tilde E_r` the
normalized elementary symmetric polynomial of these N x N x D values: one lazy reduction
:math:`Q(\lambda, \mu) = \alpha^\top [\sum_r \lambda_r \tilde E_r(\mu \odot s^2 \odot C)]\, \alpha` and its
gradient give every order (:math:`\lambda_r\, \partial Q / \partial \lambda_r`) and every
dimension's total effect (:math:`\mu_d\, \partial Q / \partial \mu_d` at :math:`\mu = 1`: the sum of
:math:`\lVert m_S \rVert^2` over the subsets S that contain d). Nothing N x N is stored.

**Order shares for other kernels: empirical.** Without orthogonality the orders overlap (a product of
RBF terms also contains lower-order effects); the order share of order r is then the variance, over the
training inputs, of the order's posterior-mean term
:math:`m_r(x_i) = \sigma_r^2 \sum_j \tilde e_r(x_i, x_j)\, \alpha_j`, over the sum of these variances
(one batched lazy reduction, R times the cost of a matvec): not a Sobol index. The first-order share of
dimension d is that of :math:`f_d(x_{id})` on the same scale. Above
:data:`~lazykern.components.analysis.SHARE_POINTS` training inputs the variances are taken over that
many evenly spaced ones (each :math:`m_r(x_i)` still sums over all :math:`j`), as R orders over all N
points cost R full kernel passes, a noticeable part of a run's training time (``docs/interactions.rst``).

**Total effects for Newton–Girard: Monte Carlo (pick-freeze).** The terms of the kernel that contain
input i (:math:`s_i\, \partial k / \partial s_i`, the elementary symmetric polynomials being linear in
each :math:`s_i z_i`) are not orthogonal to the others, so the variance of their posterior mean
is not the part of :math:`\operatorname{Var} m` that input i explains. :math:`T_i` is estimated from
its definition instead, by Jansen's estimator on the posterior mean: with
:math:`a_1..a_S, b_1..b_S` drawn independently from :math:`P = \prod_d \hat P_d`, the product of the
training inputs' marginal distributions (:data:`~lazykern.components.analysis.EFFECT_POINTS` of
each), and :math:`a_s^{(i)}` the point :math:`a_s` with coordinate i taken from :math:`b_s`,

.. math::

    \hat T_i = \frac{1}{2 S\, \hat V} \sum_{s=1}^S \big(m(a_s) - m(a_s^{(i)})\big)^2,

:math:`\hat V` the variance of :math:`m` over the :math:`a_s` and :math:`b_s`; ``total_effects_se``
holds each estimate's standard error. The draws come from a private generator (the same for every
call; the user's random stream is not touched), and cost :math:`S (D + 2)` rows of one kernel
matvec. Assumptions: the inputs are treated as independent (P is a product measure), and where
they are not, the hybrid points :math:`a_s^{(i)}` can leave the region of the data, where
:math:`m` is the prior's extrapolation; the estimate is of the posterior *mean*'s sensitivity, not of the
uncertainty about it. A first-order model (:class:`~lazykern.kernels.AdditiveStructureKernel`,
or ``max_degree=1``) has no other terms: its total effects are its first-order shares, exactly
(no Monte Carlo).

One job per module: :func:`component_analysis` computes these numbers
(``lazykern/components/analysis.py``), :func:`report_lines` prints them with their definitions (the
command and the examples call it; ``report.py``), :func:`plot_components` draws them
(``figure.py``, the only module that imports matplotlib), and ``vocabulary.py`` holds the
definitions and the ranking of inputs that the three share. Every name is imported from
``lazykern.components``.

Example:
    >>> import torch, lazykern
    >>> from lazykern.regression import build_model, train
    >>> x = torch.randn(300, 3, dtype=torch.float64)
    >>> y = torch.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2]
    >>> model, likelihood = build_model(x, y, "oak")
    >>> _ = train(model, likelihood, iters=30, progress=False)
    >>> result = lazykern.components.component_analysis(model)
    >>> result.mean.shape, result.order_shares.shape   # 100 grid points x 3 dims; orders 1..3
    (torch.Size([100, 3]), torch.Size([3]))
    >>> sorted(result.ranking()[:2])   # by total effect: x1 and x2 (their product: 2/3 of the variance)
    [1, 2]
    >>> float(result.dimension_shares[1]) < 0.05 < 0.5 < float(result.total_effects[1])   # all in order 2
    True
"""

from .analysis import EFFECT_POINTS, SHARE_POINTS, ComponentAnalysis, component_analysis, summary
from .figure import plot_components
from .report import report_lines

__all__ = ["SHARE_POINTS", "EFFECT_POINTS", "ComponentAnalysis", "component_analysis", "summary", "report_lines",
           "plot_components"]
