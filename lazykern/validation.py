"""Input checks shared by every public entry point: fail early, name the argument, change nothing."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal, TypeGuard, cast, overload

import torch
from torch import Tensor

_FLOATS = (torch.float32, torch.float64)


def _all_finite(x: Tensor) -> bool:
    """Whether every entry of the floating ``x`` is finite: then so are its least and greatest, and a
    NaN or an infinity anywhere makes one of them not. One pass and no tensor of flags: a tenth of
    ``isfinite(x).all()``'s time, on the inputs of every kernel call."""
    if x.is_complex() or x.numel() == 0:
        return bool(torch.isfinite(x).all())
    low, high = torch.aminmax(x.detach())
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


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
    if not _all_finite(x):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def check_samples(name: str, x: object, *, min_dim: int = 1, layout: str = "samples first") -> Tensor:
    """``x`` must be a non-empty tensor of samples with at least ``min_dim`` dimensions, finite if
    floating. Any dtype (integer token ids included): the model it feeds decides what it accepts."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions ({layout}), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    if (x.is_floating_point() or x.is_complex()) and not _all_finite(x):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def _check_input(name: str, x: object) -> Tensor:
    if isinstance(x, Tensor) and (x.dtype == torch.bool or x.is_complex()):
        raise TypeError(f"{name} must hold real numbers (float or integer), got {x.dtype}")
    return check_samples(name, x, min_dim=2, layout="..., n, d")


def check_kernel_inputs(
    x1: object,
    x2: object,
    *,
    num_dims: int | None = None,
    num_dims_name: str = "ard_num_dims",
    dtype: torch.dtype | None = None,
) -> torch.dtype:
    """Validate a pair of kernel inputs before anything is compiled or allocated, and return the
    dtype the kernel computes in.

    Dtypes promote as in GPyTorch (and torch): float64 inputs into a float32 kernel compute in
    float64, integer inputs take the kernel's dtype. The result must be float32 or float64.

    Args:
        num_dims: the feature dimension the kernel was built for (``None``: any).
        num_dims_name: the constructor argument that fixed ``num_dims``, for the message.
        dtype: the kernel's parameter dtype (``None``: the inputs' alone).
    """
    x1 = _check_input("x1", x1)
    x2 = x1 if x2 is x1 else _check_input("x2", x2)  # K(X, X): one scan of a large input, not two
    result = torch.promote_types(x1.dtype, x2.dtype)
    if dtype is not None:
        result = torch.promote_types(result, dtype)
    if result not in _FLOATS:
        raise TypeError(
            f"kernel inputs must compute in float32 or float64, got x1: {x1.dtype}, x2: {x2.dtype}"
            + (f", hyperparameters: {dtype}" if dtype is not None else "")
            + f" (promoted: {result})"
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
    return result


@overload
def check_positive_int(name: str, value: object, *, optional: Literal[False] = False) -> int: ...


@overload
def check_positive_int(name: str, value: object, *, optional: bool) -> int | None: ...


def check_positive_int(name: str, value: object, *, optional: bool = False) -> int | None:
    """``value`` must be an int >= 1 (``bool`` excluded), or ``None`` where ``optional`` (e.g. an
    iteration cap whose ``None`` is the caller's default).

    Example:
        >>> check_positive_int("max_iter", None, optional=True) is None
        True
        >>> check_positive_int("max_iter", 0, optional=True)
        Traceback (most recent call last):
        ValueError: max_iter must be a positive int or None, got 0
    """
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if optional else ''}, got {value!r}")
    return value


def check_positive_ints(name: str, values: object) -> tuple[int, ...]:
    """``values`` must be a non-empty sequence of ints >= 1 (``bool`` excluded). Returns them as a tuple.

    Example:
        >>> check_positive_ints("columns", [1, 16])
        (1, 16)
        >>> check_positive_ints("columns", (0,))
        Traceback (most recent call last):
        ValueError: columns must be a non-empty sequence of positive ints, got (0,)
    """
    items = tuple(values) if isinstance(values, Iterable) else ()
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {values!r}")
    return cast("tuple[int, ...]", items)  # every item was checked an int above


def check_positive_number(name: str, value: object) -> float:
    """``value`` must be a finite real number > 0 (``bool`` excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_process_group(name: str, group: object):
    """``group`` must be ``None`` (the default group) or a ``torch.distributed`` process group this
    process belongs to, with ``torch.distributed`` initialized. Returns the group to use."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this PyTorch build")
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized: call torch.distributed.init_process_group('gloo') "
            "('nccl' for GPU tensors) on every rank first; torchrun sets the rank and rendezvous variables"
        )
    if group is None:
        return dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{name} must be a torch.distributed.ProcessGroup or None (the default group), got {type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"{name} does not include this process (global rank {dist.get_rank()})")
    return group


@overload
def check_non_negative_int(name: str, value: object, *, optional: Literal[False] = False) -> int: ...


@overload
def check_non_negative_int(name: str, value: object, *, optional: bool) -> int | None: ...


def check_non_negative_int(name: str, value: object, *, optional: bool = False) -> int | None:
    """``value`` must be an int >= 0 (``bool`` excluded), or ``None`` where ``optional``.

    Example:
        >>> check_non_negative_int("max_cholesky_size", None, optional=True) is None
        True
        >>> check_non_negative_int("keops_min_size", -1)
        Traceback (most recent call last):
        ValueError: keops_min_size must be a non-negative int, got -1
    """
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int{' or None' if optional else ''}, got {value!r}")
    return value


def check_positive_int_at_most(name: str, value: object, limit: int, limit_text: str) -> int:
    """``value`` must be an int with ``1 <= value <= limit`` (``bool`` excluded); ``limit_text``
    says what the limit is, for the message.

    Example:
        >>> check_positive_int_at_most("max_degree", 5, 4, "num_dims=4")
        Traceback (most recent call last):
        ValueError: max_degree must be at most num_dims=4, got 5
    """
    number = check_positive_int(name, value)
    if number > limit:
        raise ValueError(f"{name} must be at most {limit_text}, got {value!r}")
    return number


def check_choice(name: str, value: object, choices: tuple) -> object:
    """``value`` must be one of ``choices`` (compared with ``==``).

    Example:
        >>> check_choice("nu", 2.0, (0.5, 1.5, 2.5))
        Traceback (most recent call last):
        ValueError: nu must be one of (0.5, 1.5, 2.5), got 2.0
    """
    if value not in choices:
        expected = repr(choices[0]) if len(choices) == 1 else f"one of {choices}"
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_per_dimension(
    name: str, value: object, num_dims: int, *, dtype: torch.dtype, positive: bool = False
) -> Tensor:
    """``value`` must be a finite number or ``num_dims`` finite numbers (one per dimension), each
    positive where ``positive``. Returns them as a new ``(1, num_dims)`` tensor of ``dtype``.

    Example:
        >>> check_per_dimension("measure_std", 2.0, 3, dtype=torch.float64)
        tensor([[2., 2., 2.]], dtype=torch.float64)
    """
    value = torch.as_tensor(value, dtype=dtype)
    if value.dim() > 1 or value.numel() not in (1, num_dims):
        raise ValueError(
            f"{name} must be a number or {num_dims} numbers (one per dimension), got shape {tuple(value.shape)}"
        )
    if not _all_finite(value):
        raise ValueError(f"{name} must be finite")
    if positive and not bool((value > 0).all()):
        raise ValueError(f"{name} must be positive, got {value.tolist()}")
    return value.reshape(-1).expand(num_dims).reshape(1, num_dims).clone()


def check_index_groups(name: str, groups: object) -> tuple[tuple[int, ...], ...]:
    """``groups`` must be a non-empty sequence of non-empty sequences of distinct non-negative
    ints (column indices; ``bool`` excluded). Returns them as tuples.

    Example:
        >>> check_index_groups("groups", [[0, 1], (1, 2)])
        ((0, 1), (1, 2))
    """
    message = f"{name} must be a non-empty sequence of non-empty sequences of distinct non-negative column indices"

    def is_sequence(x: object) -> TypeGuard[Sequence[Any]]:
        return isinstance(x, Sequence) and not isinstance(x, (str, bytes)) and len(x) > 0

    if not is_sequence(groups):
        raise ValueError(f"{message}, got {groups!r}")
    for group in groups:
        indices = is_sequence(group) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in group)
        if not indices or len(set(group)) != len(group):
            raise ValueError(f"{message}, got group {group!r}")
    return tuple(tuple(group) for group in groups)


def check_term_hyperparameters(base_kernel: object, num_terms: int | None, *, terms_name: str, term: str) -> None:
    """The base kernel of a sum of one-dimensional terms must have its lengthscale (and period)
    shared, or one per term (``num_terms`` of them, the value of the argument ``terms_name``).

    Example:
        >>> import gpytorch
        >>> check_term_hyperparameters(gpytorch.kernels.RBFKernel(ard_num_dims=3), 4,
        ...                            terms_name="num_projections", term="projection")
        Traceback (most recent call last):
        ValueError: base_kernel.lengthscale has 3 entries: use ard_num_dims=None (shared) or ard_num_dims=num_projections=4 (one per projection)
    """
    for name in ("lengthscale", "period_length"):
        value = getattr(base_kernel, name, None)
        if value is not None and value.shape[-1] not in (1, num_terms):
            raise ValueError(
                f"base_kernel.{name} has {value.shape[-1]} entries: use ard_num_dims=None (shared) "
                f"or ard_num_dims={terms_name}={num_terms} (one per {term})"
            )


def check_flag(name: str, value: object) -> bool:
    """``value`` must be ``True`` or ``False`` (not a truthy number or string).

    Example:
        >>> check_flag("learn_projections", 1)
        Traceback (most recent call last):
        TypeError: learn_projections must be True or False, got 1
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_projections(name: str, value: object, num_dims: int, num_projections: int, *, choices: tuple) -> str | Tensor:
    """``value`` must name a construction in ``choices`` or be a finite float tensor of shape
    ``num_dims x num_projections`` (one projection direction per column, none of them zero).
    Returns the name, or the tensor detached and copied (the caller's tensor is never kept).

    Example:
        >>> check_projections("projections", torch.ones(3, 2), 3, 4, choices=("rpa", "dpa"))
        Traceback (most recent call last):
        ValueError: projections must have shape (num_dims, num_projections) = (3, 4), got (3, 2)
    """
    if isinstance(value, str):
        check_choice(name, value, choices)
        return value
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be one of {choices} or a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {value.dtype}")
    if tuple(value.shape) != (num_dims, num_projections):
        raise ValueError(
            f"{name} must have shape (num_dims, num_projections) = ({num_dims}, {num_projections}), "
            f"got {tuple(value.shape)}"
        )
    if not _all_finite(value):
        raise ValueError(f"{name} contains NaN or infinite values")
    zero = (value == 0).all(dim=0).nonzero().flatten().tolist()
    if zero:
        raise ValueError(f"{name} has all-zero columns {zero}: each column is the direction of one projection")
    return value.detach().clone()
