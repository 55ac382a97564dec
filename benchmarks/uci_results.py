"""Regenerate the "UCI results" tables: additive, interaction and full ARD kernels, 3 splits each.

    LAZYKERN_DATA=/path/to/uci_datasets python benchmarks/uci_results.py [--n-train 2000] [--splits 0 1 2]
    LAZYKERN_DATA=... python benchmarks/uci_results.py --full --datasets pol --kernels additive-ng rbf-ard

Every (dataset, split, kernel) run trains with :func:`lazykern.regression.fit_evaluate` (the recipe of
``lazykern uci``: dimension-aware initialization, L-BFGS to convergence on the exact path, Adam with
a plateau schedule on the conjugate-gradient path) in a fresh process, so peak memory is that run's
alone, on the same random training subset for every kernel. Each finished run appends one JSON
record to ``benchmarks/results/uci.jsonl``; a run already recorded with the same settings is
skipped (``--force`` repeats it), so an interrupted regeneration resumes where it stopped. After
every run the tables are rewritten: ``benchmarks/results/uci.md`` and ``docs/uci.rst`` (mean ± std
over splits). ``--render-only`` rewrites them from the records. ``--full`` uses every training
point (the "full training set" column; conjugate gradients above ``--max-cholesky`` points).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lazykern.kernel_names import TOLERANCES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RECORDS = RESULTS / "uci.jsonl"
DOCS = ROOT / "docs" / "uci.rst"
DATASETS = ("pol", "elevators", "bike", "kin40k", "protein", "keggdirected", "pumadyn32nm")
#: Training-subset size where it differs from ``--n-train`` (pumadyn32nm: the size at which GPyTorch's
#: defaults end at the mean predictor).
N_TRAIN = {"pumadyn32nm": 1500}
KERNELS = ("additive-rbf", "dpa-matern52", "additive-ng", "oak", "rbf-ard", "gpytorch-rbf-ard")
ADDITIVE_FAMILY = ("additive-rbf", "dpa-matern52", "additive-ng", "oak")
#: Cheapest first, so that an interrupted regeneration has the baselines.
RUN_ORDER = ("rbf-ard", "gpytorch-rbf-ard", "additive-rbf", "dpa-matern52", "oak", "additive-ng")
#: The datasets of the full-training-set tables: every kernel has a cell on each, its result or why
#: it was not run.
FULL_DATASETS = ("pol", "elevators", "bike", "kin40k", "protein", "keggdirected")
#: Why a kernel has no full-training-set run on a dataset (the cell says so): this benchmark's budget
#: is 30 minutes a full-set run on the 2-core CPU. ARD, Newton–Girard and OAK steps cost O(N^2) each
#: (per-step times measured on pol, N = 13,500; the other datasets have 1.1 to 3.3 times its points);
#: the first-order additive and projected kernels fit on pol (their training times there).
FULL_NOT_RUN = {
    "rbf-ard": "not run (O(N²) a step, 13 s on pol)",
    "gpytorch-rbf-ard": "not run (as rbf-ard)",
    "additive-ng": "not run (O(N² d) a step, 43 s on pol)",
    "oak": "not run (O(N² d) a step, 110 s on pol)",
    # the first-order additive and projected kernels have a record on every full set (a time or a timeout)
}
#: A run whose standardized test RMSE or NLPD exceeds these has diverged (the mean predictor scores
#: 1 and 1.42): its predictions broke down, so it is shown beside the mean ± std of the others, not
#: inside it (one such split made GPyTorch's elevators NLPD "1665562.187 ± 2884837.412").
DIVERGED_RMSE = 1.5
DIVERGED_NLPD = 10.0
#: Settings a run may resolve differently from what was asked (n_train capped by the data, max_degree
#: and tolerance defaulted): a record keeps what was asked under these names, what ran under the
#: setting's own. Records made before ``requested_tolerance`` existed hold the asked tolerance as
#: ``tolerance``.
REQUESTED = {"n_train": "requested_n_train", "max_degree": "requested_max_degree", "tolerance": "requested_tolerance"}
SETTINGS = ("n_train", "split", "seed", "dtype", "iters", "optimizer", "tolerance", "max_degree", "max_cholesky",
            "warm_start")


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def worker(job: dict) -> dict:
    """One run, in this (fresh) process: the record to append."""
    import torch

    from lazykern.data import load_uci
    from lazykern.regression import fit_evaluate

    torch.manual_seed(job["seed"])
    torch.set_flush_denormal(True)  # float32 denormals make CPU LAPACK ~10x slower
    data = load_uci(job["dataset"], split=job["split"], n_train=job["n_train"], seed=job["seed"],
                    dtype=getattr(torch, job["dtype"]))
    kernel = job["kernel"]
    result = fit_evaluate(data.train_x, data.train_y, data.test_x, data.test_y, kernel=kernel,
                          max_degree=job["max_degree"] if kernel in ("additive-ng", "oak") else None,
                          iters=job["iters"], optimizer=job["optimizer"], tolerance=job["tolerance"],
                          y_scale=data.y_std, max_cholesky_size=job["max_cholesky"],
                          warm_start_size=job.get("warm_start"), progress=False)
    record = result.to_dict()
    record.update({k: job.get(k) for k in ("dataset", "split", "seed", "optimizer", "max_cholesky", "warm_start", "full")})
    record["n_train"] = data.n_train
    record["machine"] = machine()
    record["love_checked"] = result.solver == "cg"
    record.update(requested(job))
    return record


def requested(job: dict) -> dict:
    """The :data:`REQUESTED` fields of a record of ``job``: what it asked for."""
    return {name: job[setting] for setting, name in REQUESTED.items()}


def run_one(job: dict, timeout: float) -> dict:
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**job, "error": f"did not finish within {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {**job, "error": lines[-1] if lines else f"exit status {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def key(record: dict) -> tuple:
    return (record["dataset"], record["kernel"], record["split"], record["full"],
            *(record.get(REQUESTED.get(k, k), record.get(k)) for k in SETTINGS))


def load_records() -> list[dict]:
    if not RECORDS.exists():
        return []
    return [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]


def _mean_std(values: list[float], digits: int = 3) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def reason(error: str) -> str:
    """A failed run's error in a few words: the exception's name and what it says, e.g.
    ``NotPSDError at jitter 1e-04``."""
    head, _, detail = error.partition(": ")
    name = head.rsplit(".", 1)[-1] if re.fullmatch(r"[\w.]+", head) else ""
    jitter = re.search(r"jitter up to ([0-9.eE+-]+)", detail)
    if jitter:
        return f"{name} at jitter {float(jitter.group(1).rstrip('.')):.0e}"
    nans = re.search(r"(\d+) of (\d+) elements", detail)
    if nans:
        return f"{name}: Cholesky input {100 * int(nans.group(1)) / int(nans.group(2)):.2g}% NaN"  # (400 of 10^6: 0.04%)
    return name or error[:60]


def diverged(record: dict) -> bool:
    """Whether a successful run's predictions broke down (see :data:`DIVERGED_RMSE`)."""
    withheld = math.isnan(record["nlpd"])  # LOVE's variances failed fit_evaluate's check: not a breakdown
    return not (record["rmse"] <= DIVERGED_RMSE and (withheld or record["nlpd"] <= DIVERGED_NLPD))


