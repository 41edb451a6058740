"""The ``report`` file, pure: a run's data in, one self-contained HTML or Markdown file out.

Everything is inline: CSS in a ``<style>`` element, charts as ``<svg>`` (HTML) or as
``data:`` images (Markdown), so the file opens anywhere without the network and can be
attached to a change ticket as it is.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxymode.cli import charts
from proxymode.cli.tree import parse_time, rollback_reason, threshold

Obj = Mapping[str, Any]

CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #212121; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
td, th { border: 1px solid #e0e0e0; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } .chart svg { max-width: 100%; height: auto; }
.Completed { color: #2e7d32; } .RolledBack, .Failed { color: #c62828; } .note { color: #757575; }
"""


@dataclass(frozen=True)
class RunData:
    """What the report shows; gathered by ``report`` from the API and Prometheus."""

    policy: Obj
    events: Sequence[Obj]
    now: datetime
    node_modes: Mapping[str, Sequence[tuple[float, str]]] = field(default_factory=dict)
    """Per node, ``(unix time, mode)`` samples over the run (empty without Prometheus)."""
    check_series: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]] = field(
        default_factory=dict
    )
    """Per check, ``canary`` and ``baseline`` ``(unix time, value)`` points over the run."""
    prometheus_note: str = ""

    @property
    def status(self) -> Obj:
        return self.policy.get("status") or {}

    @property
    def spec(self) -> Obj:
        return self.policy.get("spec") or {}

    @property
    def window(self) -> tuple[float, float]:
        meta = self.policy.get("metadata") or {}
        start = parse_time(self.status.get("startedTime")) or parse_time(
            meta.get("creationTimestamp")
        )
        end = parse_time(self.status.get("completedTime")) or self.now
        begin = (start or self.now).timestamp()
        return begin, max(end.timestamp(), begin + 1)


def phase_spans(data: RunData) -> list[charts.Span]:
    """The phases from ``status.history``; the last (terminal) one gets a visible tail."""
    entries = sorted(
        (t.timestamp(), str(h.get("phase")))
        for h in data.status.get("history") or []
        if (t := parse_time(h.get("time"))) is not None
    )
    start, end = data.window
    tail = max(5.0, 0.04 * (end - start))
    return charts.spans(entries, max(end, entries[-1][0] if entries else end) + tail)


def node_mode_samples(data: RunData) -> dict[str, list[tuple[float, str]]]:
    """Each node's mode over the run, as the operator reported it, read for what runs.

    The operator's ``proxymode_node_mode_info`` names the mode by the DaemonSet a node's pod
    belongs to. Finalizing writes the target mode into the source ConfigMap before it hands
    a node back to the source DaemonSet, so from then on a "source" pod runs the target mode:
    those samples are shown as the target mode.
    """
    source = str(data.status.get("sourceMode") or "")
    target = str(data.status.get("targetMode") or data.spec.get("targetMode") or "")
    finalizing = [
        t.timestamp()
        for h in data.status.get("history") or []
        if h.get("phase") == "Finalizing" and (t := parse_time(h.get("time"))) is not None
    ]
    since = min(finalizing) if finalizing and data.status.get("finalized") is not False else None
    out = {}
    for node, samples in data.node_modes.items():
        out[node] = [
            (t, target if since is not None and t >= since and mode == source else mode)
            for t, mode in samples
        ]
    return out


def stage_marks(data: RunData) -> list[tuple[float, str]]:
    out = []
    for h in data.status.get("history") or []:
        t = parse_time(h.get("time"))
        if t is not None and h.get("phase") in ("Progressing", "RollingBack"):
            out.append((t.timestamp(), f"{h.get('phase')} {h.get('stage') or ''}".strip()))
    return out


def bound(check: Obj) -> float | None:
    for key in ("maxSeconds", "maxRatio", "max", "min"):
        if check.get(key) is not None:
            return float(check[key])
    return None


def figures(data: RunData) -> list[tuple[str, str, str]]:
    """``(id, title, svg)`` for every chart there is data for."""
    out = []
    phases = phase_spans(data)
    if phases:
        out.append(
            (
                "phases",
                "Phase timeline",
                charts.gantt({"phase": phases}, charts.PHASE_COLOURS, "phase over the run"),
            )
        )
    if data.node_modes:
        end = data.window[1]
        modes = node_mode_samples(data)
        rows = {n: charts.spans(p, end) for n, p in sorted(modes.items()) if p}
        out.append(
            (
                "nodes",
                "Each node's mode",
                charts.gantt(rows, charts.MODE_COLOURS, "kube-proxy mode per node"),
            )
        )
    if data.check_series:
        specs = {c.get("name"): c for c in (data.spec.get("analysis") or {}).get("checks") or []}
        bounds = {name: bound(specs.get(name) or {}) for name in data.check_series}
        out.append(
            (
                "checks",
                "Checks: canary and baseline",
                charts.checks(data.check_series, bounds, stage_marks(data)),
            )
        )
    kernels = {
        c["value"] or "?": int(c["count"])
        for c in (data.status.get("baseline") or {}).get("kernels") or []
    }
    if kernels:
        out.append(("kernels", "Kernels", charts.bars(kernels, "nodes per kernel")))
    return out


