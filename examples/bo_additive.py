r"""Bayesian optimisation of additive test problems: BoTorch's default GP against additive kernels.

    python3 examples/bo_additive.py [--problems P ...] [--models M ...] [--acquisitions A ...] [--seeds N]
                                    [--n-init N] [--iters N] [--num-restarts N] [--raw-samples N] [--maxiter N]
                                    [--check-models] [--quick] [--out FOLDER]

Each problem is maximised over the unit cube (inputs rescaled to its bounds), one point per
iteration, from a scrambled Sobol design of ``--n-init`` points shared by every configuration of a
seed. A configuration is a model and an acquisition function:

* models: ``default`` (BoTorch's ``SingleTaskGP``: an RBF kernel on all dimensions with the
  dimension-scaled lengthscale prior of Hvarfner et al., 2024), ``gpytorch-additive``
  (``ScaleKernel(gpytorch.kernels.AdditiveStructureKernel(RBFKernel()))``: one lengthscale shared by
  every dimension), ``lazykern`` (``ScaleKernel(lazykern.AdditiveStructureKernel(RBFKernel(ard_num_dims=d),
  component_scales=True))``: a lengthscale and a weight per dimension); the two additive models with
  :func:`lazykern.botorch.additive_priors`, and ``lazykern-no-priors``, the lazykern model with
  GPyTorch's defaults (no priors);
* acquisitions: ``qlogei`` (``qLogExpectedImprovement``) and ``ts`` (Thompson sampling: one
  posterior sample path from ``draw_matheron_paths``, maximised by ``optimize_acqf``; the additive
  kernels' random features come from :mod:`lazykern.botorch`).

Problems: ``st<D>``, Styblinski–Tang in D dimensions (a sum of D one-dimensional terms, maximum
39.166 D); ``embedded<D>`` (D >= 22), the negated sum of two Branin terms (divided by 50), two
Hartmann-3 and two Hartmann-6 terms on 22 dimensions of D chosen at random once (the rest have no
effect; maximum 14.355).

Writes into FOLDER: ``bo_additive.jsonl`` (one line per finished run: best-so-far values, the
seconds each iteration spent fitting and optimising the acquisition, the fitted lengthscales),
``bo_additive.json`` (runs, settings, machine, date and command), ``bo_additive.md`` (a table per
problem: mean best value at the last iteration with its standard error over seeds, seconds per
iteration) and ``bo_additive.png`` (mean best-so-far curves, ± one standard error). Seeds run in the
outer loop and the summary files are rewritten after every seed, so a run cut short leaves every
configuration with the same seeds. ``--quick`` is a toy run of every configuration (seconds).

``--check-models`` runs no loop: per seed it fits each model to the first ``n-init + iters`` points of the
Sobol sequence (as many as a loop ends with) and writes ``bo_additive_models.md`` and ``.json``: the
model's accuracy on 1,000 uniform points, its lengthscales, and the point each acquisition proposes
from it (how many of its coordinates lie on the cube's boundary, its value).

Each iteration refits the model starting from the previous iteration's hyperparameters (the first
from the model's own starting values); ``optimize_acqf`` runs L-BFGS-B from ``--num-restarts`` of
``--raw-samples`` random points, at most ``--maxiter`` iterations each.
"""

import lazykern  # noqa: I001 - first: it hides a dependency's import-time notice (lazykern/__init__.py)

import json
import math
import re
import shlex
import sys
import time
import warnings
from pathlib import Path

import torch

from _common import fail, output, parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.uci_results import machine  # noqa: E402 - the benchmarks' machine record

# BoTorch's import takes seconds: the functions that need it import it, after the flags are checked.
DTYPE = torch.float64
MODELS = ("default", "gpytorch-additive", "lazykern", "lazykern-no-priors")
ACQUISITIONS = ("qlogei", "ts")
#: Configurations run by default: every model with qLogEI, Thompson sampling for the default GP and
#: lazykern's (GPyTorch's additive kernel has paths only through lazykern.botorch as well, so it is
#: left out to keep the run short), and lazykern's model without priors on the first problem only.
DEFAULT_CONFIGS = (("default", "qlogei"), ("gpytorch-additive", "qlogei"), ("lazykern", "qlogei"),
                   ("default", "ts"), ("lazykern", "ts"))
EMBEDDED_ACTIVE = 22
QUICK = dict(problems=["st4", "embedded22"], seeds=1, n_init=4, iters=1, num_restarts=1, raw_samples=8, maxiter=5)


