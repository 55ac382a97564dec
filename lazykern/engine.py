r"""The contract every engine keeps: what it evaluates, its products, dense blocks and fused gradients.

An engine is one object (an :class:`Engine`), made once in the engine's own package
(``lazykern.cpu.ENGINE``, ``lazykern.triton.ENGINE``, ``lazykern.keops.engine.ENGINE``,
``lazykern.torch_engine.ENGINE``) and listed in the chooser's table (:data:`lazykern.backend.ENGINES`),
which picks one per call (:func:`lazykern.backend.choose_engine`). Engines are siblings: none
imports another, and nothing above the chooser names one. Shapes, for every method: ``x1``
``(..., N, D1)``, ``x2`` ``(..., M, D2)``, parameters ``(..., 1, K)`` in name order, right-hand
sides ``(..., M, C)``; batch dimensions broadcast.

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

from typing import Mapping

from torch import Tensor

from .formulas import Formula

__all__ = ["Engine"]

#: What :meth:`Engine.symmetric_gradients` returns: the gradients for ``x1``, ``x2`` and by parameter name.
Gradients = tuple["Tensor | None", "Tensor | None", dict[str, "Tensor | None"]]


class Engine:
    """One engine: a name, what it supports, and its reductions.

    Attributes:
        name: what :class:`lazykern.settings.engine` calls it (``"cpu"``, ``"keops"``, ...).
    """

    name: str = ""
    #: Whether a product costs less than forming the N x M matrix does (the structured engine's
    #: O((N + M) d) against O(N M d)): the operators then never store the matrix for products.
    products_beat_dense: bool = False

    def supports(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> bool:
        """Whether this engine evaluates ``formula`` on these tensors (nothing is compiled)."""
        raise NotImplementedError

    def matmul(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor], rhs: Tensor) -> Tensor:
        """``K(x1, x2) @ rhs``, ``(..., N, C)``, without storing K; differentiable in every tensor."""
        raise NotImplementedError

    def dense(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> Tensor | None:
        """The ``(..., N, M)`` matrix, entries below the normal floating-point range written as zeros;
        ``None`` where the engine has no dense output (:func:`lazykern.backend.pairwise_dense` then
        builds it with another engine)."""
        return None

    def fuses_symmetric_gradient(self, formula: Formula) -> bool:
        """Whether :meth:`symmetric_gradients` takes ``formula`` (for K(X, X) of equal inputs)."""
        return False

    def symmetric_gradients(self, formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor],
                            left: Tensor, right: Tensor) -> Gradients | None:
        r"""The gradients of :math:`\sum_{ij} \langle l_i, r_j\rangle k(x^{(1)}_i, x^{(2)}_j)` in one
        reduction, for ``x1`` and ``x2`` holding the same points and ``left``/``right``
        ``(..., N, C)`` already in the batch shape (the contract of
        :func:`lazykern.backend.symmetric_gradients`); ``None`` where the engine cannot for these
        arguments (the caller then differentiates otherwise). Asked only where
        :meth:`fuses_symmetric_gradient` is true."""
        return None

    def __repr__(self) -> str:
        return f"<lazykern engine {self.name!r}>"
