"""Component analysis as lines of text, each number with its definition: what ``lazykern uci`` and
the examples print. Reads :func:`~lazykern.components.summary`'s plain values (a JSON record
will do), never the model or its tensors."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .vocabulary import ORDER_SHARE_MEANING, TOTAL_EFFECT_MEANING, ranking

__all__ = ["report_lines"]


def report_lines(
    record: Mapping[str, Any], *, names: Sequence[str] | None = None, orders: int = 8, inputs: int = 5
) -> list[str]:
    """The order shares and the inputs ranked by total effect, each with its definition, as text lines.

    Args:
        record: :func:`summary`'s dict (or any mapping with its keys, such as ``lazykern uci``'s
            JSON record); without ``order_shares`` (a kernel without components) no lines.
        names: one name per input (default ``x0, x1, ...``; for a projected kernel's analysis,
            whose components are projections (``component_axes``), ``p0, p1, ...``).
        orders: orders shown one by one; the rest are summed into one entry.
        inputs: inputs shown, by decreasing total effect.

    Example:
        >>> record = {"order_shares": [0.7, 0.3], "dimension_shares": [0.5, 0.2, 0.0],
        ...           "total_effects": [0.5, 0.5, 0.3], "total_effects_se": None,
        ...           "analysis_kind": "sobol", "total_effects_kind": "sobol"}
        >>> print("\\n".join(report_lines(record)))  # doctest: +NORMALIZE_WHITESPACE
        order shares        1: 0.700  2: 0.300
                            (Sobol indices of the posterior mean under the input measure: the share of its
                            variance in interactions of exactly r inputs)
        top inputs          x0: 0.500  x1: 0.500  x2: 0.300
        first-order shares  x0: 0.500  x1: 0.200  x2: 0.000
                            (total effect: the share of the posterior mean's variance in every term that involves
                            the input, of every order, i.e. its total Sobol index; closed form under the input
                            measure. First-order share: the share in its first-order component alone)
    """
    shares, firsts, totals = (record.get(k) for k in ("order_shares", "dimension_shares", "total_effects"))
    if shares is None or firsts is None or totals is None:
        return []
    projections = record.get("component_axes") == "projections"
    prefix, listed = ("p", "projections") if projections else ("x", "inputs")
    names = list(names) if names is not None else [f"{prefix}{k}" for k in range(len(totals))]
    shown = "  ".join(f"{r}: {share:.3f}" for r, share in enumerate(shares[:orders], start=1))
    if len(shares) > orders:
        shown += f"  {orders + 1}-{len(shares)}: {sum(shares[orders:]):.3f}"
    top = ranking(totals, firsts)[:inputs]
    how = TOTAL_EFFECT_MEANING[record["total_effects_kind"]]
    errors = record.get("total_effects_se")
    if errors is not None:
        how += f", standard error at most {max(errors):.3f}"
    return [
        f"order shares        {shown}",
        f"                    ({ORDER_SHARE_MEANING[record['analysis_kind']]})",
        f"top {listed:<16}{'  '.join(f'{names[k]}: {totals[k]:.3f}' for k in top)}",
        f"first-order shares  {'  '.join(f'{names[k]}: {firsts[k]:.3f}' for k in top)}",
        "                    (total effect: the share of the posterior mean's variance in every term that involves "
        f"the input, of every order, i.e. its total Sobol index; {how}. First-order share: the share in its "
        "first-order component alone)"
        + (f"; pj is the projection w_j^T x of the j-th direction, {len(totals)} of them" if projections else ""),
    ]