def nlpd_shown(record: dict) -> bool:
    """Whether a run's NLPD is one to show: on the Cholesky path, or on the conjugate-gradient path by
    a run whose LOVE variances :func:`lazykern.regression.fit_evaluate` checked and found right. Runs
    made before that check (no ``love_checked``) predicted with LOVE at rank 100 unchecked, which on
    all of elevators gave variances of about 60 where the exact ones are 0.11."""
    if record.get("solver") == "cholesky":
        return True
    return bool(record.get("love_checked")) and not math.isnan(record["nlpd"])


def latest(records: list[dict]) -> list[dict]:
    """The latest record of each run (one re-run with ``--force``, or measured by two processes); a
    failure does not replace a success. A full-training-set run replaces every earlier one of its
    kernel, dataset and split, whatever its settings (one cell each; earlier ones were made under
    earlier recipes or engines)."""
    chosen = {}
    for r in records:
        run = (r["dataset"], r["kernel"], r["split"], True) if r["full"] else key(r)
        if "error" not in r or run not in chosen:
            chosen[run] = r
    return list(chosen.values())


def summarize(records: list[dict], full: bool) -> list[dict]:
    """One row per dataset: per kernel, the RMSEs, NLPDs, times, memory of the successful runs of
    :func:`latest` that did not diverge, and the splits that failed (with :func:`reason`) or diverged."""
    records = latest(records)
    rows = []
    for dataset in DATASETS:
        runs = [r for r in records if r["dataset"] == dataset and r["full"] == full]
        if not runs and not (full and dataset in FULL_DATASETS):
            continue
        row = {"dataset": dataset, "kernels": {}}
        ok = [r for r in runs if "error" not in r]
        if ok:
            row["shape"] = f"{ok[0]['n_train']} / {ok[0]['n_test']} / {ok[0]['d']}"
        for kernel in KERNELS:
            mine = [r for r in runs if r["kernel"] == kernel]
            good = [r for r in mine if "error" not in r and not diverged(r)]
            if not mine:
                if full:
                    row["kernels"][kernel] = {"not_run": FULL_NOT_RUN.get(kernel, "not run")}
                continue
            row["kernels"][kernel] = {
                "rmse": [r["rmse"] for r in good], "nlpd": [r["nlpd"] for r in good if nlpd_shown(r)],
                "nlpd_not_shown": [r["split"] for r in good if not nlpd_shown(r)],
                # cost: every run that finished, diverged or not
                "seconds": [r["train_seconds"] for r in mine if "error" not in r],
                "memory": [r["peak_memory_mb"] for r in mine if "error" not in r],
                "failed": [(r["split"], reason(r["error"])) for r in mine if "error" in r],
                "diverged": [(r["split"], r["rmse"], r["nlpd"]) for r in mine if "error" not in r and diverged(r)],
                "order_shares": [r["order_shares"] for r in good if r.get("order_shares")],
                "warm_starts": sorted({r["warm_start_size"] for r in good if r.get("warm_start_size")}),
                "machines": sorted({_machine(r) for r in mine if "error" not in r}),
            }
        rows.append(row)
    return rows


