"""Every training point on a CPU: the large-N recipe against GPyTorch's SVGP given the same wall-clock time.

For each dataset and split, in the same run, each in a fresh subprocess under an address-space
limit (``--memory-gb``, 8 by default):

1. ``lazykern uci NAME --split S --json FILE``: the command as a user runs it, with no other flag —
   on a CPU, the large-N recipe on all training points (``docs/large_n.rst``); its wall time from
   start to exit and its peak resident memory (``ru_maxrss`` of the child) are recorded;
2. GPyTorch's SVGP as its examples write it: 1,024 inducing points learned from a random subset
   of the training points, ``ScaleKernel(MaternKernel(nu=1.5, ard_num_dims=d))``, a Cholesky
   variational distribution, ``VariationalELBO``, Adam at lr 0.01 on batches of 1,024, float32,
   trained for as many epochs as fit in the wall time the recipe took on the same split (data
   loading and prediction included in neither budget's training), then predicting the test set.

Test RMSE and NLPD in standardized units (the targets standardized by the training split's mean
and standard deviation, as ``lazykern.data.load_uci`` does). Wang et al.'s exact GP and SVGP
(NeurIPS 2019; ARD, 64 % of each dataset for training) are cited beside them in the results page.

Usage::

    python benchmarks/uci_full.py                                   # six datasets, splits 0-2
    python benchmarks/uci_full.py --datasets kin40k --splits 0      # one run
    python benchmarks/uci_full.py --kernels dpa-matern52            # another lazykern kernel as well

Data: ``--data-dir``, else ``$LAZYKERN_DATA``, else ``../shared/uci``. Appends one JSON record per
run to ``benchmarks/results/uci-full.jsonl`` and rewrites ``uci-full.md`` from all records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DATASETS = ("pol", "elevators", "bike", "kin40k", "protein", "keggdirected")

#: Wang, Pleiss, Gardner, Tyree, Weinberger & Wilson, "Exact Gaussian processes on a million data
#: points", NeurIPS 2019, Table 1: test RMSE of the exact GP (ARD, trained on 64 % of each dataset)
#: and of SVGP (1,024 inducing points), in standardized units.
WANG_EXACT = {"pol": 0.088, "elevators": 0.399, "bike": 0.043, "kin40k": 0.080, "protein": 0.511, "keggdirected": 0.083}
WANG_SVGP = {"pol": 0.109, "elevators": 0.388, "bike": 0.077, "kin40k": 0.240, "protein": 0.613, "keggdirected": 0.105}

SVGP_CHILD = r"""
import json, math, sys, time
import torch, gpytorch
from lazykern.data import load_uci

spec = json.loads(sys.argv[1])
torch.manual_seed(spec["seed"])
data = load_uci(spec["dataset"], split=spec["split"], data_dir=spec["data_dir"], dtype=torch.float32)
x, y, tx, ty = data.train_x, data.train_y, data.test_x, data.test_y

class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing):
        distribution = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[0])
        strategy = gpytorch.variational.VariationalStrategy(self, inducing, distribution, learn_inducing_locations=True)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=x.shape[1]))

    def forward(self, inputs):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(inputs), self.covar_module(inputs))

start = time.perf_counter()
model = SVGP(x[torch.randperm(x.shape[0])[:1024]].clone())
likelihood = gpytorch.likelihoods.GaussianLikelihood()
model.train(); likelihood.train()
optimizer = torch.optim.Adam([{"params": model.parameters()}, {"params": likelihood.parameters()}], lr=0.01)
mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=1024, shuffle=True)
epochs = steps = 0
while time.perf_counter() - start < spec["seconds"]:
    for xb, yb in loader:
        optimizer.zero_grad()
        (-mll(model(xb), yb)).backward()
        optimizer.step()
        steps += 1
        if time.perf_counter() - start >= spec["seconds"]:
            break
    epochs += 1
train_seconds = time.perf_counter() - start
model.eval(); likelihood.eval()
with torch.no_grad():
    means, variances = [], []
    for xb in tx.split(1024):
        out = likelihood(model(xb))
        means.append(out.mean); variances.append(out.variance)
    mean, var = torch.cat(means), torch.cat(variances)
rmse = float((mean - ty).square().mean().sqrt())
nlpd = float((0.5 * torch.log(2 * math.pi * var) + 0.5 * (ty - mean).square() / var).mean())
print("RESULT " + json.dumps({"rmse": rmse, "nlpd": nlpd, "train_seconds": train_seconds, "epochs": epochs, "steps": steps,
                              "n_train": x.shape[0], "n_test": tx.shape[0]}))