def check_problem(spec: str) -> tuple[str, int]:
    """The family and dimension of a problem named ``st<D>`` or ``embedded<D>``; else a one-line error."""
    match = re.fullmatch(r"(st|embedded)(\d+)", spec)
    if match is None or int(match.group(2)) < 1:
        fail(f"--problems: unknown problem {spec!r} (expected st<D>, e.g. st20, or embedded<D>, D >= "
             f"{EMBEDDED_ACTIVE}, e.g. embedded50)")
    if match.group(1) == "embedded" and int(match.group(2)) < EMBEDDED_ACTIVE:
        fail(f"--problems: {spec} has fewer than {EMBEDDED_ACTIVE} dimensions (its terms need {EMBEDDED_ACTIVE})")
    return match.group(1), int(match.group(2))


class Problem:
    """A maximisation problem on the unit cube: ``name``, ``dim``, ``optimum`` and ``__call__``."""

    def __init__(self, spec: str):
        from botorch.test_functions.synthetic import Branin, Hartmann, StyblinskiTang

        family, self.dim = check_problem(spec)
        self.name = spec
        if family == "st":
            self.terms = [(StyblinskiTang(dim=self.dim, negate=True), list(range(self.dim)), 1.0)]
        else:
            dims = torch.randperm(self.dim, generator=torch.Generator().manual_seed(0)).tolist()
            functions = [(Branin(negate=True), 1 / 50), (Branin(negate=True), 1 / 50), (Hartmann(3, negate=True), 1.0),
                         (Hartmann(3, negate=True), 1.0), (Hartmann(6, negate=True), 1.0), (Hartmann(6, negate=True), 1.0)]
            self.terms, start = [], 0
            for function, weight in functions:
                self.terms.append((function, dims[start:start + function.dim], weight))
                start += function.dim
        self.optimum = sum(weight * function.optimal_value for function, _, weight in self.terms)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(x.shape[:-1], dtype=x.dtype)
        for function, dims, weight in self.terms:
            low, high = function.bounds.to(x)
            total = total + weight * function(low + (high - low) * x[..., dims])
        return total


def kernel(model: str, dim: int):
    """The covariance of ``model`` on ``dim`` inputs (``None``: BoTorch's default)."""
    import gpytorch

    import lazykern.botorch  # also registers the additive kernels' random features

    if model == "default":
        return None
    if model == "gpytorch-additive":
        return lazykern.botorch.additive_priors(gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.AdditiveStructureKernel(gpytorch.kernels.RBFKernel(), num_dims=dim)))
    additive = gpytorch.kernels.ScaleKernel(lazykern.AdditiveStructureKernel(
        lazykern.RBFKernel(ard_num_dims=dim), num_dims=dim, component_scales=True))
    return additive if model == "lazykern-no-priors" else lazykern.botorch.additive_priors(additive)


def lengthscales(gp) -> list[float]:
    """The fitted lengthscales (on the unit cube), however deep the base kernel sits."""
    found = [m.lengthscale for m in gp.covar_module.modules() if getattr(m, "has_lengthscale", False)]
    return found[0].detach().flatten().tolist() if found else []


def fit(X: torch.Tensor, Y: torch.Tensor, model: str, previous: dict):
    """``model`` fitted to ``(X, Y)`` by BoTorch's ``fit_gpytorch_mll``, starting from the hyperparameters in
    ``previous`` (a state dict; empty: the model's own start), and whether every fitting attempt failed."""
    from botorch.exceptions import ModelFittingError
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    gp = SingleTaskGP(X, Y, covar_module=kernel(model, X.shape[-1]))
    gp.load_state_dict(previous, strict=False)  # the outcomes' scaling is not in it: it is new
    try:
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    except ModelFittingError:  # every retry failed: go on with the last hyperparameters tried
        return gp, True
    return gp, False


def propose(gp, acquisition: str, best_f: torch.Tensor, args) -> torch.Tensor:
    """The next point, ``(1, d)``: the maximiser of qLogEI or of one posterior sample path."""
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
    from botorch.optim import optimize_acqf

    dim = gp.train_inputs[0].shape[-1]
    bounds = torch.stack([torch.zeros(dim, dtype=DTYPE), torch.ones(dim, dtype=DTYPE)])
    function = qLogExpectedImprovement(gp, best_f=best_f) if acquisition == "qlogei" else PathwiseThompsonSampling(gp)
    candidate, _ = optimize_acqf(function, bounds=bounds, q=1, num_restarts=args.num_restarts,
                                 raw_samples=args.raw_samples, options={"maxiter": args.maxiter})
    return candidate.detach()