def verdict(row: dict) -> str:
    """Best additive-family mean RMSE over ARD RBF's (lazykern's), as a ratio."""
    ard = row["kernels"].get("rbf-ard", {}).get("rmse")
    family = {k: row["kernels"][k]["rmse"] for k in ADDITIVE_FAMILY if row["kernels"].get(k, {}).get("rmse")}
    if not ard or not family:
        return ""
    best = min(family, key=lambda k: statistics.mean(family[k]))
    ratio = statistics.mean(family[best]) / statistics.mean(ard)
    return f"{best} {ratio:.2f}" + (" ✓" if ratio <= 1.05 else " ✗")


def tables(records: list[dict]) -> dict[str, list[list[str]]]:
    out = {}
    for name, full in (("main", False), ("full", True)):
        rows = summarize(records, full)
        if not rows:
            continue
        kernels = [k for k in KERNELS if any(k in r["kernels"] for r in rows)]
        rmse = [["dataset", "n_train / n_test / d", *kernels, "best additive / ARD"]]
        nlpd = [["dataset", *kernels]]
        cost = [["dataset", *kernels]]
        for r in rows:
            cell = lambda k, f, digits=3: _fmt(r["kernels"].get(k), f, digits)  # noqa: E731
            rmse.append([r["dataset"], r.get("shape", ""), *(cell(k, "rmse") for k in kernels), verdict(r)])
            nlpd.append([r["dataset"], *(cell(k, "nlpd") for k in kernels)])
            cost.append([r["dataset"], *(_cost(r["kernels"].get(k), hardware=full) for k in kernels)])
        out[f"{name}-rmse"], out[f"{name}-nlpd"], out[f"{name}-cost"] = rmse, nlpd, cost
    shares = [["dataset", "kernel", "order shares (orders 1, 2, ...; mean over splits)"]]
    for r in summarize(records, False):
        for kernel in ("additive-ng", "oak"):
            found = r["kernels"].get(kernel, {}).get("order_shares")
            if found:
                mean = [statistics.mean(v) for v in zip(*found)]
                shares.append([r["dataset"], kernel, ", ".join(f"{v:.2f}" for v in mean)])
    if len(shares) > 1:
        out["shares"] = shares
    return out


def _fmt(entry: dict | None, field: str, digits: int) -> str:
    """mean ± std of the runs that neither failed nor diverged, then those that did, by split."""
    if entry is None:
        return ""
    if "not_run" in entry:
        return entry["not_run"]
    notes = [f"n={len(entry[field])}"] if 0 < len(entry[field]) < 3 else []
    if field == "rmse":
        notes += [f"from an exact fit on {size} points" for size in entry["warm_starts"]]
    column = {"rmse": 1, "nlpd": 2}[field]
    notes += [f"split {d[0]} diverged: {d[column]:.4g}" for d in entry["diverged"]]
    if field == "nlpd" and entry["nlpd_not_shown"]:
        notes.append("LOVE variances unchecked or off, split" + "s" * (len(entry["nlpd_not_shown"]) > 1) + " "
                     + ", ".join(map(str, entry["nlpd_not_shown"])))
    reasons = {}
    for split, why in entry["failed"]:
        reasons.setdefault(why, []).append(str(split))
    notes += [f"split{'s' if len(s) > 1 else ''} {', '.join(s)} failed: {why}" for why, s in reasons.items()]
    text = _mean_std(entry[field], digits) or ("not shown" if entry.get(f"{field}_not_shown") else "no run")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _cost(entry: dict | None, hardware: bool = False) -> str:
    if entry is None or "not_run" in entry:
        return "" if entry is None else "not run"
    if not entry["seconds"]:  # every run failed: say how
        return "; ".join(f"split {split}: {why}" for split, why in entry["failed"])
    where = f" ({'; '.join(entry['machines'])})" if hardware else ""
    return f"{statistics.mean(entry['seconds']):.0f} s / {max(entry['memory']):.0f} MB{where}"


def _machine(record: dict) -> str:
    """The hardware a record was measured on, in a few words (records made before it was recorded: said so)."""
    m = record.get("machine")
    return f"{m['cpu']}, {m['cores']} cores, {m['date']}" if m else "hardware not recorded"