"""


def _limited(memory_gb: float):
    """A ``preexec_fn`` capping the child's address space, so that a peer that would exhaust memory
    fails alone."""
    def limit() -> None:
        cap = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return limit


#: Runs a command and reports its peak resident memory: a wrapper process of its own, whose
#: ``RUSAGE_CHILDREN`` is that one command's (this process's would be the largest of all so far).
_PEAK = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
         "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
         "sys.exit(p.returncode)")


def _child(command: list[str], memory_gb: float, env: dict) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``command``; its completed process, wall seconds and peak RSS in MB."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _PEAK, *command], capture_output=True, text=True, env=env,
                          preexec_fn=_limited(memory_gb))
    wall = time.perf_counter() - start
    peaks = [line.split()[1] for line in proc.stderr.splitlines() if line.startswith("PEAK_RSS_KB ")]
    return proc, wall, int(peaks[-1]) / 1024 if peaks else float("nan")


def run_lazykern(dataset: str, split: int, kernel: str | None, args: argparse.Namespace, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        command = [sys.executable, "-m", "lazykern", "uci", dataset, "--split", str(split), "--data-dir", args.data_dir,
                   "--json", str(out), "--quiet", *(["--kernel", kernel] if kernel else [])]
        proc, wall, peak = _child(command, args.memory_gb, env)
        if proc.returncode or not out.exists():
            return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1], "wall_seconds": wall}
        record = json.loads(out.read_text())
    keep = ("kernel", "n_train", "n_test", "d", "rmse", "nlpd", "train_seconds", "predict_seconds", "interventions",
            "num_projections", "recipe")
    return {**{k: record.get(k) for k in keep}, "wall_seconds": wall, "peak_rss_mb": peak}


def run_svgp(dataset: str, split: int, seconds: float, args: argparse.Namespace, env: dict) -> dict:
    spec = {"dataset": dataset, "split": split, "data_dir": args.data_dir, "seconds": seconds, "seed": 0}
    proc, wall, peak = _child([sys.executable, "-W", "ignore", "-c", SVGP_CHILD, json.dumps(spec)], args.memory_gb, env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1], "wall_seconds": wall}
    return {**json.loads(lines[-1][len("RESULT "):]), "wall_seconds": wall, "peak_rss_mb": peak}


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def _data_dir(given: str | None) -> str:
    for candidate in (given, os.environ.get("LAZYKERN_DATA"), ROOT.parent / "shared" / "uci"):
        if candidate and (Path(candidate) / "pol").is_dir():
            return str(candidate)
    raise SystemExit("benchmarks/uci_full.py: no UCI data under --data-dir, $LAZYKERN_DATA or ../shared/uci")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--splits", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--kernels", nargs="*", default=[], help="lazykern kernels to run besides the recipe's default")
    parser.add_argument("--memory-gb", type=float, default=8.0)
    parser.add_argument("--data-dir")
    args = parser.parse_args()
    args.data_dir = _data_dir(args.data_dir)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}
    RESULTS.mkdir(exist_ok=True)
    machine = f"{_cpu()}, {os.cpu_count()} cores"
    for dataset in args.datasets:
        for split in args.splits:
            for kernel in [None, *args.kernels]:
                date = time.strftime("%Y-%m-%d", time.gmtime())
                record = {"dataset": dataset, "split": split, "date": date, "machine": machine,
                          "torch": __import__("torch").__version__,
                          "lazykern": run_lazykern(dataset, split, kernel, args, env)}
                if kernel is None:
                    budget = record["lazykern"]["wall_seconds"]
                    record["svgp"] = run_svgp(dataset, split, budget, args, env)
                print(json.dumps(record), flush=True)
                with open(RESULTS / "uci-full.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
    write_pages()


def _number(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"  # an en dash: a lone "-" is a bullet in reST


def rows(records: list[dict]) -> list[list[str]]:
    """One row per run (the latest record of each dataset, split and kernel), header first."""
    latest = {(r["dataset"], r["split"], r["lazykern"].get("kernel")): r for r in records}
    table = [["dataset", "split", "N", "kernel", "RMSE", "NLPD", "wall", "peak RSS", "SVGP RMSE", "SVGP NLPD",
              "SVGP epochs", "machine, date"]]
    for r in sorted(latest.values(), key=lambda r: (DATASETS.index(r["dataset"]), r["split"])):
        lk, sv = r["lazykern"], r.get("svgp") or {}
        where = f"{r['machine']}, {r['date']}"
        if "error" in lk:
            table.append([r["dataset"], str(r["split"]), "", "", f"failed: {lk['error']}", "",
                          f"{lk['wall_seconds']:.0f} s", "", "", "", "", where])
            continue
        svgp = ([_number(sv["rmse"], 4), _number(sv["nlpd"], 3), str(sv["epochs"])] if "rmse" in sv
                else ([f"failed: {sv['error']}", "", ""] if sv else ["–", "–", "–"]))
        table.append([r["dataset"], str(r["split"]), f"{lk['n_train']:,}", lk["kernel"], _number(lk["rmse"], 4),
                      _number(lk["nlpd"], 3), f"{lk['wall_seconds']:.0f} s", f"{lk['peak_rss_mb']:.0f} MB", *svgp,
                      where])
    return table


def means(records: list[dict]) -> list[list[str]]:
    """Per dataset, the mean test RMSE over the splits run (the recipe's default kernel, and SVGP in
    the same runs) beside Wang et al.'s exact GP and SVGP, header first."""
    table = [["dataset", "splits", "recipe RMSE", "SVGP RMSE (same time)", "Wang et al. exact GP", "Wang et al. SVGP",
              "median wall"]]
    latest = {(r["dataset"], r["split"]): r for r in records if "svgp" in r}  # the default kernel's runs
    for dataset in DATASETS:
        runs = [r for (name, _), r in sorted(latest.items()) if name == dataset and "rmse" in r["lazykern"]]
        if not runs:
            continue
        ours = sum(r["lazykern"]["rmse"] for r in runs) / len(runs)
        svgp = [r["svgp"]["rmse"] for r in runs if "rmse" in (r.get("svgp") or {})]
        walls = sorted(r["lazykern"]["wall_seconds"] for r in runs)
        table.append([dataset, ", ".join(str(r["split"]) for r in runs), f"{ours:.4f}",
                      f"{sum(svgp) / len(svgp):.4f}" if svgp else "–", f"{WANG_EXACT[dataset]:.3f}",
                      f"{WANG_SVGP[dataset]:.3f}", f"{walls[len(walls) // 2] / 60:.1f} min"])
    return table


