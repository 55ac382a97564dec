r"""What the structured engine takes: a formula's first-order additive form, and its plan on given tensors.

A formula is first-order additive when it is a weighted sum of one-dimensional half-integer Matérn
or Gaussian terms, one per input dimension, alone or :class:`~lazykern.formulas.composite.Scaled`
by an ``outputscale`` (:func:`~lazykern.structured.engine.additive_form`); the engine takes it on
CPU tensors of one width (:func:`plan`), and the form is its plan. Here, below the engine and the grid preconditioner
(:mod:`lazykern.structured.grid`), so that both read it.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, NamedTuple

from torch import Tensor

from ..formulas import Formula, InteractionFormula, Scaled, StationaryFormula

__all__ = ["AdditiveForm", "additive_form", "plan"]

_FAMILIES = ("matern", "rbf")


class AdditiveForm(NamedTuple):
    """A formula's first-order additive form: the additive formula of its one-dimensional terms and
    its effective per-dimension scales (outer scales folded in)."""

    terms: StationaryFormula
    scales: Tensor


def additive_form(formula: Formula, params: Mapping[str, Tensor]) -> AdditiveForm | None:
    """The first-order additive form of ``formula`` with ``params``, or ``None`` where it has none.

    Example:
        >>> import torch
        >>> f = InteractionFormula(StationaryFormula("matern", nu=2.5), max_degree=1)
        >>> form = additive_form(Scaled(f), {"order_variances": torch.full((1, 1), 3.0),
        ...                                  "scales": torch.ones(1, 3), "outputscale": torch.full((1, 1), 2.0)})
        >>> form.terms, form.scales.tolist()   # 2 * 3 / 3: the first order is normalized
        (StationaryFormula(family='matern', additive=True, nu=2.5), [[2.0, 2.0, 2.0]])
    """
    names, outer = set(params), None
    if isinstance(formula, Scaled):
        formula, outer, names = formula.formula, params["outputscale"], names - {"outputscale"}
    if isinstance(formula, StationaryFormula):
        if not (formula.additive and formula.family in _FAMILIES and names == {"scales"}):
            return None
        form = AdditiveForm(formula, params["scales"])
    elif isinstance(formula, InteractionFormula):
        if not (formula.max_degree == 1 and formula.kind == "base" and formula.base.family in _FAMILIES
                and names == {"scales", "order_variances"}):
            return None
        terms = dataclasses.replace(formula.base, additive=True)
        scales = params["scales"]  # the first order is normalized: sigma_1^2 / D times the sum over D dimensions
        form = AdditiveForm(terms, params["order_variances"] * scales / scales.shape[-1])
    else:
        return None
    return form if outer is None else form._replace(scales=outer * form.scales)


def plan(formula: Formula, x1: Tensor, x2: Tensor, params: Mapping[str, Tensor]) -> AdditiveForm | None:
    """The structured engine's plan of ``formula`` on these tensors: its additive form
    (:func:`~lazykern.structured.engine.additive_form`) where the inputs are CPU tensors of one
    width, else ``None``.

    Example:
        >>> import torch
        >>> x = torch.randn(5, 3, dtype=torch.float64)
        >>> f = StationaryFormula("matern", additive=True, nu=1.5)
        >>> plan(f, x, x, {"scales": torch.ones(1, 3)}).scales.shape, plan(f, x, x[:, :2], {"scales": torch.ones(1, 3)})
        (torch.Size([1, 3]), None)
    """
    if x1.device.type != "cpu" or x2.device.type != "cpu" or x1.shape[-1] != x2.shape[-1]:
        return None
    return additive_form(formula, params)