def markdown(table: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    return lines + ["| " + " | ".join(row) + " |" for row in table[1:]]


def rst(table: list[list[str]]) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in table:
        lines.append("   * - " + (row[0] or " "))
        lines += [f"     - {cell or ' '}" for cell in row[1:]]
    return lines + [""]


CAPTIONS = {
    "main-rmse": "Test RMSE (standardized: 1.0 is the mean predictor), mean ± std over the splits. The last column "
                 "divides the best additive-family kernel's mean RMSE by lazykern's ARD RBF's (✓: within 5%). In "
                 "parentheses: how many runs the mean holds when fewer than three, the runs that failed (the "
                 "error's type and message, shortened) and those that diverged (test RMSE above "
                 f"{DIVERGED_RMSE:g} or NLPD above {DIVERGED_NLPD:g}: predictions that broke down, shown with their "
                 "value, outside the mean ± std).",
    "main-nlpd": "Test NLPD (standardized units; the mean predictor scores 1.42), mean ± std over the same runs.",
    "main-cost": "Training time (mean over splits; shared machine, indicative only) and peak resident memory of the "
                 "whole process (largest over splits).",
    "full-rmse": "Full training set (conjugate gradients and Lanczos quadrature on lazy matvecs above {cholesky} "
                 "points, Adam with the plateau stop, at most {iters} steps): test RMSE, split 0.",
    "full-nlpd": "Full training set: test NLPD where the predictive variances are known right (on the "
                 "conjugate-gradient path, LOVE's checked at 16 test points against the exact ones' bounds; runs "
                 "made before that check are not shown).",
    "full-cost": "Full training set: training time, peak memory and the hardware each run was measured on.",
    "shares": "Order shares: the share of the variance of the posterior mean in each interaction order "
              "(:doc:`interactions`, Component analysis; ``additive-ng``: variances of each order's posterior-mean "
              "term over the training inputs, which overlap; ``oak``: Sobol indices under the input measure).",
}


def describe(meta: dict, records: list[dict]) -> str:
    s, m = meta["settings"], meta["machine"]
    splits = sorted({r["split"] for r in records if not r["full"]}) or s["splits"]
    return (f"Splits {', '.join(map(str, splits))} of each dataset; a random subset of n_train = {s['n_train']} "
            f"training points ({', '.join(f'{k}: {v}' for k, v in N_TRAIN.items())}; seed {s['seed']}, the same "
            f"subset for every kernel), all test points; {s['dtype']}. One recipe for every kernel "
            f"(:func:`lazykern.regression.train`): lengthscales initialized at the square root of the number of "
            f"dimensions a kernel term multiplies, then {s['optimizer']} optimizer (L-BFGS on the exact Cholesky path, "
            f"at most {s['iters']} iterations, stopping when the loss changes by less than "
            f"{s['tolerance'] or TOLERANCES['lbfgs']:g}"
            f"{', a float32 model then refined in float64 until it converges again' if s['dtype'] == 'float32' else ''}); "
            f"``additive-ng`` and ``oak`` with max_degree = {s['max_degree'] or 'd (all orders, the default)'}. "
            f"Machine: "
            f"{m['cpu']}, {m['cores']} cores, shared with other jobs while measured (times are indicative), torch "
            f"{m['torch']}{'; the regeneration began ' + m['date'] if 'date' in m else ''}.")


def render(meta: dict, records: list[dict]) -> None:
    records = latest(records)  # the tables' runs: a replaced record's note no longer applies
    found = tables(records)
    full = [r for r in records if r["full"]]
    captions = {name: text.format(iters="/".join(sorted({str(r["iters"]) for r in full})) or "?",
                                  cholesky="/".join(sorted({str(r["max_cholesky"]) for r in full})) or "?")
                for name, text in CAPTIONS.items()}
    # what a record's "note" says about how it was measured (added by hand to the record)
    notes = [f"Note on {r['dataset']} / {r['kernel']} / split {r['split']}{' (full)' if r['full'] else ''}: {r['note']}"
             for r in records if r.get("note")]
    md = ["# UCI results", "", describe(meta, records), ""]
    for name, table in found.items():
        md += [captions[name], ""] + markdown(table) + [""]
    md += [f"* {n}" for n in notes] + ([""] if notes else [])
    md += ["Where the training recipe stepped in (a failed factorization) or stopped before converging:", ""]
    md += stepped_in(records) or ["(none)"]
    md += [""]
    (RESULTS / "uci.md").write_text("\n".join(md))
    text = ["UCI results", "===========", "", describe(meta, records), "",
            "Regenerate with ``python benchmarks/uci_results.py`` (raw records, one per run: "
            "``benchmarks/results/uci.jsonl``).", ""]
    for name, table in found.items():
        text += [captions[name], ""] + rst(table)
    text += [f"* {n}" for n in notes] + ([""] if notes else [])
    text += [READING.replace("{stepped_in}", "\n".join(stepped_in(records)) or "(none)"), "", EVERY_POINT]
    DOCS.write_text("\n".join(text))


def stepped_in(records: list[dict]) -> list[str]:
    """One line per run of the 3-split tables where the training recipe had to step in (a failed
    factorization: :func:`lazykern.regression.train`) or that stopped before it converged; records
    made before the recipe said so (no ``interventions`` field) are not listed."""
    lines = []
    for r in sorted(records, key=lambda r: (DATASETS.index(r["dataset"]), r["split"], KERNELS.index(r["kernel"]))):
        if r["full"] or "error" in r or "interventions" not in r:
            continue
        said = list(r["interventions"]) + ([] if r["converged"] else [f"not converged ({r['stop_reason']})"])
        if said:
            lines.append(f"* {r['dataset']} / split {r['split']} / ``{r['kernel']}``: {'; '.join(said)}.")
    return lines


#: The full-training-set table of the large-N recipe, written by ``benchmarks/uci_full.py``.
EVERY_POINT = """\
Every training point
--------------------

Every training point of each split, exact (no subset, no inducing points in the final model), on a
CPU: ``lazykern uci NAME`` with no flag, which takes the large-N recipe (:doc:`large_n`), against
GPyTorch's SVGP given the same wall-clock time in the same run.

.. include:: uci_full.inc
"""

READING = """\
Training that does not fail
---------------------------

The 2026-11 table (made with the recipe of that month) held 7 failed runs: ``NotPSDError``
(no Cholesky factor even with GPyTorch's jitter up to 1e-4) for ``additive-ng`` on bike split 2,
``oak`` on bike splits 0 and 2 and keggdirected split 1, GPyTorch's ARD on bike splits 1 and 2, and
``NanError`` for ``rbf-ard`` on pumadyn32nm split 0. The causes, found by re-running them: float32
rounding of a kernel matrix whose variance is large against the noise (bike's target is a function
of two of its inputs, below; its fits reach noise 4e-4 under an additive offset of variance 17,
a condition number beyond float32's 1e7), and OAK's high-order terms cancelling in float32
(keggdirected split 1 is not positive definite at the recipe's starting point in float32, and is in
float64). The recipe (:func:`lazykern.regression.train`) now goes back to the best hyperparameters it
evaluated and continues in float64 when an evaluation fails, and says so in the run's
``interventions`` (``lazykern uci`` prints them); a run that never fails takes no such step. The
runs below are where it stepped in, or stopped before converging.

{stepped_in}

Regenerating the table also found a silent error of the loader: an input that is constant over a
training subset but for a few rows of the file (elevators' columns 14 and 16, keggdirected's 3 and 7)
was divided by the rounding of its mean (a standard deviation of 3e-24), which made a test value
1e-4 away a standardized 2e18. On elevators split 2 that gave OAK a test NLPD of infinity and
GPyTorch's ARD a test RMSE of 2.1; such a column is now divided by 1.

After it was made, two OAK records showed every order share as NaN (bike split 2, protein split 2):
the Sobol indices' inner products overflowed, in float64, at an input 28.6 standard deviations out
at lengthscale 0.04 and at a lengthscale of 4e-150 (:doc:`interactions`). With that fixed, the
component analysis of every OAK record was recomputed from its recorded hyperparameters (its
``analysis_note`` says so); the 19 others agree with what they had recorded to 1e-8, but for
pol split 2, whose model stayed in float32 (its L-BFGS ran out of evaluations): order shares to
1.3e-5, first-order shares and total effects to 1.9e-4.

Training to convergence
-----------------------

The regeneration before this one (2026-12-02, recipe of e242d9a) moved the best additive-family RMSE
up on pol (0.1506 to 0.1512), elevators (0.4008 to 0.4011) and pumadyn32nm (0.2153 to 0.2159), with
no step of the recipe taken. Two causes, both of the optimizer: L-BFGS stopped when the loss changed
by less than 1e-4 per point between iterations, where it was still falling (pol split 1: -0.310
after 64 iterations; -0.324 after 193 at 1e-6, test RMSE 0.151 to 0.146), and float32 rounding of
the loss and its gradient ended line searches short of the optimum (pumadyn32nm split 0 stops at
-0.0475 in float32 whatever the tolerance, and goes on in float64 to -0.0543, RMSE 0.221 to 0.219).
The recipe now stops L-BFGS at 1e-6 (:data:`lazykern.kernel_names.TOLERANCES`) and refines a float32
model in float64 once its L-BFGS has converged. This table is the first made with it (2026-12-02, on
the 2-core Intel Xeon, mostly quiet): 102 of the 105 runs end at a training loss lower than, or within 1e-4 of, the loss
in the regeneration before (the 3 others: ARD on bike splits 0 and 1, by 0.007 and 0.013, below,
and GPyTorch's ARD on keggdirected split 2, by 2e-4); the float64 refinement took a median of 3
iterations (at most 171); the table's training time was about the same (38 against 37 minutes).

Best additive-family RMSE against the 2026-11 table (mean over splits; with its 7 failed runs,
bike's is the mean of splits 0 and 1): pol 0.1506 to 0.1503, elevators 0.4008 to
0.4007, kin40k 0.3156 to 0.3145, protein 0.7583 to 0.7546, keggdirected 0.1023 to 0.1006, pumadyn32nm
0.2153 to 0.2146; **bike 0.0538 to 0.0583 is worse** (0.0500 in the regeneration before). Bike has
no noise to fit: its target is the logarithm of the sum of two of its inputs, the casual and the
registered rental counts (columns 15 and 16): a least-squares fit of the standardized target on
:math:`\log(x_{15} + x_{16} + c)`, with :math:`c` making the smallest count 1, leaves a residual of
1.7e-5 of the target's standard deviation. Every kernel finds the two inputs: lengthscales of
0.03 to 0.2 on the registered count, the shortest a kernel has (OAK's are shorter still on the
binary inputs 7 and 9, which it collapses towards 0 on splits 0 and 2), while ARD's on the other
15 inputs run to thousands. The noise variance each learns (2e-4 to 3.5e-3) is its misfit, a
stationary kernel's, to a logarithm that bends most near zero counts. There a higher marginal likelihood is not a better
prediction, and an equal one can predict very differently: ARD on split 0 ends at a training loss
of -1.536 with test RMSE 0.076, the run before at -1.543 with 0.028. Newton–Girard on split 0 converges to a training
loss of -1.35 with noise variance 2e-4 and test RMSE 0.063, where the run before stopped early at
-1.15 with 2e-3 and 0.049 (the 2026-11 table's at -1.13 with 2e-3 and 0.054). BoTorch's noise prior
(:math:`\sigma^2 \sim \mathrm{LogNormal}(-4, 1)`) does not change that (splits 0-2: 0.063, 0.057,
0.057; measured on 2026-12-02, not part of the recipe): at 1,000 points the likelihood outweighs it.
The recorded numbers are the models': predictions recomputed in float64 from the recorded
hyperparameters give the recorded test RMSE to 9 digits (ARD and Newton–Girard on split 0, condition
numbers 3e7 and 1e7).

The recipe's choices
--------------------

The measurements behind the rules of :mod:`lazykern.regression` that no table above holds (split 0
unless said otherwise):

* **Dimension-aware lengthscales** (:func:`lazykern.regression.initialize`). GPyTorch's default
  lengthscale, 0.69, makes an ARD kernel in 32 dimensions start at :math:`e^{-66}` between any two
  standardized points, where the likelihood has no slope but towards "all noise": pumadyn32nm's ARD
  runs ended at the mean predictor from there.
* **The initial noise** (:data:`lazykern.regression.INITIAL_NOISE`). On pumadyn32nm (1,500 points,
  ARD RBF, L-BFGS) training from GPyTorch's default noise 0.69, or from 0.1, converges to the mean
  predictor (outputscale 1e-5, noise 1.0); from 0.01 it finds the fit.
* **All interaction orders** (:data:`lazykern.regression.DEFAULT_MAX_DEGREE`). On kin40k (1,000
  points, d = 8) orders 1..4 end at a training loss of 0.84 (test RMSE 0.42), all 8 orders at 0.55.
* **The top order's share** (:data:`lazykern.regression.TOP_ORDER_SHARE`). With equal order
  variances the likelihood was flat towards the interactions on pumadyn32nm: L-BFGS stopped after 4
  evaluations at the mean predictor (test RMSE 1.02, ARD 0.22). Test RMSE from equal variances / 0.9
  on the top order / 0.99 on it (float32; 1,500 points for pumadyn32nm, 1,000 for the others):
  pumadyn32nm 1.02 / 0.218 / 0.218 (ARD 0.224), pol 0.151 / 0.153 / 0.156 (ARD 0.160), keggdirected
  0.108 / 0.111 / 0.104 (ARD 0.101). 0.99 made the float32 demo's line search step into a matrix
  that was not positive definite; 0.9 did not.
* **Discrete inputs** (:data:`lazykern.regression.DISCRETE_MAX_LEVELS`,
  :func:`lazykern.regression.floor_discrete_lengthscales`). Bike's month has 12 values, its season and
  weather 4, its weekday 7, its hour (24) is continuous; without the floor OAK's lengthscales on
  bike's binary inputs drifted towards 0.
* **L-BFGS where the likelihood is exact** (``optimizer="auto"``). On a 4-dimensional toy problem
  (120 points, float64) L-BFGS converged in 35 loss evaluations to -0.617; Adam at lr 0.1 was at
  -0.553 after 2,000 steps and still improving (``benchmarks/recipe.py`` measures both on UCI data).
* **float64 on the conjugate-gradient path on a CPU**
  (:func:`lazykern.regression.trains_in_float64`). On kin40k (5,000 points, ``dpa-matern52`` with 64
  projections, at the hyperparameters of a 1,000-point warm start, Intel Xeon, one thread) a float32
  step with the default rank-15 pivoted-Cholesky preconditioner ran all 1,000 iterations and ended at
  a relative residual of 1.9 (the tolerance: 1), 21 s; the same solve on the matrix stored densely
  also stalled, at 0.02 against a tolerance of 0.01. In float64 the step converged at tolerance 0.01
  in 0.8 s, its loss 0.732 against the exact 0.726. A step on all 36,000 of kin40k's points took
  1.9 s in float64 against 1.6 s in float32 (the whole runs: :doc:`projected`).
* **The variance check's loose solves first**
  (:data:`lazykern.regression.prediction.VARIANCE_CHECK_SOLVES`). Where LOVE is far off a loose solve
  shows it: on kin40k (5,000 points, ``dpa-matern52``) LOVE gave 20.7 where the exact variance is
  below 0.076.

Reading the tables
------------------

``additive-rbf`` is the first-order additive kernel :math:`s \\sum_d w_d k(x_d, x'_d)`
(:class:`lazykern.kernels.AdditiveStructureKernel`): it cannot represent interactions between
inputs. ``additive-ng`` (:class:`lazykern.kernels.NewtonGirardAdditiveKernel`) adds every
interaction of up to ``max_degree`` inputs, each order with its own variance; ``oak``
(:class:`lazykern.kernels.OrthogonalAdditiveKernel`) does the same with components made orthogonal
to the input distribution, which makes its order shares Sobol indices (:doc:`interactions`).
``rbf-ard`` (lazykern's :class:`lazykern.kernels.RBFKernel`) and ``gpytorch-rbf-ard`` (GPyTorch's)
are the same full ARD RBF model evaluated by different code, and should agree up to optimization
noise. Every kernel is trained by the same recipe from the same initialization rule.

The full-training-set tables have a cell for every kernel on six datasets: its run, or why it was
not run. This benchmark gives a full-set run 30 minutes of the 2-core CPU. The first-order additive
and projected kernels fit it: on CPU tensors their products take the structured engine
(:doc:`structured`), :math:`O(N d)` a product after one sort instead of :math:`O(N^2 d)`. ARD,
Newton–Girard and OAK steps cost :math:`O(N^2)` or :math:`O(N^2 d)`: on pol (N = 13,500, d = 26)
about 13 s a training step for ARD RBF, 43 s for Newton–Girard over all 26 orders and 107-110 s for
OAK, with a peak resident memory near 1.7 GB (GPyTorch's ``AdditiveStructureKernel`` would hold
26 × 13,500² floats, 19 GB); the other datasets have 1.1 to 3.3 times pol's points. Their pol runs
were made earlier, under the recipe's 30-step plateau window, and stopped after 140 of their 200
steps (Newton–Girard to bound the run time, ARD at the same step to compare like with like; see the
notes): Newton–Girard 0.086 against ARD's 0.085 (their NLPDs, 0.14 and 0.08, came from LOVE
variances unchecked, see below). Both losses were still falling.

The first full-set run of ``additive-rbf`` on pol with the structured engine predicted with a test
RMSE of 6.03: in float32 the posterior mean's conjugate-gradient solve (prior variance 123 over noise
0.17) stopped at a relative residual of 1.83 after 1,000 iterations, of which ``linear_operator``
only warns; at the same hyperparameters float64 predicts with 0.54. :func:`lazykern.regression.fit_evaluate`
now repeats such a prediction in float64 and says so in the run's ``interventions``; the table's run
is the one made after that change. The mean's solve is now lazykern's own conjugate gradients
(:func:`lazykern.regression.predict`), whose result says whether it reached its tolerance.

The full-set NLPD is shown only where the predictive variances are known right. On the
conjugate-gradient path they come from LOVE, whose Krylov space (100 vectors, GPyTorch's default)
overestimates them when more of the kernel's eigenvalues than that exceed the noise: on elevators,
at the ``additive-rbf`` run's hyperparameters, LOVE gave variances of about 60 where a dense float64
Cholesky gives 0.11, and a Krylov space of 300 vectors still 10 (NLPD 2.97 against 0.63; test RMSE
0.446 either way).
:func:`lazykern.regression.fit_evaluate` now bounds the exact variance at 16 test points by float64
conjugate gradients (:func:`lazykern.regression.variance_bounds`) and withholds the NLPD where LOVE's
lie outside; the runs above made before that check have their RMSE shown and their NLPD not.

The projected kernel's full-set runs (``dpa-matern52``) were made with fixed directions and one
shared lengthscale; the recipe now learns one lengthscale per input dimension before projecting
(:doc:`projected`), so those runs are no longer this kernel's (they were: pol 0.363, elevators
0.431, bike 0.418, kin40k 1.124, protein 0.769, all at the 200-step limit) and the cells show the
runs made since: on pol 0.265 (against 0.363 before; 1,078 s of training beside another job, which
took one of the two cores; the plateau rule stopped it after 190 steps), on elevators 0.416 (against
0.431; 430 s, quiet) and on bike 0.122 (against 0.418; 399 s, quiet). Their LOVE variances were far from the exact ones (pol: about 2.6 where the
exact ones are 0.030, bounded to three digits by the check), so their NLPDs are withheld. On kin40k
and protein, 2.3 and 2.6 times bike's points, it first did not finish within 40 minutes beside another
job (kin40k from the recipe's start, protein from a 1,000-point warm start,
:func:`lazykern.regression.warm_start`): trained in float32, where preconditioned conjugate gradients
stall, and on kin40k the LOVE check's 1e-6 solve outlasted the budget after training had finished.
The recipe now trains on the conjugate-gradient path in float64 on a CPU
(:func:`lazykern.regression.trains_in_float64`) and the check solves loosely first; from a 1,000-point
warm start both finish: kin40k 0.797 (769 s), protein 0.734 (1,222 s), each beside another job, far
from ARD RBF at 5,000 training points (0.149 and 0.643, :doc:`projected`). The cells of pol, elevators
and bike were trained in float32. First-order additive RBF: bike 0.071 (1,758 s beside another job,
float32), ahead of the projected kernel's 0.122 there; kin40k 0.996 (559 s, float64, beside another
job), no better than the mean predictor, where the projected kernel's 0.797 is; on protein it did not
finish within 2,400 s (float64, beside another job: the kin40k run, then the test suite): it was
still training when the budget ran out. On keggdirected (43,945 training points, d = 20) neither
finished within 2,400 s: the projected kernel from a 1,000-point warm start was still in Adam's
steps, additive RBF (one thread) still training; each beside another job.

What the loader checks
----------------------

:func:`lazykern.data.load_uci` checks every row of both files before it splits them, and refuses a
damaged file with one line, a :class:`lazykern.data.DataError` naming the file, the row (a line of the
decompressed file) and the column, both counted from 1, and what was expected: a file that is not
gzip or is cut short, a row with another number of columns than the first, a field that is not a
number (a header row too), a NaN or infinite value in any row (whether or not the split or the
``n_train`` subset uses it), a test mask without one 0/1 column per split for each data row, a split
with fewer than 2 training points or no test point, a target that is constant over the training
points, or training inputs that are all one point. Repeated points are accepted: keggdirected
repeats two thirds of its rows, and an exact GP with a noise term fits them. ``lazykern uci`` and
the examples print that line and exit with status 2.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--splits", nargs="+", type=int, default=None, help="default: 0 1 2 (0 with --full)")
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--full", action="store_true", help="use every training point (split 0 unless --splits)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--optimizer", default="auto")
    parser.add_argument("--tolerance", type=float, default=None, help="default: the optimizer's (TOLERANCES)")
    parser.add_argument("--max-degree", type=int, default=None)
    parser.add_argument("--max-cholesky", type=int, default=2000)
    parser.add_argument("--warm-start", type=int, default=None, metavar="M",
                        help="on the conjugate-gradient path, start from an exact fit on M training points")
    parser.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run (default 6 h)")
    parser.add_argument("--force", action="store_true", help="repeat runs already recorded")
    parser.add_argument("--render-only", action="store_true", help="only rewrite the tables from the records")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.splits is None:
        args.splits = [0] if args.full else [0, 1, 2]
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    RESULTS.mkdir(parents=True, exist_ok=True)
    meta_path = RESULTS / "uci_meta.json"
    settings = {"n_train": args.n_train, "splits": args.splits, "seed": args.seed, "dtype": args.dtype,
                "iters": args.iters, "optimizer": args.optimizer, "tolerance": args.tolerance,
                "max_degree": args.max_degree}
    if args.render_only:
        render(json.loads(meta_path.read_text()), load_records())
        return
    meta = {"machine": machine(), "settings": settings}
    if not args.full:
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    elif meta_path.exists():
        meta = json.loads(meta_path.read_text())
    records = load_records()
    done = {key(r) for r in records if "error" not in r}
    for split in args.splits:
        for dataset in args.datasets:
            for kernel in sorted(args.kernels, key=RUN_ORDER.index):
                job = {"dataset": dataset, "kernel": kernel, "split": split, "seed": args.seed, "dtype": args.dtype,
                       "n_train": None if args.full else N_TRAIN.get(dataset, args.n_train), "iters": args.iters,
                       "optimizer": args.optimizer, "tolerance": args.tolerance, "max_degree": args.max_degree,
                       "max_cholesky": args.max_cholesky, "warm_start": args.warm_start, "full": args.full}
                probe = {**job, **requested(job)}
                if key(probe) in done and not args.force:
                    continue
                print(f"{dataset} split {split} / {kernel}{' (full)' if args.full else ''} ...", flush=True)
                record = run_one(job, args.timeout)
                with RECORDS.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                records.append(record)
                render(meta, records)
                shown = {k: record.get(k) for k in ("rmse", "nlpd", "train_seconds", "peak_memory_mb", "error")}
                print("   ", {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
                              for k, v in shown.items()}, flush=True)


if __name__ == "__main__":
    main()
