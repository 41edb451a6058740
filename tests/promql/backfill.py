"""Deterministic kube-proxy and node_exporter history, backfilled into a real Prometheus.

``openmetrics()`` writes 20 minutes of scrapes (every 15 s from ``T0``) for a few nodes, in
the OpenMetrics text format ``promtool tsdb create-blocks-from openmetrics`` reads;
``serve()`` turns that text into TSDB blocks and runs ``prometheus`` over them, so a test
can ask the HTTP API what the analysis templates' queries give at ``EVAL_TIME``.

Why this shape:

- Every counter and bucket grows by the same amount every scrape, so over a window of
  whole scrape intervals ``rate``/``increase`` are exact (with or without Prometheus's
  extrapolation at the window's edges), and a histogram's per-second bucket rates keep the
  per-scrape proportions that the expected quantiles are worked out from.
- Every observation lies strictly inside one bucket, so which bucket it lands in never
  depends on float rounding.
- The time range is fixed (November 2023), so the test does not depend on the clock;
  ``serve()`` sets a retention long enough for Prometheus to keep such old blocks.
- Metric names, types, buckets and labels are kube-proxy's (reference/kube-proxy.md §1):
  ``ip_family`` as from 1.33 on, ``le`` values written as Go's text exposition writes
  them (``"1"``, ``"0.064"``), the node name in ``instance`` (the API's default node
  label), ``job`` telling kube-proxy from node_exporter.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

from proxymode_sandbox.process import free_port, stop_popen
from tests.tools import required

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z: the first scrape
STEP = 15  # seconds between scrapes
STEPS = 80  # 81 scrapes, T0 .. T0 + 20 min
EVAL_TIME = T0 + STEP * STEPS  # the last scrape; queries are evaluated here
WINDOW = 300  # the templates' window: 20 scrape intervals
INTERVALS_IN_WINDOW = WINDOW // STEP
# Counters do not start at 0: kube-proxy had been running for 10 minutes before T0.
INTERVALS_BEFORE_T0 = 40

NODE_LABEL = "instance"
SYNC = "kubeproxy_sync_proxy_rules_duration_seconds"
NETPROG = "kubeproxy_network_programming_duration_seconds"
CONNTRACK_ENTRIES = "node_nf_conntrack_entries"
CONNTRACK_LIMIT = "node_nf_conntrack_entries_limit"
LAST_QUEUED = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
LAST_SYNC = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
FAIL_RESTORE = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
FAIL_PARTIAL = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
FAIL_NFT = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
CLEANUP_NFT = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"  # not a sync failure

# ExponentialBuckets(0.001, 2, 15): 0.001 .. 16.384 (exact: 0.001 times a power of two).
SYNC_LE: tuple[float, ...] = tuple(0.001 * 2**i for i in range(15))
# 0.25, 0.5, every second 1..59, every 5 s 60..115, every 30 s 120..300.
NETPROG_LE: tuple[float, ...] = (
    0.25,
    0.5,
    *(float(s) for s in range(1, 60)),
    *(float(s) for s in range(60, 120, 5)),
    *(float(s) for s in range(120, 301, 30)),
)
KUBE_PROXY_CONNTRACK_MIN = 131072  # kube-proxy's default nf_conntrack_max floor

# (observed value, observations per scrape interval)
Observations = tuple[tuple[float, int], ...]


@dataclass(frozen=True)
class Node:
    """One node's kube-proxy and node_exporter, as seen at every scrape.

    ``failures`` maps a failure counter to (value at T0, growth per scrape interval); a
    counter not listed is not exported (kube-proxy 1.33+ exports a labelled vector only
    once it has failed). ``lags`` maps an IP family to how many seconds before each scrape
    the last change was queued and the last sync succeeded.
    """

    name: str
    mode: str
    syncs: Observations
    netprog: Observations
    conntrack_entries: int
    failures: Mapping[str, tuple[int, int]]
    lags: Mapping[str, tuple[int, int]]
    conntrack_limit: int = KUBE_PROXY_CONNTRACK_MIN
    other_counters: Mapping[str, tuple[int, int]] = field(default_factory=dict)


# The values are picked so that every template's answer can be worked out by hand; the
# derivations are in test_backfill.py next to the expectations.
CANARY = (
    Node(
        "c1",
        "nftables",
        syncs=((0.02, 14), (0.05, 1)),
        netprog=((0.8, 10), (1.5, 5)),
        conntrack_entries=16384,
        failures={FAIL_NFT: (2, 0)},  # failed twice before T0, not since
        lags={"IPv4": (2, 3)},
        other_counters={CLEANUP_NFT: (0, 5)},
    ),
    Node(
        "c2",
        "nftables",
        syncs=((0.02, 15),),
        netprog=((0.8, 12), (1.5, 3)),
        conntrack_entries=32768,
        failures={FAIL_NFT: (0, 1)},
        lags={"IPv4": (1, 4)},
    ),
    Node(
        "c3",
        "nftables",
        syncs=((0.02, 13), (0.05, 2)),
        netprog=((0.8, 9), (1.5, 5), (2.5, 1)),
        conntrack_entries=8192,
        failures={},  # never failed: the 1.33+ vector is not exported at all
        lags={"IPv4": (10, 5)},  # synced after the last queued change
    ),
)
BASELINE = (
    Node(
        "b1",
        "iptables",
        syncs=((0.1, 6), (0.2, 4)),
        netprog=((1.5, 5), (2.5, 8), (4.5, 2)),
        conntrack_entries=65536,
        failures={FAIL_RESTORE: (0, 1), FAIL_PARTIAL: (0, 2)},
        lags={"IPv4": (1, 6)},
    ),
    Node(
        "b2",
        "iptables",
        syncs=((0.1, 6), (0.2, 4)),
        netprog=((1.5, 5), (2.5, 8), (4.5, 2)),
        conntrack_entries=98304,
        failures={FAIL_RESTORE: (4, 0), FAIL_PARTIAL: (0, 0)},
        lags={"IPv4": (2, 4), "IPv6": (1, 8)},  # dual-stack, the IPv6 rules lag more
    ),
    Node(
        "b3",
        "iptables",
        syncs=((0.1, 6), (0.2, 3), (0.3, 1)),
        netprog=((1.5, 5), (2.5, 8), (4.5, 2)),
        conntrack_entries=32768,
        failures={FAIL_RESTORE: (0, 3), FAIL_PARTIAL: (0, 0)},
        lags={"IPv4": (1, 1)},
    ),
)
# "c1" is a regex prefix of "c10": an unanchored matcher would select it. Its values are
# far from everyone else's, so any query that picks it up gives a different answer.
DECOY = Node(
    "c10",
    "nftables",
    syncs=((20.0, 15),),  # beyond the highest finite bucket: +Inf only
    netprog=((400.0, 15),),
    conntrack_entries=130000,
    failures={FAIL_NFT: (0, 100)},
    lags={"IPv4": (1, 901)},
)
NODES = (*CANARY, *BASELINE, DECOY)


def _le(bound: float) -> str:
    """``le`` as Go's text exposition writes it (strconv 'g', shortest): 1, 0.25, 16.384."""
    return format(bound, "g")


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"


