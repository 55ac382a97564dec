"""UCI regression datasets: locate or download (checksum-verified), split and standardize.

Example:
    >>> from lazykern.data import load_uci
    >>> data = load_uci("pol", split=0, n_train=2000)  # doctest: +SKIP
"""

from .uci import (
    DATASETS,
    DEFAULT_BASE_URL,
    NUM_SPLITS,
    DownloadError,
    UCISplit,
    default_cache_dir,
    fetch_uci,
    load_uci,
    locate_uci,
)
from .synthetic import synthetic_additive

__all__ = [
    "DATASETS",
    "DEFAULT_BASE_URL",
    "NUM_SPLITS",
    "DownloadError",
    "UCISplit",
    "default_cache_dir",
    "fetch_uci",
    "load_uci",
    "locate_uci",
    "synthetic_additive",
]
