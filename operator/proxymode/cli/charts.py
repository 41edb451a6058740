"""The report's charts: matplotlib figures rendered to inline SVG, with no external reference.

Pure: series in, an ``<svg>`` string out (no cluster, no Prometheus). Text is drawn as paths
(matplotlib's default ``svg.fonttype``), so the file looks the same without any font; the
XML prolog, DOCTYPE and metadata are dropped so that the SVG can sit inside HTML and points
nowhere. matplotlib's SVG backend is chosen explicitly: no display is needed.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import matplotlib

matplotlib.use("svg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter

Point = tuple[float, float]  # (unix seconds, value)
Span = tuple[float, float, str]  # (start, end, label)

PHASE_COLOURS = {
    "Pending": "#9e9e9e",
    "Preflight": "#8d6e63",
    "Progressing": "#1e88e5",
    "Analyzing": "#43a047",
    "Paused": "#fdd835",
    "Finalizing": "#00897b",
    "Completed": "#2e7d32",
    "RollingBack": "#fb8c00",
    "RolledBack": "#e53935",
    "Failed": "#b71c1c",
}
MODE_COLOURS = {
    "iptables": "#5c6bc0",
    "nftables": "#26a69a",
    "ipvs": "#ab47bc",
    "switching": "#ffa726",
    "both": "#d32f2f",
    "none": "#bdbdbd",
}
plt.rcParams.update({"svg.hashsalt": "proxymode", "font.size": 9})


def _clock(t: float, _pos: int | None = None) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")


def to_svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element: no prolog, no DOCTYPE, no metadata."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _time_axis(ax: Axes) -> None:
    """Unix seconds on the axis, shown as UTC clock times."""
    ax.xaxis.set_major_formatter(FuncFormatter(_clock))
    ax.set_xlabel("time (UTC)")


def gantt(rows: Mapping[str, Sequence[Span]], colours: Mapping[str, str], title: str) -> str:
    """One row per key, a bar per span coloured by its label, and a legend of the labels."""
    height = max(1.6, 0.32 * len(rows) + 1.1)
    fig, ax = plt.subplots(figsize=(10, height))
    names = list(rows)
    seen: dict[str, str] = {}
    for i, name in enumerate(names):
        for start, end, label in rows[name]:
            colour = colours.get(label, "#607d8b")
            ax.barh(
                i,
                end - start,
                left=start,
                height=0.7,
                color=colour,
                edgecolor="white",
                linewidth=0.5,
            )
            seen.setdefault(label, colour)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    _time_axis(ax)
    ax.set_title(title, loc="left")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in seen.values()]
    ax.legend(handles, list(seen), loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return to_svg(fig)


def checks(
    series: Mapping[str, Mapping[str, Sequence[Point]]],
    bounds: Mapping[str, float | None],
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    """One panel per check: canary (solid) and baseline (dashed) over time, and its bound.

    ``marks`` are vertical lines at moments worth seeing (a stage starting, a rollback).
    """
    names = sorted(series)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.1 * len(names)), sharex=True)
    axes_list = [axes] if len(names) == 1 else list(axes)
    for ax, name in zip(axes_list, names, strict=True):
        for group, style in (("canary", "-"), ("baseline", "--")):
            points = series[name].get(group) or []
            if points:
                ax.plot(
                    [t for t, _ in points],
                    [v for _, v in points],
                    style,
                    label=group,
                    linewidth=1.6,
                    color="#1e88e5" if group == "canary" else "#757575",
                )
        bound = bounds.get(name)
        if bound is not None:
            ax.axhline(bound, color="#e53935", linewidth=1, linestyle=":", label="bound")
        for t, label in marks:
            ax.axvline(t, color="#bdbdbd", linewidth=0.8)
            ax.annotate(
                label,
                (t, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                rotation=90,
                va="top",
                ha="right",
                color="#616161",
            )
        ax.set_title(name, loc="left")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    _time_axis(axes_list[-1])
    fig.tight_layout()
    return to_svg(fig)


def bars(counts: Mapping[str, int], title: str) -> str:
    """A horizontal bar per value (kernels, OS images) with its node count."""
    labels = list(counts)
    fig, ax = plt.subplots(figsize=(10, max(1.4, 0.35 * len(labels) + 0.9)))
    ax.barh(range(len(labels)), [counts[k] for k in labels], color="#5c6bc0")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("nodes")
    ax.set_title(title, loc="left")
    for i, k in enumerate(labels):
        ax.annotate(
            str(counts[k]), (counts[k], i), xytext=(3, 0), textcoords="offset points", va="center"
        )
    return to_svg(fig)


def spans(points: Sequence[tuple[float, str]], end: float) -> list[Span]:
    """Consecutive ``(time, label)`` samples merged into ``(start, end, label)`` spans."""
    out: list[Span] = []
    for i, (t, label) in enumerate(points):
        stop = points[i + 1][0] if i + 1 < len(points) else end
        if out and out[-1][2] == label and abs(out[-1][1] - t) < 1e-6:
            out[-1] = (out[-1][0], stop, label)
        else:
            out.append((t, stop, label))
    return out
