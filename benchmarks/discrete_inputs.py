"""Binary and categorical inputs: the regression recipe with and without its lengthscale floor
(:func:`lazykern.regression.floor_discrete_lengthscales`), in one run, on UCI bike.

"Before" is the recipe as it was: the kernel built by :func:`~lazykern.regression.make_kernel` and
started by :func:`~lazykern.regression.initialize`, handed to :func:`~lazykern.regression.fit_evaluate`
as a module (used as it is). "After" names the kernel, which adds the floor. Everything else is the
``lazykern uci`` recipe: float32 (L-BFGS then refined in float64), exact Cholesky up to 2,000 points,
torch on one thread. Reported per run: test RMSE and NLPD (standardized), the final training loss,
training seconds, what the recipe had to step in for, and the learned lengthscales of the binary
and categorical inputs with their floors.

Usage::

    LAZYKERN_DATA=/path/to/uci python benchmarks/discrete_inputs.py --splits 0 2 --kernels oak additive-rbf
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from additive import machine  # noqa: E402  (one machine description for the benchmarks)

from lazykern.data import load_uci  # noqa: E402
from lazykern.regression import discrete_columns, fit_evaluate, initialize, make_kernel  # noqa: E402
from lazykern.regression.model import DISCRETE_FLOOR  # noqa: E402


def lengthscales(model) -> list[float]:
    kernel = model.covar_module
    for name, value in kernel.named_modules():
        if getattr(value, "has_lengthscale", False) and value.lengthscale.shape[-1] > 1:
            return value.lengthscale.detach().reshape(-1).tolist()
    raise ValueError("no per-input lengthscales")


def run(data, kernel: str, floored: bool, seed: int) -> dict:
    torch.manual_seed(seed)
    if floored:
        chosen = kernel
    else:
        chosen = make_kernel(kernel, data.d)
        initialize(chosen, data.d)
    result = fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=chosen, y_scale=data.y_std,
                          max_cholesky_size=2000, analyze=False, progress=False)
    return {"kernel": kernel, "split": data.split, "floor": floored, "rmse": result.rmse, "nlpd": result.nlpd,
            "final_loss": result.final_loss, "train_seconds": result.train_seconds,
            "evaluations": result.evaluations, "converged": result.converged,
            "interventions": result.interventions, "lengthscales": lengthscales(result.model)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="bike")
    parser.add_argument("--splits", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--kernels", nargs="+", default=["oak", "additive-rbf"])
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "discrete-inputs")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    meta = {**machine(), "date": datetime.date.today().isoformat(),
            "command": "python benchmarks/discrete_inputs.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows, floors = [], {}
    for split in args.splits:
        data = load_uci(args.dataset, split, n_train=args.n_train, seed=0, dtype=torch.float32)
        floors[split] = {c: DISCRETE_FLOOR * gap for c, gap in discrete_columns(data.train_x).items()}
        for kernel in args.kernels:
            for floored in (False, True):
                rows.append(run(data, kernel, floored, seed=0))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "lengthscales"}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"machine": meta, "floors": floors, "rows": rows}, indent=1))
    lines = [
        f"Machine: {meta['cpu']}, {meta['cores']} cores (torch on 1 thread, load average at start "
        f"{meta['load_average_at_start'][0]:.1f}, shared with other jobs: times are indicative); torch "
        f"{meta['torch']}; {meta['date']}.",
        f"Command: `{meta['command']}`. {args.dataset}, n_train = {args.n_train} (seed 0), all test points, float32; "
        "the `lazykern uci` recipe with and without the lengthscale floor of binary and categorical inputs.",
        "",
        "| kernel | split | floor | test RMSE | test NLPD | final loss | train (s) | interventions | "
        "smallest discrete lengthscale / its floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        floor = floors[row["split"]]
        ratios = {c: row["lengthscales"][c] / f for c, f in floor.items()}
        low = min(ratios, key=ratios.get)
        lines.append(
            f"| {row['kernel']} | {row['split']} | {'yes' if row['floor'] else 'no'} | {row['rmse']:.4f} | "
            f"{row['nlpd']:.3f} | {row['final_loss']:.3f} | {row['train_seconds']:.0f} | "
            f"{'; '.join(row['interventions']) or '-'} | x{low}: {row['lengthscales'][low]:.3g} / {floor[low]:.3g} |"
        )
    lines += ["", "Discrete columns and floors by split (column: floor): "
              + "; ".join(f"split {s}: " + ", ".join(f"x{c}: {f:.3g}" for c, f in fl.items()) for s, fl in floors.items())]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
