r"""The contract every engine keeps: what it evaluates, its products, dense blocks and fused gradients.

An engine is one object (an :class:`Engine`), made once in its package's ``engine`` module
(``lazykern.<package>.engine.ENGINE``: ``cpu``, ``triton``, ``keops``, ``torch_engine``,
``structured``), which is the package's one face, and listed in the chooser's table
(:data:`lazykern.backend.ENGINES`), which picks one per call
(:func:`lazykern.backend.choose_engine`). Engines are siblings: none imports another, and nothing
above the chooser imports one. Shapes, for every method: ``x1`` ``(..., N, D1)``, ``x2``
``(..., M, D2)``, parameters ``(..., 1, K)`` in name order, right-hand sides ``(..., M, C)``;
batch dimensions broadcast.

Asking an engine whether it takes a formula (:meth:`Engine.supports`) gives its *plan*: what it
worked out on the way and its methods reuse (the compiled engines' planned product pass, the
structured engine's additive form; ``True`` where there is nothing to keep), or ``None``. The
methods take that plan, so that a product asks its question once; given none, a method plans
itself and raises ``ValueError`` (:meth:`Engine.unsupported`) where the engine does not take the
formula.

Beside its reductions an engine answers for the width it pads a feature axis to
(:meth:`Engine.padded_width`), its products of a stored dense matrix (:meth:`Engine.dense_matmul`),
a preconditioner from its structure (:meth:`Engine.preconditioner`), whether it runs in this
process at all (:meth:`Engine.available`) and the programs it has compiled
(:meth:`Engine.program_count`); the defaults say it has none of these.

A new engine is one subclass, one instance, one row in the chooser's table (and, if ``"auto"``
should pick it, one rule in :func:`lazykern.backend.choose_engine`).

Example:
    >>> from lazykern.backend import ENGINES
    >>> {"cpu", "keops", "torch", "triton"} <= set(ENGINES)
    True
    >>> ENGINES["torch"].fuses_symmetric_gradient(None)
    False
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Protocol

import torch
from torch import Tensor

from .formulas import Formula

__all__ = ["Engine", "Gradients", "Plan", "Preconditioner", "ProgramCount"]

#: What :meth:`Engine.symmetric_gradients` returns: the gradients for ``x1``, ``x2`` and by parameter name.
Gradients = tuple["Tensor | None", "Tensor | None", dict[str, "Tensor | None"]]

#: What :meth:`Engine.supports` returns where the engine takes a formula: anything true, which only
#: that engine's methods read.
Plan = Any


class ProgramCount(NamedTuple):
    """What an engine has compiled and loaded so far, for a warm-up's report
    (:func:`lazykern.warmup.precompile`)."""

    #: Where the engine compiles to; each compile writes its source there before it starts.
    folders: tuple[str, ...]
    #: How many programs were compiled into them, a count that only grows, so that the difference
    #: of two counts is what was compiled between them.
    compiled: int
    #: Distinct programs this process has loaded, compiled by it or read from the folders.
    loaded: int


class Preconditioner(Protocol):
    r""":math:`P \approx K(x, x) + \operatorname{diag}(\text{noise})` as conjugate gradients and stochastic
    Lanczos quadrature use it, exact for its own :math:`P` (float64 ``(N, C)`` blocks)."""

    #: :math:`\log\lvert P \rvert`.
    logdet: float

    def solve(self, v: Tensor) -> Tensor:
        r""":math:`P^{-1} v`."""

    def matmul(self, v: Tensor) -> Tensor:
        r""":math:`P v`."""

    def diagonal(self) -> Tensor:
        r"""The ``(N,)`` diagonal of :math:`P`."""

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        r"""``(N, num_samples)`` draws from :math:`\mathcal N(0, P)`."""

    def posterior_variance(self, x: Tensor) -> Tensor:
        r"""The latent posterior variance at new points ``x`` (in the formula's coordinates) of the
        model :math:`P` is the covariance of (the kernel part of :math:`P` as the prior, its diagonal
        part as the noise): where :math:`P` models :math:`K` closely, the exact variance; the builder's
        ``extent`` names the points it must reach."""


class Engine:
    """One engine: a name, what it supports, and its reductions.

    Attributes:
        name: what :class:`lazykern.settings.engine` calls it (``"cpu"``, ``"keops"``, ...).
    """

    name: str = ""
    #: Whether a product costs less than forming the N x M matrix does (the structured engine's
    #: O((N + M) d) against O(N M d)): the operators then never store the matrix for products.
    products_beat_dense: bool = False

    def supports(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Plan | None:
        """This engine's plan of ``formula`` on these tensors where it evaluates it, else ``None``
        (nothing is compiled)."""
        raise NotImplementedError

    def unsupported(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> str:
        """Why :meth:`supports` has no plan, one sentence for a ``ValueError``."""
        return f"the {self.name} engine does not evaluate {formula!r} on tensors of shapes {x1.shape}, {x2.shape}"

    def planned(self, plan: Plan | None, formula: Formula, x1: Tensor, x2: Tensor,
                params: Mapping[str, Tensor]) -> Plan:
        """``plan``, or where none is given this engine's own (:meth:`supports`); a ``ValueError``
        naming the reason (:meth:`unsupported`) where it takes no plan of the formula."""
        plan = plan or self.supports(formula, x1, x2, params)
        if not plan:
            raise ValueError(self.unsupported(formula, x1, x2, params))
        return plan

    def matmul(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor,
               plan: Plan | None = None) -> Tensor:
        """``K(x1, x2) @ rhs``, ``(..., N, C)``, without storing K; differentiable in every tensor."""
        raise NotImplementedError

    def dense(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
              plan: Plan | None = None) -> Tensor | None:
        """The ``(..., N, M)`` matrix, entries below the normal floating-point range written as zeros;
        ``None`` where the engine has no dense output (:func:`lazykern.backend.pairwise_dense` then
        builds it with another engine)."""
        return None

    def fuses_symmetric_gradient(self, formula: Formula) -> bool:
        """Whether :meth:`symmetric_gradients` takes ``formula`` (for K(X, X) of equal inputs)."""
        return False

    def symmetric_gradients(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
                            left: Tensor, right: Tensor, plan: Plan | None = None) -> Gradients | None:
        r"""The gradients of :math:`\sum_{ij} \langle l_i, r_j\rangle k(x^{(1)}_i, x^{(2)}_j)` in one
        reduction, for ``x1`` and ``x2`` holding the same points and ``left``/``right``
        ``(..., N, C)`` already in the batch shape (the contract of
        :func:`lazykern.backend.symmetric_gradients`); ``None`` where the engine cannot for these
        arguments (the caller then differentiates otherwise). Asked only where
        :meth:`fuses_symmetric_gradient` is true."""
        return None

    def padded_width(self, width: int) -> int:
        """The width a caller's feature axis of ``width`` entries is best zero-padded to for this
        engine (KeOps compiles one reduction per set of widths); ``width`` itself by default."""
        return width

    def dense_matmul(self, dense: Tensor, rhs: Tensor) -> Tensor | None:
        """``dense @ rhs`` for a stored kernel matrix, where this engine has a product that beats
        torch's for these tensors; ``None`` otherwise (the default: the caller uses torch's)."""
        return None

    def preconditioner(self, formula: Formula, x: Tensor,
                       params: Mapping[str, Tensor]) -> Callable[..., Preconditioner] | None:
        """A builder of a :class:`Preconditioner` of ``K(x, x) + diag(noise)`` from this engine's
        structure of ``formula`` (``build(noise)``, ``noise`` ``(N,)``; ``max_rank=`` bounds the
        directions a low-rank part keeps, ``extent=`` names more points its model must reach,
        for :meth:`Preconditioner.posterior_variance`), without building it; ``None`` where the engine has none
        (the default)."""
        return None

    def available(self) -> bool:
        """Whether the engine runs in this process at all (its library installed, its device
        present); true by default."""
        return True

    def program_count(self, device: torch.device) -> ProgramCount:
        """What this engine has compiled and loaded so far for ``device`` (:class:`ProgramCount`);
        nothing by default (engines that compile nothing)."""
        return ProgramCount((), 0, 0)

    def __repr__(self) -> str:
        return f"<lazykern engine {self.name!r}>"
