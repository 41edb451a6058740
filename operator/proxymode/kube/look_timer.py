"""How long each part of a look takes, wall and CPU (``proxymode_look_*`` metrics)."""

from __future__ import annotations

import time

from proxymode.telemetry import Telemetry


class LookTimer:
    """Times a look's parts one after the other (``proxymode_look_part_duration_seconds``):
    a whole look carries its actions (up to a tenth of a 1,000-node cluster's label
    changes), so its own time says little about what observing and deciding cost.

    Only looks that get to the end are recorded, every part and the look's own time (all
    but ``act``) together, so the part means add up to the own mean; a look that stops
    early (the policy gone, invalid or forbidden) or raises is in the whole-look histogram
    only."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.last = time.perf_counter()
        self.last_cpu = time.thread_time()
        self.parts: list[tuple[str, float, float]] = []

    def done(self, part: str) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.parts.append((part, now - self.last, cpu - self.last_cpu))
        self.last, self.last_cpu = now, cpu

    def flush(self) -> None:
        for part, seconds, _cpu in self.parts:
            self.telemetry.look_part_seconds.labels(part).observe(seconds)
        own = [(s, c) for p, s, c in self.parts if p != "act"]
        self.telemetry.look_own_seconds.observe(sum(s for s, _ in own))
        self.telemetry.look_cpu_seconds.observe(sum(c for _, c in own))
