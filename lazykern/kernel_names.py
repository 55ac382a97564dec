"""Names of the kernels the regression job builds (:func:`lazykern.regression.make_kernel`,
``lazykern uci --kernel``).

A module of plain names, free of torch and GPyTorch, so that the ``lazykern`` command lists and
checks them before importing anything heavy (``lazykern --help`` answers at once).
"""

from __future__ import annotations

__all__ = ["KERNELS", "DEFAULT_KERNEL", "COMPARE_KERNELS"]

KERNELS: tuple[str, ...] = (
    "additive-rbf",
    "additive-matern52",
    "additive-ng",
    "oak",
    "rbf-ard",
    "matern52-ard",
    "gpytorch-rbf-ard",
)
"""Kernel names accepted by :func:`lazykern.regression.make_kernel` (and ``lazykern uci --kernel``)."""

DEFAULT_KERNEL = "additive-ng"
"""The kernel :func:`lazykern.regression.fit_evaluate` and ``lazykern uci`` use unless told otherwise
(the docs' "UCI results" page says why)."""

COMPARE_KERNELS: tuple[str, ...] = ("rbf-ard", "gpytorch-rbf-ard")
"""The references ``lazykern uci --compare`` trains on the same split: lazykern's full ARD RBF kernel
and GPyTorch's own :class:`gpytorch.kernels.RBFKernel`."""
