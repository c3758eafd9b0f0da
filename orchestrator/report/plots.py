"""Figures of a sweep as PNG (matplotlib, headless): AUG Figures 3 and 5.

- :func:`plot_metric_by_size`: the metric against training size for one model, one line
  per loss (left, averaged over augmentations) and per augmentation (right, averaged over
  losses), the baseline dashed in both (AUG Figure 5). Averages, not maxima: picking the
  best system per point would select on test.
- :func:`plot_relative_by_size`: relative change over the baseline by size, one bar per
  system (loss + augmentation), ``†``/``°`` above bars whose paired test against the
  baseline is significant at 95%/90% (AUG Figure 3); with ``--ci``, each bar's error bar is
  the t interval of its difference, in percent of the baseline.

Sizes are placed as categories in grid order, so ``full`` sits after the largest number.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from orchestrator.report.render import MARKERS  # noqa: E402
from orchestrator.report.results import STATUS_OK, SystemResult  # noqa: E402
from orchestrator.report.tables import Entry, first_stage_title
from workloads.evaluation import DISPLAY_NAMES, mean_of  # noqa: E402


def _sizes(model_systems: list[SystemResult]) -> list[str]:
    return list(dict.fromkeys(s.axes["size"] for s in model_systems))


def _mean_by(model_systems: list[SystemResult], axis: str, sizes: list[str]) -> dict[str, list[float | None]]:
    """Per value of ``axis`` (baselines excluded), the mean finished value at each size (None: nothing finished)."""
    lines: dict[str, list[float | None]] = {}
    for name in dict.fromkeys(s.axes[axis] for s in model_systems if not s.is_baseline):
        points = []
        for size in sizes:
            values = [s.value for s in model_systems if not s.is_baseline and s.axes[axis] == name
                      and s.axes["size"] == size and s.status == STATUS_OK]
            points.append(mean_of(values) if values else None)
        lines[name] = points
    return lines


def _plot_line(ax, sizes: list[str], points: list[float | None], **style) -> None:
    xs = [i for i, v in enumerate(points) if v is not None]
    ax.plot(xs, [points[i] for i in xs], marker="o", **style)


def plot_metric_by_size(model_systems: list[SystemResult], model: str, metric: str, collection: str, path: Path,
                        first_stage: float | None = None, first_stage_label: str = first_stage_title("BM25")) -> Path:
    sizes = _sizes(model_systems)
    baseline = [next((s.value for s in model_systems if s.is_baseline and s.axes["size"] == size and s.status == STATUS_OK), None)
                for size in sizes]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, axis in zip(axes, ("loss", "augmentation")):
        for name, points in _mean_by(model_systems, axis, sizes).items():
            _plot_line(ax, sizes, points, label=name)
        _plot_line(ax, sizes, baseline, label="baseline", color="black", linestyle="--")
        if first_stage is not None:  # the ranking every system re-ranks, for reference
            ax.axhline(first_stage, color="grey", linestyle=":", label=first_stage_label)
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_xlabel("training size (query-document pairs)")
        ax.set_title(f"by {axis}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"{DISPLAY_NAMES.get(metric, metric)} ({collection})")
    figure.suptitle(f"{model}: {DISPLAY_NAMES.get(metric, metric)} by training size")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_relative_by_size(model_systems: list[SystemResult], entries: dict[int, Entry], model: str, metric: str,
                          collection: str, path: Path) -> Path:
    sizes = _sizes(model_systems)
    names = list(dict.fromkeys(f"{s.axes['loss']} / {s.axes['augmentation']}" for s in model_systems if not s.is_baseline))
    width = 0.8 / max(1, len(names))
    figure, ax = plt.subplots(figsize=(max(6, 1.6 * len(sizes) + 0.3 * len(names)), 4.5))
    intervals = False
    for n, name in enumerate(names):
        for i, size in enumerate(sizes):
            system = next((s for s in model_systems if not s.is_baseline and s.axes["size"] == size
                           and f"{s.axes['loss']} / {s.axes['augmentation']}" == name), None)
            entry = entries.get(id(system)) if system is not None else None
            if entry is None or entry.relative is None:
                continue
            x = i - 0.4 + width * (n + 0.5)
            error = None
            if entry.relative_ci is not None:  # asymmetric: from the bar's top to the interval's ends
                low, high = entry.relative_ci
                error = [[max(0.0, entry.relative - low)], [max(0.0, high - entry.relative)]]
                intervals = True
            ax.bar(x, entry.relative, width, color=f"C{n % 10}", label=name, yerr=error, capsize=3 if error else 0)
            if entry.level in MARKERS:
                top = entry.relative_ci[1 if entry.relative >= 0 else 0] if entry.relative_ci is not None else entry.relative
                ax.annotate(MARKERS[entry.level], (x, top), ha="center", va="bottom" if entry.relative >= 0 else "top", fontsize=10)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_xlabel("training size (query-document pairs)")
    ax.set_ylabel(f"change of {DISPLAY_NAMES.get(metric, metric)} over baseline (%)")
    bars = "; bars: t interval (see the table)" if intervals else ""
    ax.set_title(f"{model} on {collection}: change over the baseline\n(† p < 0.05, ° p < 0.10, paired test per query{bars})",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # one legend entry per system, not per bar
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
