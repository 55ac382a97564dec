"""Global switches for lazykern, in the style of :mod:`gpytorch.settings`.

Each setting has a process-wide default, readable with ``setting.value()``, and can be changed
for a block of code with ``with setting(value): ...`` (restored on exit, also on error) or for
the whole process with ``setting.set_global(value)``.

Example:
    >>> import lazykern
    >>> with lazykern.settings.engine("torch"):
    ...     pass  # every kernel reduction in this block runs on the chunked torch engine
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from .validation import check_non_negative_int, check_positive_int

__all__ = ["engine", "keops_min_size", "chunk_bytes", "max_dense_bytes", "structured_tolerance", "preconditioner_reuse"]


class _Setting:
    """A value with a global default and a thread-local stack of context overrides."""

    _default: ClassVar[Any] = None
    _global: ClassVar[Any] = None
    _local: ClassVar[threading.local]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._local = threading.local()

    def __init__(self, value: Any) -> None:
        self._value = self._validate(value)

    @classmethod
    def _validate(cls, value: Any) -> Any:
        return value

    @classmethod
    def _stack(cls) -> list:
        if not hasattr(cls._local, "stack"):
            cls._local.stack = []
        return cls._local.stack

    @classmethod
    def value(cls) -> Any:
        stack = cls._stack()
        if stack:
            return stack[-1]
        return cls._default_value() if cls._global is None else cls._global

    @classmethod
    def _default_value(cls) -> Any:
        return cls._default

    @classmethod
    def set_global(cls, value: Any) -> None:
        """Change the process-wide value (``None`` restores the documented default)."""
        cls._global = None if value is None else cls._validate(value)

    def __enter__(self) -> "_Setting":
        self._stack().append(self._value)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack().pop()


class engine(_Setting):
    """Which engine evaluates kernel reductions (matvecs).

    * ``"auto"`` (default): the structured engine for the first-order additive kernels it takes
      (from :data:`lazykern.backend.STRUCTURED_MIN_POINTS` points), lazykern's compiled CPU engine
      for the other CPU tensors it supports; else KeOps
      (GPUs) when both sides have at least :class:`keops_min_size` points, the chunked torch
      engine below (:func:`lazykern.backend.engine_for` has the whole rule);
    * ``"cpu"``: always lazykern's CPU engine (:mod:`lazykern.cpu`; a ``ValueError`` names what it
      cannot evaluate);
    * ``"keops"``: always the symbolic KeOps reduction;
    * ``"triton"``: always lazykern's Triton engine (:mod:`lazykern.triton`: CUDA tensors, or CPU
      tensors under ``TRITON_INTERPRET=1``; a ``ValueError`` names what it cannot evaluate);
    * ``"torch"``: always the chunked torch engine (bounded by :class:`chunk_bytes`);
    * ``"structured"``: always the structured engine (:mod:`lazykern.structured`: first-order
      additive kernels of one-dimensional Matérn and RBF terms on CPU tensors, in O((N + M) d)).

    All engines evaluate the same formula and agree to rounding. A side with a single point
    runs on the torch engine whatever the setting (KeOps would read it as a parameter).
    """

    _default = "auto"
    _choices = ("auto", "cpu", "keops", "triton", "torch", "structured")

    @classmethod
    def _validate(cls, value: Any) -> str:
        if value not in cls._choices:
            raise ValueError(f"lazykern.settings.engine expects one of {cls._choices}, got {value!r}")
        return value


class structured_tolerance(_Setting):
    """The structured engine's error bound for Gaussian (RBF) terms, whose one-dimensional sums
    are a fast Gauss transform (:mod:`lazykern.structured.gauss`): each per-dimension sum is within
    ``tol`` times :math:`\\sum_j |v_j|` of the exact one. ``None`` (default): 1e-10 in float64 and
    float32's rounding (:math:`2^{-23}`) in float32. Half-integer Matérn terms are exact whatever
    this says.

    Example:
        >>> import torch
        >>> structured_tolerance.for_dtype(torch.float64), structured_tolerance.for_dtype(torch.float32)
        (1e-10, 1.1920928955078125e-07)
        >>> with structured_tolerance(1e-6):
        ...     structured_tolerance.for_dtype(torch.float64)
        1e-06
    """

    _default = None

    @classmethod
    def _validate(cls, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
            raise ValueError(f"lazykern.settings.structured_tolerance expects a number in (0, 1) or None, got {value!r}")
        return float(value)

    @classmethod
    def for_dtype(cls, dtype: Any) -> float:
        """The bound in force for sums in ``dtype``."""
        value = cls.value()
        if value is not None:
            return value
        import torch

        return 1e-10 if dtype == torch.float64 else float(torch.finfo(torch.float32).eps)


class preconditioner_reuse(_Setting):
    r"""How many of ``linear_operator``'s solves with :math:`K + D` one grid preconditioner serves
    (:mod:`lazykern.operators.preconditioning`; default 1: each operator builds its own).

    A training loop builds a new operator at every step, with hyperparameters that moved a little;
    the preconditioner built a few steps earlier still fits it. Reusing it changes only how fast
    conjugate gradients and stochastic Lanczos quadrature converge, never what they converge to
    (:math:`\log|A| = \log|P| + \log|P^{-1} A|` holds for every :math:`P`), and saves building it,
    which costs more than a step's products for sums of many terms. Within this context a grid is
    kept per formula, number of points and dtype, and built again after ``value`` uses.

    Example:
        >>> with preconditioner_reuse(10):
        ...     preconditioner_reuse.value()
        10
    """

    _default = 1

    @classmethod
    def _validate(cls, value: Any) -> int:
        return check_positive_int("lazykern.settings.preconditioner_reuse", value)


class keops_min_size(_Setting):
    """Smallest number of points on *both* sides of a kernel matrix for which ``engine="auto"``
    uses KeOps when lazykern's CPU engine does not apply (default 512). Below it, compiling and
    launching a KeOps reduction costs more than the chunked torch engine."""

    _default = 512

    @classmethod
    def _validate(cls, value: Any) -> int:
        return check_non_negative_int("lazykern.settings.keops_min_size", value)


class chunk_bytes(_Setting):
    """Upper bound, in bytes, on the pairwise intermediate (rows x columns x dimensions) that the
    torch engine holds at once (default 4 MiB). This is what keeps the torch engine from ever
    holding N x M x d. Small blocks also keep peak memory low under autograd, while the per-block
    Python overhead stays negligible (measured: docs/performance.rst, "Chunk size").

    Example:
        >>> with chunk_bytes(2**20):
        ...     chunk_bytes.value()
        1048576
    """

    _default = 4 * 2**20

    @classmethod
    def _validate(cls, value: Any) -> int:
        return check_positive_int("lazykern.settings.chunk_bytes", value)


class max_dense_bytes(_Setting):
    """Dense budget: the most bytes of N x M kernel matrices that lazykern keeps, per device, to
    serve matvecs by BLAS (each formed once, blockwise, never N x M x d). ``0`` means always lazy.

    The budget caps the *total* held on a device: a new matrix evicts the least recently used
    ones until everything fits, and one that cannot fit is not formed (the operator stays lazy).

    Default: a quarter of the memory available on the tensors' device, read again each time a
    new matrix is considered: ``MemAvailable`` (Linux; physical memory elsewhere) for CPU tensors,
    free device memory (``torch.cuda.mem_get_info`` plus what torch's allocator holds unused) for
    CUDA tensors. What lazykern's dense cache already holds counts as available, since it would be
    released first. An explicit value applies to every device.
    """

    _default = None

    @classmethod
    def _validate(cls, value: Any) -> int:
        return check_non_negative_int("lazykern.settings.max_dense_bytes", value)

    @classmethod
    def _default_value(cls) -> int:
        return _available_memory_bytes() // 4

    @classmethod
    def for_device(cls, device: Any, held: int = 0) -> int:
        """The budget for tensors on ``device`` (a ``torch.device``), given that lazykern's
        dense cache already holds ``held`` bytes there."""
        stack = cls._stack()
        if stack:
            return stack[-1]
        if cls._global is not None:
            return cls._global
        if getattr(device, "type", "cpu") == "cuda":
            return (_free_cuda_bytes(device) + held) // 4
        return (_available_memory_bytes() + held) // 4


def _free_cuda_bytes(device: Any) -> int:
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    # Blocks torch's caching allocator reserved but does not use are free to torch tensors.
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _available_memory_bytes() -> int:
    # What the OS could give without swapping (Linux's MemAvailable, the free and inactive pages
    # elsewhere), not the physical total: the budget is for tensors formed now.
    import psutil

    return psutil.virtual_memory().available
