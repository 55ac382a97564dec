"""The figure of component analysis: each input's centred first-order component with its band, the
order shares and the inputs' total effects (the only part of component analysis that needs
matplotlib, imported when a figure is drawn)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from ..validation import check_positive_int
from .analysis import ComponentAnalysis

__all__ = ["plot_components"]


def plot_components(
    analysis: ComponentAnalysis,
    path: str | Path,
    *,
    names: Sequence[str] | None = None,
    x_mean: Tensor | None = None,
    x_std: Tensor | None = None,
    y_mean: float = 0.0,
    y_std: float = 1.0,
    x_units: str | Sequence[str] | None = None,
    y_units: str | None = None,
    title: str | None = None,
    max_panels: int = 12,
) -> Path:
    """Save a figure of what the model learned: one panel per input (the largest total effects
    first), then the order shares and every input's total effect and first-order share.

    Each input's panel shows its centred first-order component (posterior mean, and a band of
    ± 2 posterior standard deviations of the centred component where ``analysis.variance`` is
    known) against the input, with a rug of the training inputs; the additive offset the centring
    removed (the GP's constant mean plus the components' training averages) is given in the title.
    OAK's components are identifiable and their bands show shape uncertainty alone; a
    Newton–Girard kernel's first-order term also trades off against its higher orders, which its
    (wider) bands include.

    Args:
        analysis: from :func:`component_analysis`.
        path: image file to write (format from its suffix, e.g. ``.png``, ``.pdf``).
        names: one name per input dimension (default ``x0, x1, ...``).
        x_mean, x_std, y_mean, y_std: to draw in original units (a :class:`lazykern.data.UCISplit`'s
            statistics): inputs ``x * x_std + x_mean``, components ``f * y_std``, offset ``y_mean + offset * y_std``.
        x_units: the inputs' unit, one for all or one per input (default: "original units" when
            ``x_std`` is given, else "standardized").
        y_units: the target's unit (default: "original units" when ``y_std != 1``, else "standardized").
        title: first line of the figure's title (e.g. dataset and kernel).
        max_panels: at most this many component panels.

    Returns:
        The path written.

    Example:
        >>> import tempfile, torch
        >>> from lazykern.components import component_analysis, plot_components
        >>> from lazykern.regression import build_model
        >>> x = torch.randn(60, 2, dtype=torch.float64)
        >>> model, _ = build_model(x, torch.sin(x[:, 0]), "additive-rbf")
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     plot_components(component_analysis(model), f"{folder}/components.png", title="toy").stat().st_size > 0
        True
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - matplotlib ships with the dev extra
        raise ImportError("plot_components needs matplotlib: pip install matplotlib") from err
    path = Path(path)
    if not path.parent.resolve().is_dir():
        raise ValueError(f"path {path}: folder {path.parent} does not exist")
    check_positive_int("max_panels", max_panels)
    names, x_mean, x_std, x_units, y_units = _labels(analysis.grid.shape[1], names, x_mean, x_std, x_units, y_mean,
                                                     y_std, y_units)
    order = analysis.ranking()[:max_panels]
    cols = max(2, min(4, len(order)))
    rows = math.ceil(len(order) / cols)
    fig = plt.figure(figsize=(3.4 * cols, 2.8 * rows + 3.2))
    layout = fig.add_gridspec(rows + 1, 2 * cols, height_ratios=[2.8] * rows + [3.0])
    handles, labels = _component_panels(fig, layout, analysis, order, cols, names, x_mean, x_std, x_units, y_std,
                                        y_units)
    _share_panels(fig, layout, analysis, rows, cols, names)
    offset = y_mean + (analysis.constant + float(analysis.offsets.sum())) * y_std
    heading = f"{title}\n" if title else ""
    fig.suptitle(f"{heading}first-order components, centred on their training-input average "
                 f"(offset removed: {offset:.4g} {y_units})", fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _labels(d: int, names: Sequence[str] | None, x_mean: Tensor | None, x_std: Tensor | None,
            x_units: str | Sequence[str] | None, y_mean: float, y_std: float, y_units: str | None):
    """:func:`plot_components`' names, input statistics and units, defaults filled in and checked
    against the ``d`` inputs."""
    names = list(names) if names is not None else [f"x{k}" for k in range(d)]
    if len(names) != d:
        raise ValueError(f"names has {len(names)} entries for {d} dimensions")
    if x_units is None or isinstance(x_units, str):
        x_units = [x_units or ("original units" if x_std is not None else "standardized")] * d
    if len(x_units) != d:
        raise ValueError(f"x_units has {len(x_units)} entries for {d} dimensions")
    y_units = y_units or ("original units" if y_std != 1.0 or y_mean != 0.0 else "standardized")
    x_mean = torch.zeros(d) if x_mean is None else x_mean.detach().cpu().reshape(d)
    x_std = torch.ones(d) if x_std is None else x_std.detach().cpu().reshape(d)
    return names, x_mean, x_std, x_units, y_units


def _component_panels(fig, layout, analysis: ComponentAnalysis, order: list[int], cols: int, names: list[str],
                      x_mean: Tensor, x_std: Tensor, x_units: Sequence[str], y_std: float, y_units: str):
    """One panel per input of ``order``: its centred component with its band and a rug of the
    training inputs; returns the legend's handles and labels."""
    import matplotlib.lines

    grid, mean = analysis.grid.detach().cpu(), analysis.mean.detach().cpu() * y_std
    std = None if analysis.variance is None else analysis.variance.detach().cpu().sqrt() * y_std
    train = analysis.train_x.detach().cpu()
    totals, firsts = analysis.total_effects.detach().cpu(), analysis.dimension_shares.detach().cpu()
    for n, k in enumerate(order):
        ax = fig.add_subplot(layout[n // cols, 2 * (n % cols) : 2 * (n % cols) + 2])
        t = grid[:, k] * x_std[k] + x_mean[k]
        if std is not None:
            ax.fill_between(t, mean[:, k] - 2 * std[:, k], mean[:, k] + 2 * std[:, k], alpha=0.3, color="C0", lw=0,
                            label="± 2 s.d. of the centred component (posterior)")
        ax.plot(t, mean[:, k], color="C0", label="posterior mean of the centred component")
        ax.axhline(0.0, color="0.6", lw=0.6)
        ax.plot(train[:, k] * x_std[k] + x_mean[k], torch.full((len(train),), 0.03), "|", color="k", alpha=0.1,
                ms=5, transform=ax.get_xaxis_transform())
        ax.set_title(f"{names[k]}: total effect {float(totals[k]):.2f}, first-order {float(firsts[k]):.2f}",
                     fontsize=9)
        ax.set_xlabel(f"{names[k]} ({x_units[k]})", fontsize=8)
        ax.set_ylabel(f"component ({y_units})", fontsize=8)
        ax.tick_params(labelsize=7)
        if n == 0:
            handles, labels = ax.get_legend_handles_labels()
    # the rug's own marks are faint (thousands overlap): the legend gets an opaque one
    handles.append(matplotlib.lines.Line2D([], [], color="k", marker="|", ls="", ms=8))
    labels.append("training inputs")
    return handles, labels


def _share_panels(fig, layout, analysis: ComponentAnalysis, rows: int, cols: int, names: list[str]) -> None:
    """The bottom row: the order shares, and every input's total effect and first-order share."""
    import matplotlib.ticker

    d = analysis.grid.shape[1]
    totals, firsts = analysis.total_effects.detach().cpu(), analysis.dimension_shares.detach().cpu()
    bars = fig.add_subplot(layout[rows, :cols])
    shares = analysis.order_shares.detach().cpu()
    bars.bar(range(1, len(shares) + 1), shares, color="C1")
    bars.set_title("order shares (" + ("Sobol indices" if analysis.kind == "sobol"
                                       else "variance of each order's term; not Sobol indices") + ")", fontsize=9)
    bars.set_xlabel("interaction order r", fontsize=8)
    bars.set_xlim(0.0, len(shares) + 1.0)  # one order: a bar, not the whole panel
    bars.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    bars.set_ylabel("share of Var[posterior mean]", fontsize=8)
    bars.tick_params(labelsize=7)
    effects = fig.add_subplot(layout[rows, cols:])
    ranked = analysis.ranking()
    at = torch.arange(d, dtype=torch.float64).numpy()  # numpy throughout: matplotlib's own arithmetic on them
    errors = None if analysis.total_effects_se is None else 2 * analysis.total_effects_se.detach().cpu()[ranked].numpy()
    effects.bar(at - 0.2, totals[ranked].numpy(), width=0.4, color="C0", yerr=errors, capsize=2,
                label="total effect" + (" (± 2 s.e.)" if errors is not None else ""))
    effects.bar(at + 0.2, firsts[ranked].numpy(), width=0.4, color="C2", label="first-order share")
    effects.set_title("inputs by total effect", fontsize=9)
    effects.set_ylabel("share of Var[posterior mean]", fontsize=8)
    effects.set_xticks(at, [names[k] for k in ranked], rotation=90 if d > 8 else 0, fontsize=7)
    effects.tick_params(axis="y", labelsize=7)
    effects.legend(fontsize=7)
