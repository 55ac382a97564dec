"""UCI regression datasets: locate or download (checksum-verified), check what they hold, split and standardize.

The names below are imported on first use (PEP 562): the ``lazykern`` command reads
``lazykern.data.layout`` and ``lazykern.data.checksums`` (standard library only) to check a
dataset name, folder and size before anything imports torch.

Example:
    >>> from lazykern.data import DATASETS, synthetic_additive
    >>> "pol" in DATASETS, synthetic_additive(n_train=20, n_test=5).name
    (True, 'synthetic-additive')
"""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "uci": ("DATASETS", "DEFAULT_BASE_URL", "DownloadError", "UCISplit", "fetch_uci", "load_uci", "locate_uci"),
    "checks": ("DataError",),
    "layout": ("NUM_SPLITS", "default_cache_dir"),
    "synthetic": ("synthetic_additive",),
}
_ORIGIN = {name: module for module, names in _FROM.items() for name in names}

__all__ = [
    "DATASETS",
    "DEFAULT_BASE_URL",
    "NUM_SPLITS",
    "DataError",
    "DownloadError",
    "UCISplit",
    "default_cache_dir",
    "fetch_uci",
    "load_uci",
    "locate_uci",
    "synthetic_additive",
]


def __getattr__(name: str) -> Any:
    module_name = _ORIGIN.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
