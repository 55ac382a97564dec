"""Projected additive kernels: one-dimensional kernels on linear projections of the inputs."""

from __future__ import annotations

from functools import lru_cache

import torch
from gpytorch.constraints import Positive
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from ..validation import (
    check_flag,
    check_non_negative_int,
    check_positive_int,
    check_projections,
    check_term_hyperparameters,
)
from ..formulas.interactions import InteractionFormula
from .additive_structure import additive_formula_arguments, one_dimensional_terms
from .base import WeightedTermsKernel
from .stationary import formula_for

__all__ = ["ProjectedAdditiveKernel", "diverse_directions", "random_directions"]

#: The constructions ``projections`` may name.
CONSTRUCTIONS = ("rpa", "dpa")
#: Steps and learning rate of the optimiser that spreads the DPA directions (float64): enough to bring
#: the cos^4 energy of 500 random directions in 26 dimensions from twice its lower bound to within
#: 10 % of it (its cost: docs/projected.rst, "Directions").
DPA_STEPS = 500
DPA_LEARNING_RATE = 0.02
#: Most DPA direction sets kept in the process (each d x J float64: 104 kB at d = 26, J = 500), the
#: least recently used dropped.
DPA_CACHED = 32


class ProjectedAdditiveKernel(WeightedTermsKernel):
    r"""A sum of one-dimensional kernels, each on one linear projection of the inputs, as **one** lazy
    formula (Delbridge, Bindel & Wilson, "Randomly Projected Additive Gaussian Processes for
    Regression", ICML 2020):

    .. math::

        k(x, x') = \sum_{j=1}^{J} s_j\, k_{\text{base}}\big(w_j^\top \Lambda^{-1} x,\;
        w_j^\top \Lambda^{-1} x'\big),
        \qquad W = [w_1, \dots, w_J] \in \mathbb{R}^{d \times J},

    where :math:`\Lambda = \operatorname{diag}(\ell_1, \dots, \ell_d)` holds one lengthscale per
    input dimension when ``input_lengthscales=True`` (else :math:`\Lambda = I`).

    As :math:`J` grows, the sum approaches a kernel on the full input space even though each term
    sees one dimension: with directions spread over the sphere, an isotropic kernel of
    :math:`\Lambda^{-1}(x - x')`, so with the input lengthscales :math:`\ell` (the paper's
    "prescaling", learned with the other hyperparameters) a kernel with ARD, in :math:`d` more
    parameters rather than the :math:`dJ` of learned directions. The projection is an :math:`N \times d \to N \times J` product in torch,
    before the formula; the formula is :class:`AdditiveStructureKernel`'s on the projected inputs,
    so every engine evaluates it lazily (no :math:`J \times N \times N` tensor, nor :math:`N \times N`
    unless it fits :class:`lazykern.settings.max_dense_bytes`), and gradients reach :math:`W`, the
    scales and the base kernel's hyperparameters. A product costs :math:`O(N^2 J)` on the pair
    engines and :math:`O(N J)` after one sort per projection on the structured engine, which takes
    Matérn and RBF bases on CPU tensors (:mod:`lazykern.structured`).

    The directions (the columns of ``projections``):

    * ``"rpa"`` (random projections): unit vectors, independent standard Gaussian vectors, each divided by its
      length (directions uniform on the unit sphere), drawn from a generator seeded with ``seed``
      (the global random state is left as it was);
    * ``"dpa"`` (diverse projections): the RPA directions of the same ``seed``, then spread apart
      by minimising :math:`\sum_{i \ne j} (w_i^\top w_j)^4` over unit vectors (the construction of the
      paper's reference code: the fourth power does not see signs, as a one-dimensional stationary
      kernel does not see the sign of :math:`w_j`). For :math:`J \le d` the minimum is an orthonormal
      set (reached to cosines of about 0.01); for large :math:`J` the energy's lower bound :math:`J^2\, 3/(d(d+2)) - J` is reached by
      directions that integrate every degree-4 polynomial over the sphere exactly, which is why the
      sum converges faster in :math:`J` than with random directions. Minimised here by
      ``DPA_STEPS`` Adam steps in float64 (deterministic for a given ``seed``);
    * a tensor of shape ``(num_dims, num_projections)``: the directions as given (not normalised).

    Args:
        base_kernel: the one-dimensional kernel: lazykern's or GPyTorch's ``RBFKernel``,
            ``MaternKernel``, ``RQKernel`` or ``PeriodicKernel``, its lengthscale (and period) shared
            (``ard_num_dims`` unset) or one per projection (``ard_num_dims=num_projections``). Its
            batch shape is the kernel's (each batch member gets its own copy of the directions).
        num_dims: number of input dimensions :math:`d`.
        num_projections: number of projections :math:`J`.
        projections: ``"dpa"``, ``"rpa"`` or a :math:`d \times J` float tensor of directions.
        learn_projections: train :math:`W` (``projections`` is then an ``nn.Parameter``; else a
            buffer, saved with the model and moved with ``.to()``, but not trained).
        seed: seed of the RPA and DPA directions.
        input_lengthscales: learn one lengthscale :math:`\ell_i` per input dimension
            (:attr:`input_lengthscale`, starting at 1), dividing the inputs before they are
            projected. A shared lengthscale of the base kernel is then redundant (it scales every
            :math:`\ell_i` alike).

    The scales :math:`s_j` (:attr:`~lazykern.kernels.base.WeightedTermsKernel.component_scales`,
    learned, positive) start at :math:`1/J`, so the kernel starts as the paper's average of the
    projected kernels (:math:`k(x, x) = 1`, as for each base kernel); wrap it in ``ScaleKernel`` for
    an output scale.

    Example:
        >>> import torch, gpytorch, lazykern
        >>> x = torch.randn(1000, 8)
        >>> base = lazykern.MaternKernel(nu=2.5)
        >>> kernel = gpytorch.kernels.ScaleKernel(
        ...     lazykern.ProjectedAdditiveKernel(base, num_dims=8, num_projections=20))
        >>> kernel.base_kernel.projections.shape
        torch.Size([8, 20])
        >>> K = kernel(x)   # a LinearOperator; no 20 x 1000 x 1000 tensor
        >>> kernel(x[:5], diag=True).shape
        torch.Size([5])
        >>> scaled = lazykern.ProjectedAdditiveKernel(base, num_dims=8, num_projections=20,
        ...                                           input_lengthscales=True)
        >>> scaled.input_lengthscale.shape   # one per input dimension, divided out before projecting
        torch.Size([1, 8])
    """

    is_stationary = True  # w^T x - w^T x' = w^T (x - x'): each term, so the sum, sees x - x' only

    def __init__(
        self,
        base_kernel: Kernel,
        num_dims: int,
        num_projections: int,
        projections: str | Tensor = "dpa",
        learn_projections: bool = False,
        seed: int = 0,
        input_lengthscales: bool = False,
    ) -> None:
        check_positive_int("num_dims", num_dims)
        check_positive_int("num_projections", num_projections)
        given = check_projections("projections", projections, num_dims, num_projections, choices=CONSTRUCTIONS)
        check_flag("learn_projections", learn_projections)
        check_non_negative_int("seed", seed)
        check_flag("input_lengthscales", input_lengthscales)
        check_term_hyperparameters(base_kernel, num_projections, terms_name="num_projections", term="projection")
        formula = formula_for(base_kernel, additive=True)
        # The formula's terms read the J projected coordinates: to the base class, J "dimensions".
        super().__init__(base_kernel, formula, num_dims=num_projections, num_terms=num_projections,
                         component_scales=True)
        # The inputs, though, have d columns: what forward checks them against.
        self.num_dims = num_dims
        self.num_projections = num_projections
        if isinstance(given, Tensor):
            directions = given
        elif given == "rpa":
            directions = random_directions(num_dims, num_projections, seed)
        else:  # "dpa"
            directions = diverse_directions(num_dims, num_projections, seed)
        # One copy per batch member, as GPyTorch indexes and expands every parameter and buffer.
        directions = directions.to(self._dtype()).expand(*self.batch_shape, num_dims, num_projections).clone()
        if learn_projections:
            self.projections = nn.Parameter(directions)
        else:
            self.register_buffer("projections", directions)
        self.component_scales = 1.0 / num_projections
        if input_lengthscales:
            shape = (*self.batch_shape, 1, num_dims)
            self.register_parameter("raw_input_lengthscale", nn.Parameter(torch.zeros(shape, dtype=self._dtype())))
            self.register_constraint("raw_input_lengthscale", Positive())
            self.input_lengthscale = torch.ones(shape, dtype=self._dtype())

    @property
    def input_lengthscale(self) -> Tensor | None:
        r"""The lengthscales :math:`\ell` the inputs are divided by before they are projected, shape
        ``(*batch_shape, 1, num_dims)``, or ``None`` for a kernel built without ``input_lengthscales``."""
        if not hasattr(self, "raw_input_lengthscale"):
            return None
        return self.raw_input_lengthscale_constraint.transform(self.raw_input_lengthscale)

    @input_lengthscale.setter
    def input_lengthscale(self, value: Tensor | float) -> None:
        if not hasattr(self, "raw_input_lengthscale"):
            raise AttributeError("this kernel has no input lengthscales: construct with input_lengthscales=True")
        value = torch.as_tensor(value).to(self.raw_input_lengthscale)
        self.initialize(raw_input_lengthscale=self.raw_input_lengthscale_constraint.inverse_transform(value))

    def formula_arguments(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        projected = self.project(x1)
        # K(X, X) keeps one tensor for both sides: the operator takes its gradient in one fused reduction.
        return additive_formula_arguments(self, projected, projected if x2 is x1 else self.project(x2))

    def project(self, x: Tensor) -> Tensor:
        r"""The projections :math:`w_j^\top \Lambda^{-1} x` the terms see: ``x @ W`` (``x / ell @ W`` with
        input lengthscales), ``(..., N, d) -> (..., N, J)``, in the promoted dtype of ``x`` and ``W``.

        Example:
            >>> import torch, lazykern
            >>> kernel = lazykern.ProjectedAdditiveKernel(lazykern.RBFKernel(), num_dims=3, num_projections=5)
            >>> kernel.project(torch.randn(10, 3)).shape
            torch.Size([10, 5])
        """
        dtype = torch.promote_types(x.dtype, self.projections.dtype)
        directions, lengthscale = self.projections.to(dtype), self.input_lengthscale
        if lengthscale is not None:
            # Dividing W's rows is dividing x's columns: d x J numbers instead of N x d.
            directions = directions / lengthscale.to(dtype).transpose(-1, -2)
        return x.to(dtype) @ directions

    def lengthscale_widths(self, num_dims: int) -> tuple[int, ...]:
        """The base kernel's lengthscales scale the projections, each term's one coordinate: width 1
        for each of the J projections."""
        return (1,) * self.num_projections

    def per_input_lengthscale(self) -> tuple[Kernel, str]:
        """:attr:`input_lengthscale` (``None`` for a kernel built without ``input_lengthscales``):
        along input :math:`i` term :math:`j` sees the lengthscale :math:`\\ell_i / |w_{ij}|`, so a
        lower bound on :math:`\\ell_i` bounds every term's for unit directions."""
        return self, "input_lengthscale"

    @property
    def component_axes(self) -> str:
        """A term per projection :math:`w_j^\\top x`, so ``"projections"``."""
        return "projections"

    def component_coordinates(self, x: Tensor) -> Tensor:
        """The projections :meth:`project` of ``x``."""
        return self.project(x)

    def first_order_terms(
        self, x1: Tensor, x2: Tensor
    ) -> tuple[InteractionFormula, Tensor, Tensor, dict[str, Tensor]]:
        r"""The terms :math:`s_j\, k_{\text{base}}(u_j, u'_j)` of the projections :math:`u = x W` (the
        whole kernel)."""
        return one_dimensional_terms(self.base_kernel, x1, x2, self.component_scales)

    @property
    def learns_projections(self) -> bool:
        """Whether the directions are a trained parameter (``learn_projections=True``)."""
        return self.projections.requires_grad


def random_directions(num_dims: int, num_projections: int, seed: int) -> Tensor:
    """``num_projections`` directions uniform on the unit sphere of ``R^num_dims`` (normalised
    standard Gaussian vectors), the columns of a float64 ``(num_dims, num_projections)`` tensor,
    from a generator seeded with ``seed`` (the global random state is not touched).

    Example:
        >>> W = random_directions(3, 5, seed=0)
        >>> torch.allclose(W.norm(dim=0), torch.ones(5, dtype=torch.float64)), torch.equal(W, random_directions(3, 5, 0))
        (True, True)
    """
    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(num_dims, num_projections, generator=generator, dtype=torch.float64)
    return directions / directions.norm(dim=0, keepdim=True)


def diverse_directions(num_dims: int, num_projections: int, seed: int) -> Tensor:
    r"""The :func:`random_directions` of ``seed`` spread apart: unit columns :math:`w_j` that
    minimise :math:`\sum_{i \ne j} (w_i^\top w_j)^4` (``DPA_STEPS`` Adam steps from the random ones
    on the energy of the normalised columns, then normalised), a float64 ``(num_dims, num_projections)`` tensor.

    The optimisation runs once per ``(num_dims, num_projections, seed)`` in a process (seconds for
    hundreds of directions: docs/projected.rst, "Directions"); later calls return a copy of its
    result (the last ``DPA_CACHED`` sets are kept), so that building many kernels (cross-validation
    folds, restarts, a batch of models) costs one optimisation.

    Example:
        >>> def energy(W):   # the sum over i != j (the diagonal terms are 1)
        ...     return float(((W.T @ W) ** 4).sum()) - W.shape[1]
        >>> energy(diverse_directions(26, 100, seed=0)) < energy(random_directions(26, 100, seed=0)) / 2
        True
        >>> diverse_directions(26, 100, seed=0) is diverse_directions(26, 100, seed=0)   # equal copies
        False
    """
    return _spread_directions(num_dims, num_projections, seed).clone()


@lru_cache(maxsize=DPA_CACHED)
def _spread_directions(num_dims: int, num_projections: int, seed: int) -> Tensor:
    """:func:`diverse_directions`' optimisation; its result is shared by the cache, never handed out."""
    with torch.enable_grad():
        directions = random_directions(num_dims, num_projections, seed).requires_grad_(True)
        optimiser = torch.optim.Adam([directions], lr=DPA_LEARNING_RATE)
        for _ in range(DPA_STEPS):
            optimiser.zero_grad()
            unit = directions / directions.norm(dim=0, keepdim=True)
            ((unit.T @ unit) ** 4).sum().backward()  # the diagonal is 1: a constant
            optimiser.step()
    with torch.no_grad():
        return directions / directions.norm(dim=0, keepdim=True)
