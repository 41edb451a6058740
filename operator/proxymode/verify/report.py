"""The verdict on one node, per mode pair, and its short JSON form (the Job's termination
message, read back by the operator). Pure.

A node is verified when all of these hold (DESIGN §3.5, kube-proxy.md §9):

1. kube-proxy answers ``/proxyMode`` with the expected mode and has completed a full sync
   since its process started (``kubeproxy_sync_proxy_rules_last_timestamp_seconds`` at or
   after ``process_start_time_seconds``): the start's cleanup of the other modes and the
   first programming of its own are over;
2. the expected mode's structures are present: ``KUBE-SERVICES`` (iptables), ``table ip
   kube-proxy`` (nftables), ``kube-ipvs0`` and ``KUBE-SERVICES`` (ipvs);
3. no other mode's structures are left: ``KUBE-SVC-*`` chains (iptables), a kube-proxy
   nftables table, the ``kube-ipvs0`` device (ipvs) — whichever mode the node came from;
4. a TCP connect to the verification Service's ClusterIP succeeds from the node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from proxymode.verify.parse import NodeReading, ProbeOutcome

MAX_MESSAGE = 4096
"""The kubelet keeps at most 4096 bytes of a termination message."""
VERSION = 1


@dataclass(frozen=True)
class Report:
    """The verdict, with the few figures people read in the Event and in status."""

    ok: bool
    node: str
    mode: str
    previous: str
    summary: str
    problems: tuple[str, ...] = ()
    first_sync_seconds: float | None = None
    services: int | None = None
    """Services the expected mode has programmed (nftables service chains, KUBE-SVC
    chains); None where the mode has no per-Service structure to count (ipvs)."""
    leftovers: dict[str, int] = field(default_factory=dict)
    probe_millis: float | None = None
    waited_seconds: float | None = None

    def message(self) -> str:
        """This report as the Job's termination message (compact JSON, within 4096 bytes)."""
        body: dict[str, Any] = {
            "v": VERSION,
            "ok": self.ok,
            "node": self.node,
            "mode": self.mode,
            "previous": self.previous,
            "summary": self.summary,
            "problems": list(self.problems),
            "firstSyncSeconds": _round(self.first_sync_seconds),
            "services": self.services,
            "leftovers": self.leftovers,
            "probeMillis": _round(self.probe_millis),
            "waitedSeconds": _round(self.waited_seconds),
        }
        text = json.dumps(body, separators=(",", ":"))
        while len(text.encode()) > MAX_MESSAGE and (body["problems"] or body["summary"]):
            if body["problems"]:
                body["problems"] = body["problems"][:-1]
            else:
                body["summary"] = body["summary"][: len(body["summary"]) // 2]
            text = json.dumps(body, separators=(",", ":"))
        return text


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def parse_report(text: str | None) -> Report | None:
    """A termination message back into a Report; None when it is not one of ours."""
    if not text:
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("v") != VERSION or "ok" not in body:
        return None
    leftovers = body.get("leftovers") or {}
    return Report(
        ok=bool(body["ok"]),
        node=str(body.get("node", "")),
        mode=str(body.get("mode", "")),
        previous=str(body.get("previous", "")),
        summary=str(body.get("summary", "")),
        problems=tuple(str(p) for p in body.get("problems") or ()),
        first_sync_seconds=_float(body.get("firstSyncSeconds")),
        services=int(body["services"]) if isinstance(body.get("services"), int) else None,
        leftovers={str(k): int(v) for k, v in leftovers.items() if isinstance(v, int)},
        probe_millis=_float(body.get("probeMillis")),
        waited_seconds=_float(body.get("waitedSeconds")),
    )


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _leftovers(reading: NodeReading, expected: str) -> dict[str, int]:
    """Other modes' structures still on the node, by what they are."""
    found: dict[str, int] = {}
    if expected != "iptables" and reading.iptables_svc_chains:
        found["iptables KUBE-SVC chains"] = reading.iptables_svc_chains
    if expected != "nftables" and reading.nft_tables:
        found["nftables kube-proxy tables"] = len(reading.nft_tables)
    if expected != "ipvs" and reading.ipvs_device:
        found["ipvs kube-ipvs0 device"] = 1
    return found


def _present(reading: NodeReading, expected: str) -> tuple[list[str], int | None, str]:
    """(problems, services counted, what was found) for the expected mode's structures."""
    if expected == "nftables":
        if "ip" not in reading.nft_tables:
            return ["table ip kube-proxy is missing"], None, ""
        return [], reading.nft_services, f"nftables table with {reading.nft_services:,} services"
    if expected == "ipvs":
        problems = [] if reading.ipvs_device else ["the kube-ipvs0 device is missing"]
        if not reading.iptables_services_chain:
            problems.append("the nat chain KUBE-SERVICES is missing")
        return problems, None, "kube-ipvs0 and KUBE-SERVICES present"
    if not reading.iptables_services_chain:
        return ["the nat chain KUBE-SERVICES is missing"], None, ""
    count = reading.iptables_svc_chains
    return [], count, f"iptables nat with {count:,} KUBE-SVC chains"


def _probe_text(probe: ProbeOutcome | None) -> tuple[str | None, str]:
    """(problem, what it found) for the Service probe."""
    if probe is None:
        return "no Service was probed", ""
    name = probe.target.split("/", 1)[-1]
    if probe.ok:
        return None, f"{name} reachable in {probe.millis or 0:.0f} ms"
    return f"{probe.target} {probe.error or 'did not answer'}", ""


def judge(
    reading: NodeReading,
    node: str,
    expected: str,
    previous: str,
    waited_seconds: float | None = None,
) -> Report:
    """The verdict on one reading. ``previous`` is the mode the node left (the same as
    ``expected`` for a hand-back, which changes the DaemonSet and not the mode)."""
    problems: list[str] = list(reading.errors)
    if reading.mode is None:
        problems.append("kube-proxy's metrics endpoint did not answer")
    elif reading.mode != expected:
        problems.append(f"kube-proxy runs in mode {reading.mode}, not {expected}")
    if not reading.synced_after_start:
        problems.append("kube-proxy has not completed a full sync since it started")
    missing, services, found = _present(reading, expected)
    problems.extend(missing)
    leftovers = _leftovers(reading, expected)
    problems.extend(f"{count:,} {what} left" for what, count in leftovers.items())
    probe_problem, probe_found = _probe_text(reading.probe)
    if probe_problem:
        problems.append(probe_problem)
    parts = []
    if (first := reading.first_sync_seconds) is not None:
        parts.append(f"first sync {first:.1f} s after start")
    if found:
        parts.append(found)
    if expected != "iptables":
        parts.append(f"{reading.iptables_svc_chains:,} iptables KUBE-SVC chains")
    if probe_found:
        parts.append(probe_found)
    summary = "; ".join(problems) if problems else "; ".join(parts)
    return Report(
        ok=not problems,
        node=node,
        mode=expected,
        previous=previous,
        summary=summary,
        problems=tuple(problems),
        first_sync_seconds=_round(reading.first_sync_seconds),
        services=services,
        leftovers=leftovers,
        probe_millis=_round(reading.probe.millis if reading.probe and reading.probe.ok else None),
        waited_seconds=_round(waited_seconds),
    )
