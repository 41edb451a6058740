"""``report NAME -o FILE.html [--format markdown]``: one self-contained file about a run.

Reads the policy and its Events from the API, and from Prometheus (``--prometheus``, else the
policy's own ``analysis.prometheus.url``) the operator's own series over the run: each node's
mode (``proxymode_node_mode_info``) and each check's canary and baseline values
(``proxymode_analysis_check_value``). Without Prometheus the report still has the phase
timeline, the tables and the inventory, and says what is missing.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxymode.cli.client import ClientError, Cluster, Prometheus
from proxymode.cli.common import common_flags, connection

MAX_POINTS = 400


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        parents=[common_flags(output=False)],
        help="write a self-contained HTML or Markdown report of a run, with charts",
        description="kubectl proxymode report: the phase timeline, each node's mode over"
        " time, each check's canary and baseline values from Prometheus, preflight and"
        " inventory, in one file that needs no network to open.",
    )
    p.add_argument("name", help="the ProxyModePolicy")
    p.add_argument("-o", "--output", required=True, help="the file to write (FILE.html, FILE.md)")
    p.add_argument(
        "--format", choices=("html", "markdown"), default=None, help="default: by suffix"
    )
    p.add_argument("--prometheus", default=None, help="Prometheus URL (default: the policy's)")
    p.set_defaults(func=cmd_report)


def _series(prom: Prometheus, name: str, start: float, end: float) -> tuple[Any, Any]:
    step = max(1.0, (end - start) / MAX_POINTS)
    modes: dict[str, list[tuple[float, str]]] = {}
    for labels, points in prom.range("proxymode_node_mode_info == 1", start, end, step):
        node, mode = labels.get("node"), labels.get("mode")
        if node and mode:
            modes.setdefault(node, []).extend((t, mode) for t, _ in points)
    for samples in modes.values():
        samples.sort()
    values: dict[str, dict[str, list[tuple[float, float]]]] = {}
    query = f'proxymode_analysis_check_value{{policy="{name}"}}'
    for labels, points in prom.range(query, start, end, step):
        check, group = labels.get("check"), labels.get("group")
        if check and group:
            values.setdefault(check, {})[group] = points
    return modes, values


def cmd_report(args: argparse.Namespace) -> int:
    try:
        from proxymode.cli import document  # noqa: PLC0415 - matplotlib only when reporting
    except ImportError as e:  # matplotlib is the `cli` extra
        raise ClientError(f"report needs matplotlib: pip install 'proxymode[cli]' ({e})") from e
    cluster = Cluster(connection(args))
    policy = cluster.policy(args.name)
    events = cluster.events(args.name)
    now = datetime.now(UTC)
    data = document.RunData(policy=policy, events=events, now=now)
    url = args.prometheus or (
        ((policy.get("spec") or {}).get("analysis") or {}).get("prometheus") or {}
    ).get("url")
    note = "no Prometheus: node modes and check values over time are not shown."
    modes: Any = {}
    values: Any = {}
    if url:
        start, end = data.window
        try:
            prom = cluster.prometheus(str(url))
            modes, values = _series(prom, args.name, start - 30, end + 30)
            planned = {n for s in data.status.get("stages") or [] for n in s.get("nodes") or []}
            if planned:  # the operator reports every node it knows; keep this run's
                modes = {n: p for n, p in modes.items() if n in planned}
            note = f"series from Prometheus at {prom.shown}."
        except ClientError as e:
            note = f"{e}; no series over time are shown."
            print(f"warning: {note}", file=sys.stderr)
    data = document.RunData(
        policy=policy,
        events=events,
        now=now,
        node_modes=modes,
        check_series=values,
        prometheus_note=note,
    )
    fmt = args.format or ("markdown" if args.output.endswith((".md", ".markdown")) else "html")
    text = document.to_markdown(data) if fmt == "markdown" else document.to_html(data)
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as e:
        raise ClientError(f"cannot write {args.output}: {e}") from e
    print(f"wrote {args.output} ({fmt}, {len(text) // 1024} KiB)")
    return 0