def _scrapes() -> range:
    return range(STEPS + 1)


def _ts(step: int) -> int:
    return T0 + STEP * step


def _kube_proxy(node: Node, family: str = "IPv4") -> dict[str, str]:
    return {"instance": node.name, "ip_family": family, "job": "kube-proxy"}


def _histogram(name: str, les: Sequence[float], nodes: Sequence[Node], attr: str) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    for node in nodes:
        observations: Observations = getattr(node, attr)
        labels = _kube_proxy(node)
        per_interval = [sum(n for v, n in observations if v <= le) for le in les]
        count = sum(n for _, n in observations)
        total = sum(v * n for v, n in observations)
        for step in _scrapes():
            k = INTERVALS_BEFORE_T0 + step
            ts = _ts(step)
            for le, n in zip(les, per_interval, strict=True):
                lines.append(f"{name}_bucket{_labels({**labels, 'le': _le(le)})} {n * k} {ts}")
            lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {count * k} {ts}")
            lines.append(f"{name}_sum{_labels(labels)} {total * k!r} {ts}")
            lines.append(f"{name}_count{_labels(labels)} {count * k} {ts}")
    return lines


def _counters(nodes: Sequence[Node]) -> list[str]:
    lines: list[str] = []
    names = sorted({c for n in nodes for c in (*n.failures, *n.other_counters)})
    for name in names:
        lines.append(f"# TYPE {name.removesuffix('_total')} counter")
        for node in nodes:
            start, growth = {**node.failures, **node.other_counters}.get(name, (-1, 0))
            if start < 0:
                continue
            for step in _scrapes():
                lines.append(
                    f"{name}{_labels(_kube_proxy(node))} {start + growth * step} {_ts(step)}"
                )
    return lines


