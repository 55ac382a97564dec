r"""Sums, products and scalings of formulas, as one formula.

A sum or a product of kernel matrices is again a kernel matrix of one pairwise expression: with
the inputs of the terms side by side, :math:`X = [x_{(1)} \mid x_{(2)} \mid \dots]` (each term's
own transformed inputs, e.g. :math:`x/\ell_a` next to :math:`x\pi/p_b`),

.. math::

    (K_1 \circ K_2)_{ij} = k_1(x_{(1)i}, x'_{(1)j})\; k_2(x_{(2)i}, x'_{(2)j}), \qquad
    (K_1 + K_2)_{ij} = k_1(\cdot) + k_2(\cdot),

where each term reads its own slice of the columns. Slicing works on KeOps ``LazyTensor`` objects
(``Extract``) and on torch tensors alike, so the combination runs as one reduction on either
engine, and it keeps the fused symmetric gradient: a sum or product of symmetric terms is
symmetric in the concatenated inputs.

Parameters follow the convention of every formula: tensors passed by keyword, each term's under a
name of its own in the combination (``Part.names``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .protocol import Formula, declared

__all__ = ["Combination", "Part", "Scaled", "columns", "split_columns"]


def columns(x: Any, start: int, stop: int) -> Any:
    """Columns ``start:stop`` of the feature (last) axis of a torch tensor, a KeOps ``LazyTensor``
    (``Extract``) or the compiler's tracer; the whole axis is ``x`` itself.

    Example:
        >>> columns(torch.arange(6.0).reshape(2, 3), 1, 3).tolist()
        [[1.0, 2.0], [4.0, 5.0]]
    """
    if isinstance(x, torch.Tensor):
        return x[..., start:stop]
    # KeOps LazyTensors and the tracer take a bare slice of their feature axis (their ``ndim`` is its width).
    return x if (start == 0 and stop == x.ndim) else x[start:stop]


def split_columns(x: Any, parts: int) -> list[Any]:
    """The feature axis of ``x`` cut into ``parts`` equal slices (:func:`columns`).

    Example:
        >>> [part.tolist() for part in split_columns(torch.arange(4.0), 2)]
        [[0.0, 1.0], [2.0, 3.0]]
    """
    width = (x.shape[-1] if isinstance(x, torch.Tensor) else x.ndim) // parts
    return [columns(x, k * width, (k + 1) * width) for k in range(parts)]


@dataclass(frozen=True)
class Scaled:
    r"""The formula :math:`c\, k(x, x')` with a tensor parameter ``outputscale`` :math:`c`
    (``(*batch, 1, 1)``), e.g. a ``ScaleKernel`` around a lazy kernel.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> f = Scaled(StationaryFormula("rbf"))
        >>> x = torch.zeros(2, 1, 3)
        >>> f(x, x, outputscale=torch.full((1, 1), 2.0)).flatten().tolist()
        [2.0, 2.0]
    """

    formula: Formula

    @property
    def param_names(self) -> tuple[str, ...]:
        return (*declared(self.formula).param_names, "outputscale")

    @property
    def symmetric(self) -> bool:
        return declared(self.formula).symmetric

    @property
    def pair_width(self) -> int | None:
        return declared(self.formula).pair_width  # the scaling adds nothing per pair

    def __call__(self, x1: Any, x2: Any, outputscale: Any, **params: Any) -> Any:
        return outputscale * self.formula(x1, x2, **params)


@dataclass(frozen=True)
class Part:
    """One term of a :class:`Combination`: a formula, the columns ``[start, stop)`` of the
    concatenated inputs it reads, and its parameters as ``(name in the combination, name in the
    formula)`` pairs."""

    formula: Formula
    start: int
    stop: int
    names: tuple[tuple[str, str], ...]

    def __call__(self, x1: Any, x2: Any, params: dict[str, Any]) -> Any:
        own = {inner: params[outer] for outer, inner in self.names}
        return self.formula(columns(x1, self.start, self.stop), columns(x2, self.start, self.stop), **own)


@dataclass(frozen=True)
class Combination:
    r"""The sum (``op="sum"``) or elementwise product (``op="product"``) of its parts' formulas,
    each applied to its own columns of the inputs.

    Example:
        >>> import torch
        >>> from lazykern.formulas import StationaryFormula
        >>> rbf, periodic = StationaryFormula("rbf"), StationaryFormula("periodic")
        >>> f = Combination("product", (Part(rbf, 0, 2, ()), Part(periodic, 2, 4, (("w", "weights"),))))
        >>> x1, x2 = torch.randn(5, 1, 4), torch.randn(1, 3, 4)
        >>> K = f(x1, x2, w=torch.ones(1, 1, 2))
        >>> expected = rbf(x1[..., :2], x2[..., :2]) * periodic(x1[..., 2:], x2[..., 2:], weights=torch.ones(1, 1, 2))
        >>> K.shape, bool(torch.allclose(K, expected))
        (torch.Size([5, 3, 1]), True)
    """

    op: str
    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        if self.op not in ("sum", "product"):
            raise ValueError(f"op must be 'sum' or 'product', got {self.op!r}")
        if not self.parts:
            raise ValueError("a Combination needs at least one part")

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(outer for part in self.parts for outer, _ in part.names)

    @property
    def symmetric(self) -> bool:
        return all(declared(p.formula).symmetric for p in self.parts)

    #: A broadcast over the concatenated input width.
    pair_width = None

    def __call__(self, x1: Any, x2: Any, **params: Any) -> Any:
        total = None
        for part in self.parts:
            value = part(x1, x2, params)
            if total is None:
                total = value
            else:
                total = total + value if self.op == "sum" else total * value
        return total
