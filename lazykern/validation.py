"""Input checks shared by every public entry point: fail early, name the argument, change nothing."""

from __future__ import annotations

import math

import torch
from torch import Tensor

_FLOATS = (torch.float32, torch.float64)


def check_floating_matrix(name: str, x: object, *, min_dim: int = 2) -> Tensor:
    """``x`` must be a non-empty, finite float32/float64 tensor with at least ``min_dim`` dims."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions (..., n, d), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def check_samples(name: str, x: object, *, min_dim: int = 1) -> Tensor:
    """``x`` must be a non-empty tensor of samples with at least ``min_dim`` dimensions, finite if
    floating. Any dtype (integer token ids included): the model it feeds decides what it accepts."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions (samples first), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    if (x.is_floating_point() or x.is_complex()) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def check_kernel_inputs(
    x1: object,
    x2: object,
    *,
    num_dims: int | None = None,
    num_dims_name: str = "ard_num_dims",
    dtype: torch.dtype | None = None,
) -> None:
    """Validate a pair of kernel inputs before anything is compiled or allocated.

    Args:
        num_dims: the feature dimension the kernel was built for (``None``: any).
        num_dims_name: the constructor argument that fixed ``num_dims``, for the message.
        dtype: the kernel's parameter dtype; inputs must match it.
    """
    check_floating_matrix("x1", x1)
    check_floating_matrix("x2", x2)
    if x1.dtype != x2.dtype:
        raise TypeError(f"x1 and x2 must have the same dtype, got {x1.dtype} and {x2.dtype}")
    if dtype is not None and x1.dtype != dtype:
        raise TypeError(
            f"x1 has dtype {x1.dtype} but the kernel's hyperparameters are {dtype}; "
            f"call kernel.to({x1.dtype}) or convert the inputs"
        )
    if x1.device != x2.device:
        raise ValueError(f"x1 and x2 must be on the same device, got {x1.device} and {x2.device}")
    if x1.shape[-1] != x2.shape[-1]:
        raise ValueError(
            f"x1 and x2 must have the same number of features, got {x1.shape[-1]} and {x2.shape[-1]}"
        )
    if num_dims is not None and x1.shape[-1] != num_dims:
        raise ValueError(
            f"inputs have {x1.shape[-1]} features (after active_dims) but the kernel expects "
            f"{num_dims} ({num_dims_name}={num_dims})"
        )


def check_positive_int(name: str, value: object) -> int:
    """``value`` must be an int >= 1 (``bool`` excluded)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_positive_number(name: str, value: object) -> float:
    """``value`` must be a finite real number > 0 (``bool`` excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