def initial_design(problem: Problem, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    from botorch.utils.sampling import draw_sobol_samples

    bounds = torch.stack([torch.zeros(problem.dim, dtype=DTYPE), torch.ones(problem.dim, dtype=DTYPE)])
    X = draw_sobol_samples(bounds, n=n, q=1, seed=seed).squeeze(-2)
    return X, problem(X).unsqueeze(-1)


def run(problem: Problem, model: str, acquisition: str, seed: int, args) -> dict:
    """One Bayesian optimisation run; the record written to the JSONL file."""
    torch.manual_seed(seed)
    X, Y = initial_design(problem, args.n_init, seed)
    best, fit_s, acquisition_s, fit_failures, previous = [float(Y.max())], [], [], 0, {}
    for _ in range(args.iters):
        start = time.perf_counter()
        gp, failed = fit(X, Y, model, previous)
        fit_failures += failed
        fit_s.append(time.perf_counter() - start)
        previous = {k: v for k, v in gp.state_dict().items() if not k.startswith("outcome_transform.")}
        start = time.perf_counter()
        candidate = propose(gp, acquisition, Y.max(), args)
        acquisition_s.append(time.perf_counter() - start)
        X = torch.cat([X, candidate])
        Y = torch.cat([Y, problem(candidate).unsqueeze(-1)])
        best.append(max(best[-1], float(Y[-1])))
    return dict(problem=problem.name, model=model, acquisition=acquisition, seed=seed, best=best, fit_s=fit_s,
                acquisition_s=acquisition_s, fit_failures=fit_failures, lengthscales=lengthscales(gp))


def check_model(problem: Problem, model: str, seed: int, args) -> dict:
    """``--check-models``: ``model`` fitted to the ``n_init + iters`` Sobol points of ``seed``, its accuracy on
    1,000 uniform points (RMSE over the values' standard deviation; mean log predictive density, the
    outcomes standardised), the point it proposes by each acquisition (fraction of its coordinates on
    the cube's boundary, its value) and the time to fit."""
    torch.manual_seed(seed)
    X, Y = initial_design(problem, args.n_init + args.iters, seed)
    start = time.perf_counter()
    gp, failed = fit(X, Y, model, {})
    fit_s = time.perf_counter() - start
    test = torch.rand(1000, problem.dim, dtype=DTYPE, generator=torch.Generator().manual_seed(seed))
    truth = problem(test)
    with torch.no_grad():
        posterior = gp.posterior(test, observation_noise=True)
    mean, sd = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1).sqrt()
    scale = Y.std()
    lpd = torch.distributions.Normal(mean / scale, sd / scale).log_prob(truth / scale).mean()
    record = dict(problem=problem.name, model=model, seed=seed, n=len(X), fit_failed=failed, fit_s=fit_s,
                  nrmse=float((mean - truth).pow(2).mean().sqrt() / truth.std()), mean_lpd=float(lpd),
                  lengthscales=lengthscales(gp))
    for acquisition in ACQUISITIONS:
        candidate = propose(gp, acquisition, Y.max(), args)
        record[f"{acquisition}_on_boundary"] = float(((candidate < 1e-6) | (candidate > 1 - 1e-6)).double().mean())
        record[f"{acquisition}_value"] = float(problem(candidate))
    return record


