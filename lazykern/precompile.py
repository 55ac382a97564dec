"""Compile a kernel's reductions ahead of time (a warm-up before training or serving)."""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from gpytorch.kernels import Kernel

from . import settings
from .keops import build_folder
from .validation import check_positive_int

__all__ = ["precompile"]

# Inputs for the warm-up: the compiled formulas depend on dimensions and dtype, never on N.
_WARMUP_POINTS = 64


def _infer_dims(kernel: Kernel) -> int | None:
    for module in kernel.modules():
        if getattr(module, "active_dims", None) is not None:
            return int(module.active_dims.max()) + 1
        for name in ("num_dims", "ard_num_dims"):
            value = getattr(module, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def precompile(
    kernel: Kernel,
    *,
    dtype: torch.dtype = torch.float32,
    dims: int | None = None,
    columns: Sequence[int] = (1, 16),
    gradients: bool = True,
) -> str:
    r"""Compile the reductions that training and prediction with ``kernel`` will run, on the engine
    they will run on (:func:`lazykern.backend.engine_for`: lazykern's CPU engine for CPU tensors it
    supports, KeOps otherwise and on GPUs; under ``lazykern.settings.engine("keops")``, KeOps).

    One lazy matvec :math:`K(X, X)\,V` per entry of ``columns`` (the number of right-hand sides;
    matvecs are padded to 1, 2, 4, 8 or a multiple of 16 columns, so ``16`` covers GPyTorch's CG
    with up to 15 probe vectors and ``1`` covers prediction), and, with ``gradients``, the
    reductions of :math:`\partial (U^\top K V) / \partial \theta` for every hyperparameter
    :math:`\theta` of ``kernel`` that requires grad (what one marginal-likelihood backward pass
    compiles), and the dense build of :math:`K(X, X)` (what GPyTorch's Cholesky path asks for).
    Formulas depend on ``dtype``, the input dimension and the batch shape, never on the number of
    points, so this runs on a few random points and takes only compile time (KeOps: 5-30 s per
    formula the first time; the CPU engine: about a second; well under a second once cached). Safe to call from
    several processes at once (compiles are serialized by a file lock). The kernel's parameters
    and their ``.grad`` are left unchanged.

    Args:
        kernel: a GPyTorch kernel built from lazykern kernels (e.g. ``ScaleKernel(AdditiveStructureKernel(...))``).
        dtype: ``torch.float32`` or ``torch.float64`` (the dtype you will train in).
        dims: number of input columns; inferred from ``active_dims``, ``num_dims`` or
            ``ard_num_dims`` when omitted.
        columns: right-hand-side counts to compile for.
        gradients: also compile the hyperparameter-gradient reductions.

    Returns:
        The build folder the formulas were compiled into (see :func:`lazykern.keops.build_folder`).

    Example:
        >>> import gpytorch, lazykern
        >>> base = lazykern.RBFKernel(ard_num_dims=26)
        >>> kernel = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(base, num_dims=26))
        >>> folder = lazykern.precompile(kernel, dtype=torch.float32)  # doctest: +SKIP
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a gpytorch.kernels.Kernel, got {type(kernel).__name__}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if dims is None:
        dims = _infer_dims(kernel)
        if dims is None:
            raise ValueError("dims is required: the kernel has no active_dims, num_dims or ard_num_dims to infer it from")
    check_positive_int("dims", dims)
    columns = tuple(columns)
    if not columns or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in columns):
        raise ValueError(f"columns must be a non-empty sequence of positive ints, got {columns!r}")

    # A copy, so that converting to ``dtype`` neither rounds nor moves the caller's parameters.
    kernel = copy.deepcopy(kernel).to(dtype)
    device = next((p.device for p in kernel.parameters()), torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*kernel.batch_shape, _WARMUP_POINTS, dims, generator=generator, dtype=dtype).to(device)
    params = [p for p in kernel.parameters() if p.requires_grad]
    # A few points stand for many: the size threshold of the lazy engines is lifted.
    with settings.keops_min_size(0), settings.max_dense_bytes(0), torch.set_grad_enabled(gradients and bool(params)):
        for c in sorted(set(columns)):
            rhs = torch.randn(*x.shape[:-1], c, generator=generator, dtype=dtype).to(device)
            out = kernel(x, x) @ rhs
            if out.requires_grad:
                torch.autograd.grad(out.sum(), params, allow_unused=True)
        kernel(x, x).to_dense()
    return build_folder()
