"""Names of the kernels the regression job builds (:func:`lazykern.regression.make_kernel`,
``lazykern uci --kernel``).

A module of plain names, free of torch and GPyTorch, so that the ``lazykern`` command lists and
checks them before importing anything heavy (``lazykern --help`` answers at once).
"""

from __future__ import annotations

__all__ = ["KERNELS", "COMPARE_KERNELS"]

KERNELS: tuple[str, ...] = ("additive-rbf", "additive-matern52", "rbf-ard", "matern52-ard", "gpytorch-rbf-ard")
"""Kernel names accepted by :func:`lazykern.regression.make_kernel` (and ``lazykern uci --kernel``)."""

COMPARE_KERNELS: tuple[str, ...] = ("rbf-ard", "gpytorch-rbf-ard")
"""The references ``lazykern uci --compare`` trains on the same split: lazykern's full ARD RBF kernel
and GPyTorch's own :class:`gpytorch.kernels.RBFKernel`."""
