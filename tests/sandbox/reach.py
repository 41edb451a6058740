"""Measuring a migration on real nodes: echo reachability per node, and per-node move times."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kubernetes import client

from proxymode_sandbox import Sandbox, evidence
from proxymode_sandbox.services import BACKEND_PORT, MEASURING_PRIORITY
from tests.sandbox.harness import Policies

SAMPLE_SECONDS = 0.15
ECHO_TIMEOUT = 1.0
"""How long one sample waits for echo's answer: the resolution of an outage's edges.

It was 0.5 s. On 2 cores shared with three other workers' sandboxes, one rehearsal saw
two nodes fail together for moments summing to 2 s, one of them walked back a minute
earlier; the cause was not found, and a curl that starts in a node's namespace and gets
its answer later than 0.5 s on a starved machine is the likeliest. A real overlap lasts
far longer (29 s, all three nodes, with verification off: decision 0080) and is still
caught at this resolution."""


@dataclass(frozen=True)
class Miss:
    """One sample echo did not answer, with what the node showed right after it."""

    at: float
    node: str
    code: int
    """curl's exit code: 28 timed out, 7 refused (a REJECT rule: no endpoints)."""
    seconds: float
    rules: int
    """Lines naming echo's ClusterIP in the node's rules, iptables and nftables together."""
    direct: int
    """Echo's backends that answered a request to their own address from the node."""

    def line(self, since: float) -> str:
        return (
            f"{self.at - since:.1f}s {self.node}: curl {self.code} after {self.seconds:.1f}s,"
            f" echo's ClusterIP in {self.rules} rule lines, {self.direct} backends answer directly"
        )


