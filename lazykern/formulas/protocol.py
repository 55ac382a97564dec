r"""What an engine relies on in a formula: :class:`Formula`.

A formula is called as ``formula(x1, x2, **params)`` on pairwise-expanded array-likes (``x1``
``(..., N, 1, D)``, ``x2`` ``(..., 1, M, D)``: torch tensors, KeOps ``LazyTensor`` objects or the
compiler's tracer) and returns one value per pair with a trailing axis of size 1. Besides the
call, engines read three declarations: ``symmetric`` (whether :math:`k(x, x') = k(x', x)`, which
lets a fused gradient of :math:`K(X, X)` evaluate one derivative), ``pair_width`` (how many
numbers a row block of the torch engine holds per pair, for formulas that multiply matrices instead
of broadcasting; ``None`` for the others, which hold the input width) and ``param_names`` (the
names of its tensor parameters).

Every formula of :mod:`lazykern.formulas` declares all three. A plain function is a formula too
(an engine evaluates any function it can trace or run); it declares nothing, and
:func:`declared` gives it the answers that are always safe: not symmetric, no pair width, no named
parameters.

Example:
    >>> from lazykern.formulas import StationaryFormula
    >>> from lazykern.formulas.ntk import NTKFormula, NTKPart
    >>> declared(StationaryFormula("rbf")).symmetric, declared(lambda a, b: (a * b).sum(-1)).symmetric
    (True, False)
    >>> declared(NTKFormula((NTKPart(None, (0, 3), "one"),))).pair_width
    1
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Declarations", "Formula", "declared"]


@runtime_checkable
class Declarations(Protocol):
    """The facts about a formula that engines read (see the module docstring)."""

    # Read-only to engines: a formula may declare each as a class attribute or a property.
    @property
    def symmetric(self) -> bool: ...

    @property
    def pair_width(self) -> int | None: ...

    @property
    def param_names(self) -> tuple[str, ...]: ...


@runtime_checkable
class Formula(Declarations, Protocol):
    """A kernel formula: its declarations and its call on pairwise-expanded array-likes."""

    # Called as ``formula(x1, x2, **params)`` with the parameters it names (``param_names``); each
    # formula spells its own signature (some take none), so the protocol leaves the call open.
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class _Undeclared:
    """What a formula that declares nothing (a plain function) reads as."""

    symmetric = False
    pair_width = None
    param_names = ()


_UNDECLARED = _Undeclared()


def declared(formula: object) -> Declarations:
    """The declarations of ``formula``: its own where it declares them (every formula of
    :mod:`lazykern.formulas`), else those that are always safe (not symmetric, no pair width, no
    named parameters), so that an engine takes a plain function as well.

    Example:
        >>> declared(print).pair_width is None
        True
    """
    return formula if isinstance(formula, Declarations) else _UNDECLARED