def _sync_timestamps(nodes: Sequence[Node]) -> list[str]:
    lines: list[str] = []
    for name, which in ((LAST_QUEUED, 0), (LAST_SYNC, 1)):
        lines.append(f"# TYPE {name} gauge")
        for node in nodes:
            for family, lags in node.lags.items():
                labels = _labels(_kube_proxy(node, family))
                lines += [f"{name}{labels} {_ts(s) - lags[which]} {_ts(s)}" for s in _scrapes()]
    return lines


def _conntrack(nodes: Sequence[Node]) -> list[str]:
    lines: list[str] = []
    for name, attr in (
        (CONNTRACK_ENTRIES, "conntrack_entries"),
        (CONNTRACK_LIMIT, "conntrack_limit"),
    ):
        lines.append(f"# TYPE {name} gauge")
        for node in nodes:
            labels = _labels({"instance": node.name, "job": "node-exporter"})
            value = getattr(node, attr)
            lines += [f"{name}{labels} {value} {_ts(s)}" for s in _scrapes()]
    return lines


def openmetrics(nodes: Sequence[Node] = NODES) -> str:
    """All the nodes' scrapes as one OpenMetrics document: one block per metric family,
    each series' samples in time order (what promtool's backfill requires)."""
    lines = [
        *_histogram(SYNC, SYNC_LE, nodes, "syncs"),
        *_histogram(NETPROG, NETPROG_LE, nodes, "netprog"),
        *_counters(nodes),
        *_sync_timestamps(nodes),
        *_conntrack(nodes),
        "# EOF",
    ]
    return "\n".join(lines) + "\n"


def backfill(text: str, workdir: Path) -> Path:
    """Write ``text`` and turn it into TSDB blocks under ``workdir/tsdb``."""
    source = workdir / "history.om"
    source.write_text(text)
    tsdb = workdir / "tsdb"
    done = subprocess.run(
        [
            required("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "-q",
            str(source),
            str(tsdb),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"promtool backfill failed:\n{done.stdout}{done.stderr}"
    return tsdb


@contextmanager
def serve(tsdb: Path, workdir: Path, *, ready_timeout: float = 30.0) -> Iterator[str]:
    """Run ``prometheus`` over ``tsdb`` (no scrape targets) and yield its base URL; the
    process is stopped when the block exits, however it exits. The port is picked free just
    before the start; if another process takes it in between, start again on another."""
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  evaluation_interval: 1h\nscrape_configs: []\n")
    log_path = workdir / "prometheus.log"
    for _attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    required("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tsdb}",
                    "--storage.tsdb.retention.time=100y",  # keep the 2023 blocks
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            if _wait_ready(process, url, ready_timeout):
                yield url
                return
        finally:
            stop_popen(process)
        if "address already in use" not in log_path.read_text(errors="replace"):
            break
    raise AssertionError(f"prometheus did not become ready:\n{log_path.read_text()[-4000:]}")


def _wait_ready(process: subprocess.Popen[bytes], url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return True
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    return False