def summarise(records: list[dict]) -> dict:
    """Per (problem, model, acquisition): seeds, mean best-so-far curve and its standard error, times."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["problem"], record["model"], record["acquisition"]), []).append(record)
    rows = []
    for (problem, model, acquisition), runs in groups.items():
        curves = torch.tensor([r["best"] for r in runs], dtype=DTYPE)
        stderr = curves.std(0) / math.sqrt(len(runs)) if len(runs) > 1 else torch.full_like(curves[0], float("nan"))
        fit = torch.tensor([t for r in runs for t in r["fit_s"]])
        acq = torch.tensor([t for r in runs for t in r["acquisition_s"]])
        scales = torch.tensor([s for r in runs for s in r["lengthscales"]])
        rows.append(dict(problem=problem, model=model, acquisition=acquisition, seeds=sorted(r["seed"] for r in runs),
                         mean_best=curves.mean(0).tolist(), stderr_best=stderr.tolist(),
                         fit_s_mean=float(fit.mean()), acquisition_s_mean=float(acq.mean()),
                         fit_failures=sum(r["fit_failures"] for r in runs),
                         lengthscale_quantiles=torch.quantile(scales, torch.tensor([0.1, 0.5, 0.9])).tolist()
                         if len(scales) else []))
    return rows


def table(rows: list[dict], problems: dict[str, Problem], meta: dict) -> str:
    lines = [f"Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores, torch threads "
             f"{meta['settings']['threads']}; torch {meta['machine']['torch']}, BoTorch {meta['botorch']}; "
             f"{meta['date']}. Command: `{meta['command']}`", ""]
    for name, problem in problems.items():
        mine = [r for r in rows if r["problem"] == name]
        if not mine:
            continue
        lines += [f"### {name} (d = {problem.dim}, maximum {problem.optimum:.3f})", "",
                  "| model | acquisition | seeds | best at start | best at the end (mean ± s.e.) | "
                  "s per iteration (fit + acquisition) | fit failures | fitted lengthscales (10/50/90%) |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for r in mine:
            scales = "/".join(f"{q:.3g}" for q in r["lengthscale_quantiles"])
            lines.append(
                f"| {r['model']} | {r['acquisition']} | {len(r['seeds'])} | {r['mean_best'][0]:.2f} | "
                f"{r['mean_best'][-1]:.2f} ± {r['stderr_best'][-1]:.2f} | "
                f"{r['fit_s_mean'] + r['acquisition_s_mean']:.2f} ({r['fit_s_mean']:.2f} + "
                f"{r['acquisition_s_mean']:.2f}) | {r['fit_failures']} | {scales} |")
        lines.append("")
    return "\n".join(lines)


def figure(rows: list[dict], problems: dict[str, Problem], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in problems if any(r["problem"] == name for r in rows)]
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for r in (r for r in rows if r["problem"] == name):
            mean, stderr = torch.tensor(r["mean_best"]), torch.tensor(r["stderr_best"]).nan_to_num()
            x = range(len(mean))
            line, = ax.plot(x, mean, label=f"{r['model']}, {r['acquisition']}",
                            linestyle="-" if r["acquisition"] == "qlogei" else "--")
            ax.fill_between(x, mean - stderr, mean + stderr, color=line.get_color(), alpha=0.2)
        ax.axhline(problems[name].optimum, color="k", linewidth=0.8, linestyle=":")
        seeds = max(len(r["seeds"]) for r in rows if r["problem"] == name)
        ax.set(title=f"{name} (d = {problems[name].dim}), {seeds} seeds", xlabel="iteration",
               ylabel="best value so far (mean ± s.e.)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def arguments():
    p = parser(__doc__)
    p.add_argument("--problems", nargs="+", default=["st20", "st100", "embedded50"],
                   help="st<D> or embedded<D> (default: st20 st100 embedded50)")
    p.add_argument("--models", nargs="+", choices=MODELS, default=None,
                   help="models (default: the configurations listed above)")
    p.add_argument("--acquisitions", nargs="+", choices=ACQUISITIONS, default=None,
                   help="acquisitions (default: the configurations listed above)")
    p.add_argument("--no-priors-problems", nargs="*", default=None,
                   help="problems that also run lazykern-no-priors with qLogEI (default: the first problem)")
    p.add_argument("--seeds", type=int, default=10, help="seeds per configuration (default 10)")
    p.add_argument("--n-init", type=int, default=10, help="initial Sobol points (default 10)")
    p.add_argument("--iters", type=int, default=15, help="iterations, one point each (default 15)")
    p.add_argument("--num-restarts", type=int, default=2, help="optimize_acqf's restarts (default 2)")
    p.add_argument("--raw-samples", type=int, default=64, help="optimize_acqf's raw samples (default 64)")
    p.add_argument("--maxiter", type=int, default=50, help="L-BFGS-B iterations per restart (default 50)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--check-models", action="store_true",
                   help="instead of the loops: fit each model to n-init + iters Sobol points per seed and write "
                        "its held-out accuracy and the points it proposes (bo_additive_models.md/.json)")
    p.add_argument("--quick", action="store_true",
                   help="a toy run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    args = p.parse_args()
    for spec in args.problems:
        check_problem(spec)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    for name in ("seeds", "n_init", "iters", "num_restarts", "raw_samples", "maxiter", "threads"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.n_init < 2:
        fail(f"--n-init must be at least 2 (a GP needs points to fit), got {args.n_init}")
    return args


def check_models(problems: dict[str, Problem], args, meta: dict) -> None:
    """``--check-models``: :func:`check_model` for every problem, model and seed; a table of means ± s.e."""
    records = []
    for name, problem in problems.items():
        for model in args.models or MODELS:
            for seed in range(args.seeds):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    records.append(check_model(problem, model, seed, args))
                print(f"{name} {model} seed {seed}: normalised RMSE {records[-1]['nrmse']:.3f}", flush=True)
    lines = [f"Machine: {meta['machine']['cpu']}, torch threads {args.threads}; BoTorch {meta['botorch']}; "
             f"{meta['date']}. Command: `{meta['command']}`", "",
             "Each model fitted to the first n points of the seed's Sobol sequence; accuracy on 1,000 uniform points "
             "(mean ± s.e. over seeds); the points each acquisition proposes from that model: the fraction of their "
             "coordinates on the cube's boundary and their value.", "",
             "| problem | model | n | seeds | RMSE / sd | mean log pred. density | fitted lengthscales (median) | "
             "qLogEI: on boundary, value | TS: on boundary, value | fit (s) |", "|---|---|---:|---:|---:|---:|---:|---|---|---:|"]

    def mean_se(values: list[float]) -> str:
        t = torch.tensor(values, dtype=DTYPE)
        return f"{float(t.mean()):.3g} ± {float(t.std() / math.sqrt(len(t))) if len(t) > 1 else float('nan'):.2g}"

    for name in problems:
        for model in args.models or MODELS:
            mine = [r for r in records if r["problem"] == name and r["model"] == model]
            scales = torch.tensor([s for r in mine for s in r["lengthscales"]])
            lines.append(f"| {name} | {model} | {mine[0]['n']} | {len(mine)} | {mean_se([r['nrmse'] for r in mine])} | "
                         f"{mean_se([r['mean_lpd'] for r in mine])} | {float(scales.median()):.3g} | "
                         f"{mean_se([r['qlogei_on_boundary'] for r in mine])}, {mean_se([r['qlogei_value'] for r in mine])} | "
                         f"{mean_se([r['ts_on_boundary'] for r in mine])}, {mean_se([r['ts_value'] for r in mine])} | "
                         f"{mean_se([r['fit_s'] for r in mine])} |")
    output(args.out, "bo_additive_models.json").write_text(json.dumps(dict(meta, records=records), indent=1) + "\n")
    output(args.out, "bo_additive_models.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'bo_additive_models.md'} and {args.out / 'bo_additive_models.json'}")


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    problems = {spec: Problem(spec) for spec in dict.fromkeys(args.problems)}
    no_priors = list(problems)[:1] if args.no_priors_problems is None else args.no_priors_problems
    for spec in no_priors:
        if spec not in problems:
            fail(f"--no-priors-problems: {spec!r} is not one of --problems ({' '.join(problems)})")
    if args.models is None and args.acquisitions is None:
        configs = {name: list(DEFAULT_CONFIGS) + ([("lazykern-no-priors", "qlogei")] if name in no_priors else [])
                   for name in problems}
    else:
        configs = {name: [(m, a) for a in args.acquisitions or ACQUISITIONS for m in args.models or MODELS]
                   for name in problems}
    import botorch

    meta = dict(machine=machine(), botorch=botorch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                command=" ".join(shlex.quote(a) for a in ["python3", "examples/bo_additive.py", *sys.argv[1:]]),
                settings={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})
    if args.check_models:
        check_models(problems, args, meta)
        return
    jsonl, summary = output(args.out, "bo_additive.jsonl"), output(args.out, "bo_additive.json")
    jsonl.write_text("")
    records = []
    started = time.perf_counter()
    for seed in range(args.seeds):
        for name, problem in problems.items():
            for model, acquisition in configs[name]:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # BoTorch's optimisation and input-scaling notices
                    record = run(problem, model, acquisition, seed, args)
                records.append(record)
                with jsonl.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"seed {seed} {name} {model} {acquisition}: best {record['best'][-1]:.3f} "
                      f"({sum(record['fit_s']) + sum(record['acquisition_s']):.1f} s)", flush=True)
        rows = summarise(records)
        meta["elapsed_s"] = round(time.perf_counter() - started, 1)
        meta["seeds_finished"] = seed + 1
        summary.write_text(json.dumps(dict(meta, rows=rows), indent=1) + "\n")
        output(args.out, "bo_additive.md").write_text(table(rows, problems, meta) + "\n")
        figure(rows, problems, output(args.out, "bo_additive.png"))
    print(f"wrote {jsonl}, {summary}, {args.out / 'bo_additive.md'} and {args.out / 'bo_additive.png'}")


if __name__ == "__main__":
    main()