INTRO = ("`python benchmarks/uci_full.py`: each run in its own subprocess under an 8 GB address-space limit. Test "
         "RMSE / NLPD in standardized units (NLPD \"–\" where the variance check withheld it); wall time of the whole "
         "command (data loading, training, prediction, variance check); SVGP (GPyTorch, 1,024 inducing points, ARD "
         "Matérn-3/2, Adam 0.01, batches of 1,024) trained for the recipe's wall time on the same split. Wang et al. "
         "(NeurIPS 2019) trained on 64 % of each dataset, one V100; our splits train on 90 %.")


def markdown(records: list[dict]) -> str:
    """The results page: the means over splits against Wang et al., then one row per run."""
    def md(table: list[list[str]]) -> list[str]:
        return ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])] + [
            "| " + " | ".join(row) + " |" for row in table[1:]]
    return "\n".join(["# Every training point on a CPU: the large-N recipe against SVGP (same wall-clock time)", "",
                      INTRO, "", *md(means(records)), "", *md(rows(records)), ""])


def rst(records: list[dict]) -> str:
    """The same tables for ``docs/uci_full.inc`` (included by ``docs/uci.rst``)."""
    def table(cells: list[list[str]]) -> list[str]:
        lines = [".. list-table::", "   :header-rows: 1", ""]
        for row in cells:
            lines += ["   * - " + (row[0] or " ")] + [f"     - {cell or ' '}" for cell in row[1:]]
        return lines + [""]
    intro = INTRO.replace("`python benchmarks/uci_full.py`", "``python benchmarks/uci_full.py``")
    return "\n".join([intro, "", *table(means(records)), *table(rows(records))])


def write_pages() -> None:
    """Rewrite the results page and the docs fragment from every record so far."""
    records = [json.loads(line) for line in open(RESULTS / "uci-full.jsonl")]
    (RESULTS / "uci-full.md").write_text(markdown(records))
    (ROOT / "docs" / "uci_full.inc").write_text(rst(records))


if __name__ == "__main__":
    main()
