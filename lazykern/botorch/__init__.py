r"""BoTorch's pathwise posterior sampling for lazykern's kernels: random features and a CG update.

BoTorch draws posterior sample paths by Matheron's rule (Wilson et al., 2020),

.. math::

    (f \mid y)(\cdot) = f(\cdot) + K(\cdot, X)\,(K + \Sigma)^{-1}\,(y - f(X) - \varepsilon),

with the prior path :math:`f` a random-feature approximation :math:`f(x) = \phi(x)^\top w`,
:math:`w \sim \mathcal N(0, I)`, of the kernel. Its feature maps are found by the dispatcher
``botorch.sampling.pathwise.features.gen_kernel_features``, which knows GPyTorch's RBF, Matérn
and ``ScaleKernel`` only. Importing this package registers feature maps for

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
imports this package (importing lazykern does not import BoTorch): import it once, before drawing
paths.

One module per job: ``lazykern.botorch.features`` (the feature maps, and the spectral measures
they draw from), ``lazykern.botorch.update`` (the update) and ``lazykern.botorch.priors``; this
package imports all three, which performs the registrations.

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

from .features import OrthogonalFeatureMap, order_features, term_features
from .priors import additive_priors
from .update import gaussian_update

__all__ = ["OrthogonalFeatureMap", "additive_priors", "gaussian_update", "order_features", "term_features"]
