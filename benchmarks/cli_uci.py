"""``lazykern uci pol --kernel additive-ng`` (the default kernel up to 2,000 training points; on a CPU both
kernels train on a 2,000-point subset of pol) against ``--kernel rbf-ard``, as a user runs them.

Both commands run in turn, each in its own process, with a warm cache (``lazykern precompile``
for both kernels first, untimed); reported: wall seconds of each whole command (start-up, data,
training, prediction, component analysis), their ratio, and what each JSON report says
(training seconds, loss evaluations, test RMSE). Goal (docs/performance.rst): the default within 2x of
``rbf-ard`` in the same run.

Usage::

    LAZYKERN_DATA=/path/to/uci python benchmarks/cli_uci.py     # writes benchmarks/results/cli-uci.*
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from additive import machine  # noqa: E402  (one machine description for the benchmarks)

KERNELS = ("additive-ng", "rbf-ard")


def run(dataset: str, kernel: str, folder: Path) -> dict:
    report = folder / f"{kernel}.json"
    start = time.perf_counter()
    subprocess.run(["lazykern", "uci", dataset, "--quiet", "--kernel", kernel, "--json", str(report)],
                   check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    data = json.loads(report.read_text())
    return {"kernel": kernel, "wall_s": wall, "train_s": data["train_seconds"], "evaluations": data["evaluations"],
            "rmse": data["rmse"], "n_train": data["n_train"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="pol")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli-uci")
    args = parser.parse_args(argv)
    subprocess.run(["lazykern", "precompile", "--kernel", *KERNELS, "--dataset", args.dataset],
                   check=True, capture_output=True)
    meta = machine()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(args.dataset, k, Path(tmp)) for k in KERNELS]
    ratio = rows[0]["wall_s"] / rows[1]["wall_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"machine": meta, "rows": rows, "ratio": ratio}, indent=1))
    lines = [
        f"Machine: {meta['cpu']}, {meta['cores']} cores; load average at start {meta['load_average_at_start'][0]:.1f}. "
        f"`lazykern uci {args.dataset} --kernel K` with a warm cache, float32, default settings.",
        "",
        "| command | wall (s) | training (s) | loss evaluations | test RMSE |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        flag = f" --kernel {r['kernel']}"
        lines.append(f"| `lazykern uci {args.dataset}{flag}` (n_train {r['n_train']}) | {r['wall_s']:.1f} | "
                     f"{r['train_s']:.1f} | {r['evaluations']} | {r['rmse']:.4f} |")
    lines += ["", f"Default over `rbf-ard`, same run: {ratio:.2f}x (goal <= 2x)."]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
