"""Pure kernel formulas.

A formula is a function of pairwise-expanded inputs and tensor parameters. The same code runs on
KeOps ``LazyTensor`` objects (symbolic, never stored) and on ``torch.Tensor`` blocks (dense, in
chunks), because both share torch's operator syntax. What the engines rely on in a formula is one
protocol, :class:`~lazykern.formulas.protocol.Formula` (:mod:`lazykern.formulas.protocol`).
Nothing here imports GPyTorch.
"""

from .composite import Combination, Part, Scaled
from .interactions import GroupFormula, InteractionFormula, elementary_symmetric
from .protocol import Formula, declared
from .stationary import PROFILES, StationaryFormula

__all__ = [
    "Combination", "Formula", "GroupFormula", "InteractionFormula", "PROFILES", "Part", "Scaled", "StationaryFormula",
    "declared", "elementary_symmetric",
]
