"""lazykern: lazy symbolic kernels, compiled by lazykern's own engines and run by KeOps on GPUs.

Additive GP kernels and empirical neural tangent kernels as symbolic reductions that never form
N x M x d (nor, unless it fits a memory budget, N x M).

The names below are imported on first use (PEP 562), so ``import lazykern`` and the ``lazykern``
command's ``--help``, ``--version`` and usage errors answer without importing torch, GPyTorch or
KeOps.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from . import keops_messages

# linear_operator 0.6 applies torch.jit.script when imported, which torch >= 2.14 deprecates with a
# FutureWarning on every run of every program that imports lazykern: a notice about a dependency's
# internals that no lazykern user can act on, and it made the command's and the examples' one-line
# error messages three lines. Only that message is hidden.
warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)

# KeOps prints to stdout when GPyTorch imports it ("CUDA libraries not found ..."): a program's
# output (a script's results, ``lazykern uci --json -``) must not carry it; stderr does.
keops_messages.install()

__version__ = "0.1.0"
"""The version: the one place it is written (``pyproject.toml`` and ``lazykern --version`` read it)."""

# Subpackages and modules reachable as attributes, and the names re-exported from them.
_SUBMODULES = (
    "components", "data", "distributed", "formulas", "kernels", "ntk", "operators", "regression", "settings", "solvers",
)
_FROM = {
    "kernels": (
        "AdditiveStructureKernel", "GroupAdditiveKernel", "MaternKernel", "NewtonGirardAdditiveKernel",
        "OrthogonalAdditiveKernel", "PeriodicKernel", "ProductKernel", "ProjectedAdditiveKernel", "RBFKernel",
        "RQKernel",
    ),
    "operators": ("LazyKernelOperator", "as_scipy"),
    "warmup": ("precompile",),  # the function; its module is lazykern.warmup
    "solvers": ("KernelRidge",),
}
_ORIGIN = {**{name: module for module, names in _FROM.items() for name in names}, **{m: m for m in _SUBMODULES}}

__all__ = [
    "AdditiveStructureKernel",
    "GroupAdditiveKernel",
    "KernelRidge",
    "LazyKernelOperator",
    "MaternKernel",
    "NewtonGirardAdditiveKernel",
    "OrthogonalAdditiveKernel",
    "PeriodicKernel",
    "ProductKernel",
    "ProjectedAdditiveKernel",
    "RBFKernel",
    "RQKernel",
    "as_scipy",
    "components",
    "data",
    "distributed",
    "formulas",
    "kernels",
    "ntk",
    "precompile",
    "operators",
    "regression",
    "settings",
    "solvers",
]


def __getattr__(name: str) -> Any:
    module_name = _ORIGIN.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{module_name}", __name__)
    value = module if name in _SUBMODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
