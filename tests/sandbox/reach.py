"""Measuring a migration on real nodes: echo reachability per node, and per-node move times."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
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


LONE_SHARE = 0.05
"""The most lone misses (``Reachability._counted``) a node may have, as a share of its
samples; CI's worst run had 9 misses of any kind in 344 samples on one node (2.6 %)."""


@dataclass(frozen=True)
class Miss:
    """One sample echo did not answer, with what the node showed right after it."""

    at: float
    node: str
    code: int
    """curl's exit code: 28 timed out, 7 refused (a REJECT rule: no endpoints)."""
    seconds: float
    shown: str
    """Lines naming echo's ClusterIP in the node's iptables (every table) and in its
    nftables ``kube-proxy`` table, and how many backends answered a request to their own
    address from the node; or why that could not be read."""

    def line(self, since: float) -> str:
        return (
            f"{self.at - since:.1f}s {self.node}: curl {self.code} after {self.seconds:.1f}s;"
            f" {self.shown}"
        )


class Reachability:
    """One thread per node asks echo's ClusterIP every ``SAMPLE_SECONDS``; keeps each answer.

    After a miss, another thread reads what the node shows (echo's rules, the backends
    asked directly) while the sampling goes on at its own pace: the look at a miss never
    stretches how long the node counts as failing. One look per node at a time; a miss
    that comes while one runs is sampled as usual, only not looked at."""

    def __init__(self, box: Sandbox, nodes: list[str]) -> None:
        self.box, self.nodes = box, nodes
        self.samples: dict[str, list[tuple[float, bool]]] = {n: [] for n in nodes}
        self.misses: list[Miss] = []
        backends = box.real.state.get("real", {}).get("backends", {})
        self.backends = sorted(str(b["ip"]) for b in backends.values())
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in nodes]
        self.looking = {n: threading.Lock() for n in nodes}
        self.lookers: list[threading.Thread] = []

    def __enter__(self) -> Reachability:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.halt.set()
        for t in [*self.threads, *self.lookers]:
            t.join(timeout=10)

    def _run(self, node: str) -> None:
        url = f"http://{evidence.ECHO_CLUSTER_IP}/"
        while not self.halt.is_set():
            began = time.monotonic()
            proc = evidence.ask(self.box.exec, node, url, ECHO_TIMEOUT, MEASURING_PRIORITY)
            ok = proc.returncode == 0 and proc.stdout.startswith("echo-")
            self.samples[node].append((began, ok))
            if not ok and self.looking[node].acquire(blocking=False):
                args = (node, began, proc.returncode, time.monotonic() - began)
                looker = threading.Thread(target=self._missed, args=args, daemon=True)
                self.lookers.append(looker)
                looker.start()
            self.halt.wait(max(0.0, SAMPLE_SECONDS - (time.monotonic() - began)))

    def _missed(self, node: str, began: float, code: int, seconds: float) -> None:
        """What the node shows right after a miss: echo's rules, and the backends directly
        (a miss with the rules in place and no backend answering is the machine or the
        backends, not the node's Service rules)."""
        ip = evidence.ECHO_CLUSTER_IP
        try:
            ipt = self.box.exec(node, ["sh", "-c", f"iptables-save 2>/dev/null | grep -c -F {ip}"])
            nft = self.box.exec(
                node, ["sh", "-c", f"nft list table ip kube-proxy 2>/dev/null | grep -c -F {ip}"]
            )
            direct = sum(
                evidence.ask(
                    self.box.exec, node, f"http://{b}:{BACKEND_PORT}/", ECHO_TIMEOUT,
                    MEASURING_PRIORITY,
                ).stdout.startswith("echo-")
                for b in self.backends
            )  # fmt: skip
            shown = (
                f"echo's ClusterIP in {ipt.stdout.strip() or '?'} iptables lines,"
                f" {nft.stdout.strip() or '?'} nftables lines;"
                f" {direct} of {len(self.backends)} backends answer directly"
            )
        except Exception as e:  # a report's detail, never a lost sample
            shown = f"not read: {type(e).__name__}: {e}"
        finally:
            self.looking[node].release()
        self.misses.append(Miss(began, node, code, seconds, shown))

    def overlap(self) -> tuple[int, float]:
        """(most nodes failing at one moment, seconds with more than one failing).

        A sample is stamped when it starts and may take up to ``ECHO_TIMEOUT`` to fail, so
        two nodes' outages that follow each other can look as if they touched for a moment:
        a moment counts toward the most only when it lasts at least ``ECHO_TIMEOUT`` (the
        resolution of one sample). A real overlap lasts seconds (29 s, all three nodes,
        with verification off: decision 0080); the seconds with more than one failing are
        summed whatever their length. A lone miss counts as answered (``_counted``);
        ``flapping`` bounds them."""
        worst, more_than_one, _ = self._overlap()
        return worst, more_than_one

    def flapping(self, share: float = LONE_SHARE) -> dict[str, str]:
        """The nodes whose lone misses are more than ``share`` of their samples: a node
        that loses every other packet is failing, lone misses or not."""
        lone = self.lone_misses()
        return {
            n: f"{lone[n]} lone misses in {len(s)} samples"
            for n, s in self.samples.items()
            if lone[n] > share * len(s)
        }

    def lone_misses(self) -> dict[str, int]:
        """Per node, the misses between two answered samples: not counted as the node
        failing (see ``_counted``)."""
        return {n: sum(1 for i in _lone(s)) for n, s in self.samples.items()}

    def _counted(self) -> dict[str, list[tuple[float, bool]]]:
        """The samples as ``overlap`` counts them: a lone miss (the samples just before and
        after it answered) counts as answered.

        One sample waits ``ECHO_TIMEOUT`` (1 s), which is TCP's first SYN retransmission
        timeout: a lone miss is one lost or late packet, on a machine whose two cores run
        four sandboxes. A node without its Service rules fails every sample for as long as
        it is without them (a switch here: 3-5 s, a dozen samples in a row). CI's run of
        ebf78b6 saw one: canary-1, walked back 40 s earlier, missed one sample
        with echo's two iptables lines in place and its three backends answering directly,
        while general-1 switched. The test bounds the lone misses on their own."""
        counted = {}
        for node, samples in self.samples.items():
            lone = set(_lone(samples))
            counted[node] = [(t, ok or i in lone) for i, (t, ok) in enumerate(samples)]
        return counted

    def _overlap(self) -> tuple[int, float, list[tuple[float, float]]]:
        """``overlap`` and the spans that made its most (start, end)."""
        events = sorted((t, n, ok) for n, s in self._counted().items() for t, ok in s)
        counted: list[tuple[float, float]] = []
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
                    counted.append((span_start, t))
                span_start, span_most = None, 0
        if span_start is not None and last is not None and last - span_start >= ECHO_TIMEOUT:
            worst = max(worst, span_most)
            counted.append((span_start, last))
        return worst, more_than_one, counted

    def misses_in_overlaps(self, within: float = 2.0) -> list[str]:
        """The misses in (or ``within`` seconds of) the spans ``overlap`` counted, each with
        what its node showed: where a report should point."""
        counted, start = self._overlap()[2], self._start()
        near = [m for m in self.misses if any(a - within <= m.at <= b + within for a, b in counted)]
        return [m.line(start) for m in sorted(near, key=lambda m: m.at)]

    def worst_moments(self, limit: int = 5) -> list[str]:
        """When more than one node failed at once: the time (since the first sample) and
        the nodes, for a report that says where to look."""
        events = sorted((t, n, ok) for n, s in self._counted().items() for t, ok in s)
        start = events[0][0] if events else 0.0
        state: dict[str, bool] = {}
        out: list[str] = []
        for t, node, ok in events:
            state[node] = ok
            failing = sorted(n for n, v in state.items() if not v)
            if len(failing) > 1 and len(out) < limit:
                out.append(f"{t - start:.1f}s {failing}")
        return out

    def _start(self) -> float:
        return min((s[0][0] for s in self.samples.values() if s), default=0.0)

    def report(self) -> str:
        worst, seconds, counted = self._overlap()
        fails = {n: sum(not ok for _, ok in s) for n, s in self.samples.items()}
        counts = {n: len(s) for n, s in self.samples.items()}
        said = (
            f"at most {worst} nodes unable to reach echo at once ({seconds:.1f}s with more"
            f" than one); failed samples {fails} of {counts}, lone {self.lone_misses()}"
        )
        if worst > 1:
            start = self._start()
            spans = [f"{a - start:.1f}-{b - start:.1f}s" for a, b in counted]
            said += f"; counted at {spans}; the misses then: {self.misses_in_overlaps()[:20]}"
        return said


def _lone(samples: list[tuple[float, bool]]) -> Iterator[int]:
    """Indexes of the misses whose neighbours both answered (a first or last sample has
    one neighbour: a miss there is never lone, it may be an outage's edge)."""
    for i in range(1, len(samples) - 1):
        if not samples[i][1] and samples[i - 1][1] and samples[i + 1][1]:
            yield i


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