def _rows(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers) if any(headers) else ""
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row)
        + "</tr>"
        for row in rows
    )
    return f"<table>{f'<tr>{head}</tr>' if head else ''}{body}</table>"


def tables(data: RunData) -> list[tuple[str, list[str], list[list[Any]]]]:
    """``(title, headers, rows)`` for the report's tables, shared by HTML and Markdown."""
    st, spec = data.status, data.spec
    specs = {c.get("name"): c for c in (spec.get("analysis") or {}).get("checks") or []}
    code, message = rollback_reason(st)
    summary = [
        ["phase", st.get("phase", "Pending")],
        [
            "modes",
            f"{st.get('sourceMode') or '?'} -> {st.get('targetMode') or spec.get('targetMode')}",
        ],
        ["nodes moved", st.get("nodeProgress") or "-"],
        ["started", st.get("startedTime") or "-"],
        ["completed", st.get("completedTime") or "-"],
        ["message", st.get("message") or ""],
    ]
    if code:
        summary.append(["rollback", f"{code}: {message}" if message else code])
    baseline = st.get("baseline") or {}
    inventory = [
        [k, baseline.get(k)]
        for k in (
            "kubernetesVersion",
            "kubeProxyVersion",
            "kubeProxyImage",
            "sourceMode",
            "cni",
            "services",
            "endpointSlices",
            "nodes",
        )
    ]
    for key in ("kernels", "osImages", "containerRuntimes"):
        inventory.append(
            [key, ", ".join(f"{c['value']} ({c['count']})" for c in baseline.get(key) or [])]
        )
    inventory += [
        [f"metric {k}", _shown(v)] for k, v in sorted((baseline.get("metrics") or {}).items())
    ]
    return [
        ("Summary", ["", ""], summary),
        (
            "Stages",
            ["stage", "phase", "nodes", "started", "completed"],
            [
                [
                    s.get("name"),
                    s.get("phase"),
                    ", ".join(s.get("nodes") or []),
                    s.get("startedTime"),
                    s.get("completedTime"),
                ]
                for s in st.get("stages") or []
            ],
        ),
        (
            "Last round of checks",
            ["check", "canary", "baseline", "threshold", "verdict"],
            [
                [
                    c.get("name"),
                    _shown(c.get("canary")),
                    _shown(c.get("baseline")),
                    threshold(specs.get(c.get("name")) or {}),
                    c.get("verdict"),
                ]
                for c in (st.get("analysis") or {}).get("checks") or []
            ],
        ),
        (
            "Preflight findings",
            ["severity", "code", "message", "nodes"],
            [
                [
                    f.get("severity"),
                    f.get("code"),
                    f.get("message"),
                    ", ".join(f.get("nodes") or []),
                ]
                for f in (st.get("preflight") or {}).get("findings") or []
            ],
        ),
        ("Inventory", ["", ""], inventory),
        (
            "History",
            ["time", "phase", "stage", "reason", "message"],
            [
                [h.get("time"), h.get("phase"), h.get("stage"), h.get("reason"), h.get("message")]
                for h in st.get("history") or []
            ],
        ),
        (
            "Events",
            ["time", "type", "reason", "message"],
            [
                [
                    e.get("lastTimestamp") or e.get("eventTime"),
                    e.get("type"),
                    e.get("reason"),
                    e.get("message"),
                ]
                for e in data.events
            ],
        ),
    ]


def _title(data: RunData) -> str:
    name = (data.policy.get("metadata") or {}).get("name", "")
    return f"ProxyModePolicy {name}"


def to_html(data: RunData) -> str:
    phase = html.escape(str(data.status.get("phase", "Pending")))
    made = f"{data.now.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(_title(data))}</title><style>{CSS}</style></head><body>",
        f'<h1>{html.escape(_title(data))}: <span class="{phase}">{phase}</span></h1>',
        f'<p class="note">report made {made} UTC by kubectl proxymode.'
        f" {html.escape(data.prometheus_note)}</p>",
    ]
    tabs = tables(data)
    parts.append(f"<h2>{tabs[0][0]}</h2>{_rows(tabs[0][1], tabs[0][2])}")
    for ident, title, svg in figures(data):
        parts.append(
            f'<h2>{html.escape(title)}</h2><figure class="chart" id="chart-{ident}">{svg}</figure>'
        )
    for title, headers, rows in tabs[1:]:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(_rows(headers, rows) if rows else '<p class="note">none</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_cell(value: Any) -> str:
    return ("" if value is None else str(value)).replace("|", "\\|").replace("\n", " ")


def to_markdown(data: RunData) -> str:
    out = [f"# {_title(data)}: {data.status.get('phase', 'Pending')}", ""]
    made = f"{data.now.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
    out.append(f"_report made {made} UTC by kubectl proxymode. {data.prometheus_note}_")
    for ident, title, svg in figures(data):
        encoded = base64.b64encode(svg.encode()).decode()
        out += ["", f"## {title}", "", f"![{ident}](data:image/svg+xml;base64,{encoded})"]
    for title, headers, rows in tables(data):
        out += ["", f"## {title}", ""]
        if not rows:
            out.append("none")
            continue
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "---|" * len(headers))
        out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _shown(value: Any) -> Any:
    """A measured value as a person reads it: four significant digits (0.1911, not
    0.19106246759624274); anything else as it is."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return value
