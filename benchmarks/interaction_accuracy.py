"""Float32 accuracy of interaction orders: Newton–Girard power sums vs the summation recurrence.

    python benchmarks/interaction_accuracy.py

For D in (8, 20, 32, 64) and R = D, draws 2,000 vectors z of per-dimension kernel values in four
regimes (uniform in (0, 1]; nearby points, z in (0.99, 1]; RBF values of distant points, down to
1e-20; signed OAK-like values in (-0.2, 1]) and compares, in float32, the normalized elementary
symmetric polynomials e_r / C(D, r) from

* ``newton-girard``: the power sums p_m and the Newton–Girard recursion (GPyTorch's algorithm);
* ``newton-girard z/D``: the same on z / D, rescaled back (the textbook fix for overflow);
* ``recurrence``: :func:`lazykern.formulas.interactions.elementary_symmetric`, lazykern's,

against the recurrence in float64. The error of order r is measured relative to
e_r(|z|) / C(D, r) (the sum of the absolute values of the terms: the best a float32 sum of them
can do), maximum over pairs and orders whose scale is in float32's normal range (smaller values
underflow to zero in float32 whatever the algorithm). Writes ``benchmarks/results/interaction_accuracy.{json,md}``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from lazykern.formulas.interactions import elementary_symmetric

RESULTS = Path(__file__).resolve().parent / "results"
FLOAT32_TINY = torch.finfo(torch.float32).tiny


def newton_girard(z: torch.Tensor, max_degree: int) -> torch.Tensor:
    """Normalized e_1..e_R from power sums (the recursion of Duvenaud et al. and GPyTorch)."""
    d = z.shape[-1]
    p = [None] + [(z**m).sum(-1) for m in range(1, max_degree + 1)]
    e = [torch.ones_like(p[1])]
    for r in range(1, max_degree + 1):
        e.append(sum((-1) ** (m - 1) * e[r - m] * p[m] for m in range(1, r + 1)) / r)
    binom = torch.tensor([math.comb(d, r) for r in range(1, max_degree + 1)], dtype=z.dtype)
    return torch.stack(e[1:], -1) / binom


def newton_girard_scaled(z: torch.Tensor, max_degree: int) -> torch.Tensor:
    d = z.shape[-1]
    powers = torch.tensor([float(d) ** r for r in range(1, max_degree + 1)], dtype=z.dtype)
    return newton_girard(z / d, max_degree) * powers


METHODS = {
    "newton-girard": newton_girard,
    "newton-girard z/D": newton_girard_scaled,
    "recurrence": elementary_symmetric,
}


def regimes(n: int, d: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    u = lambda: torch.rand(n, d, dtype=torch.float64, generator=generator)  # noqa: E731
    return {
        "uniform (0, 1]": 1 - u(),
        "nearby (0.99, 1]": 1 - 0.01 * u(),
        "distant RBF": torch.exp(-0.5 * (3 * u()) ** 2 * 10),
        "signed (-0.2, 1]": 1 - 1.2 * u(),
    }


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    records = []
    for d in (8, 20, 32, 64):
        for regime, z in regimes(2000, d, generator).items():
            scale = elementary_symmetric(z.abs(), d)
            truth = elementary_symmetric(z, d)
            for method, fn in METHODS.items():
                with torch.no_grad():
                    out = fn(z.float(), d).double()
                err = ((out - truth).abs() / scale.clamp_min(1e-300)).nan_to_num(nan=math.inf)
                # Below float32's normal range every method returns zero or denormals: not a rounding error.
                err = torch.where(scale > FLOAT32_TINY, err, 0)
                records.append({"d": d, "regime": regime, "method": method, "max_rel_error": err.max().item()})
                print(f"D={d:2d} {regime:18s} {method:18s} {records[-1]['max_rel_error']:.1e}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "interaction_accuracy.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = ["# Float32 accuracy of interaction orders (R = D)", "",
             "Largest error of e_r / C(D, r) over 2,000 random pairs and all orders r, relative to e_r(|z|) / C(D, r); "
             "reference: the recurrence in float64; orders that underflow float32 (scale < 1.2e-38) excluded. "
             "`inf`: overflow or NaN.", "",
             "| D | regime | " + " | ".join(METHODS) + " |", "|---|---|" + "---|" * len(METHODS)]
    for d in (8, 20, 32, 64):
        for regime in regimes(1, d, generator):
            cells = [next(r for r in records if (r["d"], r["regime"], r["method"]) == (d, regime, m))["max_rel_error"]
                     for m in METHODS]
            lines.append(f"| {d} | {regime} | " + " | ".join(f"{c:.1e}" for c in cells) + " |")
    (RESULTS / "interaction_accuracy.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