class Reachability:
    """One thread per node asks echo's ClusterIP every ``SAMPLE_SECONDS``; keeps each answer."""

    def __init__(self, box: Sandbox, nodes: list[str]) -> None:
        self.box, self.nodes = box, nodes
        self.samples: dict[str, list[tuple[float, bool]]] = {n: [] for n in nodes}
        self.misses: list[Miss] = []
        self.backends = sorted(str(b["ip"]) for b in box.real.state["real"]["backends"].values())
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in nodes]

    def __enter__(self) -> Reachability:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(timeout=10)

    def _run(self, node: str) -> None:
        while not self.halt.is_set():
            began = time.monotonic()
            url = f"http://{evidence.ECHO_CLUSTER_IP}/"
            proc = self.box.exec(
                node, [*MEASURING_PRIORITY, "curl", "-s", "-m", str(ECHO_TIMEOUT), url]
            )
            ok = proc.returncode == 0 and proc.stdout.startswith("echo-")
            self.samples[node].append((began, ok))
            if not ok:
                self._missed(node, began, proc.returncode, time.monotonic() - began)
            self.halt.wait(max(0.0, SAMPLE_SECONDS - (time.monotonic() - began)))

    def _missed(self, node: str, began: float, code: int, seconds: float) -> None:
        """What the node shows right after a miss: echo's rules, and the backends directly
        (a miss with the rules in place and no backend answering is the machine or the
        backends, not the node's Service rules)."""
        ip = evidence.ECHO_CLUSTER_IP
        rules = self.box.exec(
            node,
            ["sh", "-c", f"{{ iptables-save -t nat; nft list table ip kube-proxy; }} 2>/dev/null"
             f" | grep -c -F {ip}"],
        )  # fmt: skip
        direct = sum(
            self.box.exec(
                node, ["curl", "-s", "-m", str(ECHO_TIMEOUT), f"http://{b}:{BACKEND_PORT}/"]
            ).stdout.startswith("echo-")
            for b in self.backends
        )
        count = int(rules.stdout.strip() or 0)
        self.misses.append(Miss(began, node, code, seconds, count, direct))

    def overlap(self) -> tuple[int, float]:
        """(most nodes failing at one moment, seconds with more than one failing).

        A sample is stamped when it starts and may take up to ``ECHO_TIMEOUT`` to fail, so
        two nodes' outages that follow each other can look as if they touched for a moment:
        a moment counts toward the most only when it lasts at least ``ECHO_TIMEOUT`` (the
        resolution of one sample). A real overlap lasts seconds (29 s, all three nodes,
        with verification off: decision 0080); the seconds with more than one failing are
        summed whatever their length."""
        events = sorted((t, n, ok) for n, s in self.samples.items() for t, ok in s)
        state: dict[str, bool] = {}
        worst = int(any(not ok for _, _, ok in events))
        more_than_one, last = 0.0, None
        span_start: float | None = None  # when more than one node began failing at once
        span_most = 0
        for t, node, ok in events:
            failing = sum(not v for v in state.values())
            if last is not None and failing > 1:
                more_than_one += t - last
            state[node], last = ok, t
            now_failing = sum(not v for v in state.values())
            if now_failing > 1:
                span_start = t if span_start is None else span_start
                span_most = max(span_most, now_failing)
            elif span_start is not None:
                if t - span_start >= ECHO_TIMEOUT:
                    worst = max(worst, span_most)
                span_start, span_most = None, 0
        if span_start is not None and last is not None and last - span_start >= ECHO_TIMEOUT:
            worst = max(worst, span_most)
        return worst, more_than_one

    def misses_near(self, moments: list[float], within: float = 3.0) -> list[str]:
        """The misses within ``within`` seconds of the given moments (since the first
        sample), each with what its node showed: where a report should point."""
        start = min((s[0][0] for s in self.samples.values() if s), default=0.0)
        near = [m for m in self.misses if any(abs(m.at - start - t) <= within for t in moments)]
        return [m.line(start) for m in near]

    def worst_moments(self, limit: int = 5) -> list[str]:
        """When more than one node failed at once: the time (since the first sample) and
        the nodes, for a report that says where to look."""
        return [f"{t:.1f}s {failing}" for t, failing in self._moments(limit)]

    def _moments(self, limit: int) -> list[tuple[float, list[str]]]:
        events = sorted((t, n, ok) for n, s in self.samples.items() for t, ok in s)
        start = events[0][0] if events else 0.0
        state: dict[str, bool] = {}
        out: list[tuple[float, list[str]]] = []
        for t, node, ok in events:
            state[node] = ok
            failing = sorted(n for n, v in state.items() if not v)
            if len(failing) > 1 and len(out) < limit:
                out.append((t - start, failing))
        return out

    def report(self) -> str:
        worst, seconds = self.overlap()
        fails = {n: sum(not ok for _, ok in s) for n, s in self.samples.items()}
        counts = {n: len(s) for n, s in self.samples.items()}
        said = (
            f"at most {worst} nodes unable to reach echo at once ({seconds:.1f}s with more"
            f" than one); failed samples {fails} of {counts}"
        )
        if worst > 1:
            near = self.misses_near([t for t, _ in self._moments(5)])
            said += f"; the misses around those moments: {near[:20]}"
        return said


class MoveClock(threading.Thread):
    """When each node's label turned ``switching`` and when it was verified, from the API."""

    def __init__(self, api: client.ApiClient, policies: Policies, name: str) -> None:
        super().__init__(daemon=True)
        self.core = client.CoreV1Api(api)
        self.policies, self.name = policies, name
        self.switched: dict[str, float] = {}
        self.verified: dict[str, float] = {}
        self.arrived: dict[str, float] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.monotonic()
            for node in self.core.list_node().items:
                label = (node.metadata.labels or {}).get("proxymode.io/mode")
                if label == "switching":
                    self.switched.setdefault(node.metadata.name, now)
                elif label == "nftables":
                    self.arrived.setdefault(node.metadata.name, now)
            for entry in (self.policies.status(self.name).get("verification") or {}).get(
                "latest", []
            ):
                if entry["direction"] == "Forward" and entry["verified"]:
                    self.verified.setdefault(entry["node"], now)
            self.halt.wait(0.25)

    def per_node(self) -> dict[str, float]:
        """Seconds from ``switching`` to verified (to the target label, when not verified)."""
        done = self.verified or self.arrived
        return {n: done[n] - t for n, t in self.switched.items() if n in done}
