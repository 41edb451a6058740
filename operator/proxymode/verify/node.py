"""``proxymode verify-node``: run on a node (the verification Job), prove its kube-proxy.

Reads what the node's kernel and kube-proxy say, again every half second until the node
passes or the timeout ends: kube-proxy's ``/proxyMode`` and ``/metrics`` (first full sync
since start), the rules (``iptables-save -t nat``, ``nft list chains``, ``ip -o link``), and
a TCP connect to the verification Service's ClusterIP. The verdict (``report.judge``) is
written as JSON to the termination-message file and printed; the exit code is the verdict
(0 verified, 1 not), so a node without a termination message (kwok) still says it.

It needs hostNetwork and NET_ADMIN (reading netfilter); it changes nothing on the node.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from proxymode.verify.parse import NodeReading, ProbeOutcome, read_rules
from proxymode.verify.report import Report, judge

POLL_SECONDS = 0.5
CONNECT_SECONDS = 1.0
TOOL_SECONDS = 60.0


def _run(argv: Sequence[str], errors: list[str]) -> str:
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, check=False, timeout=TOOL_SECONDS
        )
    except FileNotFoundError:
        errors.append(f"{argv[0]} is not installed in the verification image")
        return ""
    except subprocess.TimeoutExpired:
        errors.append(f"{' '.join(argv)} did not answer in {TOOL_SECONDS:.0f}s")
        return ""
    if proc.returncode != 0 and argv[0] == "iptables-save":
        errors.append(f"iptables-save failed: {proc.stderr.strip()[:200]}")
    return proc.stdout


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:  # noqa: S310 - node-local
            return str(answer.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def probe(target: str, address: str, timeout: float = CONNECT_SECONDS) -> ProbeOutcome:
    """One TCP connect to ``address`` (``ip:port``)."""
    host, _, port = address.rpartition(":")
    began = time.monotonic()
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except TimeoutError:
        return ProbeOutcome(target, address, error=f"timed out after {timeout:.0f}s")
    except OSError as e:
        return ProbeOutcome(target, address, error=f"refused ({e.strerror or e})")
    return ProbeOutcome(target, address, ok=True, millis=(time.monotonic() - began) * 1000)


def read_node(metrics_urls: Sequence[str]) -> NodeReading:
    errors: list[str] = []
    mode = metrics = None
    for base in metrics_urls:
        mode = _get(f"{base}/proxyMode")
        if mode is not None:
            metrics = _get(f"{base}/metrics") or ""
            break
    reading = read_rules(
        nat=_run(["iptables-save", "-t", "nat"], errors),
        chains=_run(["nft", "list", "chains"], errors),
        links=_run(["ip", "-o", "link", "show"], errors),
        metrics=metrics or "",
        mode=mode,
    )
    return NodeReading(**{**reading.__dict__, "errors": tuple(errors)})


def verify(args: argparse.Namespace) -> Report:
    began = time.monotonic()
    deadline = began + args.timeout
    while True:
        reading = read_node(args.metrics)
        if reading.mode == args.mode and reading.synced_after_start:
            reading = NodeReading(
                **{**reading.__dict__, "probe": probe(args.service, args.address)}
            )
        report = judge(reading, args.node, args.mode, args.previous, time.monotonic() - began)
        if report.ok or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    if not report.ok:
        waited = f"not verified after {args.timeout:.0f}s"
        report = Report(**{**report.__dict__, "summary": f"{waited}: {report.summary}"})
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="proxymode verify-node", description=__doc__)
    p.add_argument("--node", default=os.environ.get("NODE_NAME", socket.gethostname()))
    p.add_argument("--mode", required=True, help="the mode the node must run now")
    p.add_argument("--previous", required=True, help="the mode it left")
    p.add_argument("--service", required=True, help="namespace/name:port, for the record")
    p.add_argument("--address", required=True, help="the Service's ClusterIP:port to connect")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument(
        "--metrics",
        action="append",
        default=None,
        help="kube-proxy's metrics base URL (repeatable); default 127.0.0.1 then NODE_IP",
    )
    p.add_argument("--termination-log", default="/dev/termination-log")
    args = p.parse_args(argv)
    if not args.metrics:
        args.metrics = ["http://127.0.0.1:10249"]
        if ip := os.environ.get("NODE_IP"):
            args.metrics.append(f"http://{ip}:10249")
    report = verify(args)
    message = report.message()
    with contextlib.suppress(OSError):
        Path(args.termination_log).write_text(message)
    print(message, flush=True)
    print(
        f"{args.node}: {'verified' if report.ok else 'NOT verified'}: {report.summary}",
        file=sys.stderr,
        flush=True,
    )
    return 0 if report.ok else 1
