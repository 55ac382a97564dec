"""Row blocks and the three collectives a sharded operator needs, each with its consistency check.

Every rank runs the same program on the same data (SPMD, as with ``DistributedDataParallel``):
each holds the whole operator, computes one block of rows of each product and receives the others
by ``all_gather``. The checks here turn the classic failure of that model -- ranks that silently
hold different data, hyperparameters or right-hand sides -- into an error on every rank at once.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["row_bounds", "gather_rows", "all_reduce_sum", "check_same_on_all_ranks"]

# Copies of the same values may differ by rounding (e.g. a feature map evaluated by a
# nondeterministic kernel); anything past this many ulps on average is a different tensor.
_COPY_ULPS = 64


def row_bounds(rows: int, world_size: int, unit: int = 1) -> list[tuple[int, int]]:
    """``(start, stop)`` of each rank's rows: blocks of whole ``unit``-row groups, sizes differing by at most one group.

    Every row of a kernel matrix costs the same (one reduction over all columns), so equal row
    counts are equal work, also for the symmetric :math:`K(X, X)`.
    """
    base, extra = divmod(rows // unit, world_size)
    bounds, start = [], 0
    for rank in range(world_size):
        stop = start + (base + (rank < extra)) * unit
        bounds.append((start, stop))
        start = stop
    return bounds


def _weights(n: int, like: Tensor) -> Tensor:
    # Position-dependent weights, so that a permutation of rows changes the checksum.
    return torch.linspace(1.0, 2.0, n, dtype=like.dtype, device=like.device)


def gather_rows(local: Tensor, rhs: Tensor, bounds: Sequence[tuple[int, int]], group: dist.ProcessGroup) -> Tensor:
    """Concatenate every rank's ``(..., rows_r, C)`` block along the rows, in rank order.

    Each rank appends a checksum of its right-hand side ``rhs`` (two rows: a weighted sum and a
    weighted sum of absolute values per column) to its padded block, so one ``all_gather``
    carries both the result and the proof that all ranks multiplied the same ``rhs``; the ranks
    all raise together if not (a rank that went its own way would otherwise hang the others or
    mix rows of different products).
    """
    counts = [stop - start for start, stop in bounds]
    batch, c = local.shape[:-2], local.shape[-1]
    w = _weights(rhs.shape[-2], rhs).unsqueeze(-1)
    check = torch.stack([(rhs * w).sum(-2), (rhs.abs() * w).sum(-2)], dim=-2).to(local.dtype)
    pad = local.new_zeros(*batch, max(counts) - local.shape[-2], c)
    payload = torch.cat([local, pad, check.expand(*batch, 2, c)], dim=-2).contiguous()
    parts = [torch.empty_like(payload) for _ in counts]
    dist.all_gather(parts, payload, group=group)
    checks = torch.stack([p[..., -2:, :] for p in parts])
    tol = math.sqrt(torch.finfo(rhs.dtype).eps) * checks[0, ..., 1, :]
    differ = [r for r in range(len(parts)) if bool(((checks[r, ..., 0, :] - checks[0, ..., 0, :]).abs() > tol).any())]
    if differ:
        raise RuntimeError(
            f"lazykern.distributed: ranks {differ} multiplied the sharded operator by a different right-hand side "
            "than rank 0. Every rank must run the same computation on the same data: seed every rank "
            "identically (torch.manual_seed) before random probes, solves or training steps"
        )
    return torch.cat([p[..., :n, :] for p, n in zip(parts, counts)], dim=-2)


def all_reduce_sum(tensors: Sequence[Tensor], group: dist.ProcessGroup) -> list[Tensor]:
    """Sum each tensor over the ranks, in one ``all_reduce`` of their concatenation."""
    if not tensors:
        return []
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    return [part.reshape(t.shape).to(t.dtype) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def _describe(named: Sequence[tuple[str, Tensor]], shape: torch.Size) -> list[str]:
    return [f"operator shape {tuple(shape)}"] + [f"{n}: shape {tuple(t.shape)}, {t.dtype}" for n, t in named]


def check_same_on_all_ranks(named: Sequence[tuple[str, Tensor]], shape: torch.Size, group: dist.ProcessGroup) -> None:
    """Raise ``ValueError`` on every rank unless all ranks hold the same tensors (structure, shapes, dtypes, values).

    Two tiny ``all_gather`` calls: a hash of the structure (names, shapes, dtypes), then, per
    tensor, a position-weighted float64 checksum of its values and of their absolute values.
    Values agree when the checksums differ by less than 64 ulps (of the tensor's dtype) of the
    absolute checksum: copies of the same data pass, a different subset, order, seed or
    hyperparameter does not.
    """
    device = named[0][1].device if named else torch.device("cpu")
    description = _describe(named, shape)
    digest = int.from_bytes(hashlib.sha256("\n".join(description).encode()).digest()[:6], "big")  # exact in float64
    heads = [torch.empty(1, dtype=torch.float64, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(heads, torch.tensor([float(digest)], dtype=torch.float64, device=device), group=group)
    if any(bool(h != heads[0]) for h in heads):
        everyone: list = [None] * len(heads)
        dist.all_gather_object(everyone, description, group=group)
        lines = []
        for rank, theirs in enumerate(everyone[1:], start=1):
            diff = [f"{a!r} on rank 0 vs {b!r}" for a, b in zip(everyone[0], theirs) if a != b]
            if len(theirs) != len(everyone[0]):
                diff.append(f"{len(everyone[0]) - 1} tensors on rank 0 vs {len(theirs) - 1}")
            if diff:
                lines.append(f"rank {rank}: " + "; ".join(diff))
        raise ValueError(
            "lazykern.distributed.shard: ranks disagree on the operator's shapes or dtypes ("
            + " | ".join(lines)
            + "); every rank must pass the same operator (same data, same kernel)"
        )
    with torch.no_grad():
        sums = []
        for _, t in named:
            v = t.detach().reshape(-1).to(torch.float64)
            w = _weights(v.numel(), v)
            sums.append(torch.stack([(v * w).sum(), (v.abs() * w).sum()]))
        local = torch.stack(sums) if sums else torch.zeros(0, 2, dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in heads]
    dist.all_gather(gathered, local.contiguous(), group=group)
    ulps = torch.tensor(
        [_COPY_ULPS * torch.finfo(t.dtype).eps if t.dtype.is_floating_point else 0.0 for _, t in named],
        dtype=torch.float64,
        device=device,
    )
    tol = ulps * gathered[0][:, 1]
    problems = []
    for rank, theirs in enumerate(gathered[1:], start=1):
        for i in ((theirs[:, 0] - gathered[0][:, 0]).abs() > tol).nonzero().flatten().tolist():
            name, t = named[i]
            problems.append(f"rank {rank} holds different values of {name} (shape {tuple(t.shape)}, {t.dtype})")
    if problems:
        raise ValueError(
            "lazykern.distributed.shard: ranks disagree on the operator's values: " + "; ".join(problems)
            + ". Every rank must build the operator from the same data and hyperparameters "
            "(same files and subset, same seed, same state_dict); kernel inputs already carry "
            "transforms such as the division by lengthscales"
        )
