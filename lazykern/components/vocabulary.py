"""The words of component analysis, written once: what each kind of order shares is, how each kind
of total effects was computed, and the order in which inputs are ranked. The analysis, the text
report and the figure all read them (the definitions themselves: :mod:`lazykern.components`)."""

from __future__ import annotations

from typing import Sequence

#: What each ``kind`` of order shares is, and how each ``total_kind`` of total effects was computed:
#: the one place these definitions are written for the report and the plots.
ORDER_SHARE_MEANING = {
    "sobol": "Sobol indices of the posterior mean under the input measure: the share of its variance in "
             "interactions of exactly r inputs",
    "empirical": "variance over the training inputs of each order's posterior-mean term, over their sum; "
                 "the orders' terms overlap, so these are not Sobol indices",
}
TOTAL_EFFECT_MEANING = {
    "sobol": "closed form under the input measure",
    "pick-freeze": "Monte Carlo (pick-freeze) under independent training marginals",
    "first-order": "exact: a first-order model, total effect = first-order share",
}


def ranking(totals: Sequence[float], firsts: Sequence[float]) -> list[int]:
    """Input indices by decreasing total effect, ties broken by the larger first-order share: the
    order in which the report and the figure list the inputs.

    Args:
        totals: each input's total effect.
        firsts: each input's first-order share.

    Example:
        >>> from lazykern.components.vocabulary import ranking
        >>> ranking([0.2, 0.5, 0.5], [0.1, 0.0, 0.3])
        [2, 1, 0]
    """
    return sorted(range(len(totals)), key=lambda k: (-totals[k], -firsts[k]))
