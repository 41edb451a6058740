"""Probes as a kubelet runs them: httpGet or tcpSocket against the pod's IP; readiness
for every pod, liveness for the pods the sandbox runs as containers (``podrun``)."""

from __future__ import annotations

import socket
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any


def probe_once(probe: dict[str, Any], ip: str, container: dict[str, Any]) -> bool:
    timeout = float(probe.get("timeoutSeconds", 1))
    ports = {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}
    if "httpGet" in probe:
        get = probe["httpGet"]
        port = ports.get(get["port"], get["port"])
        scheme, host = get.get("scheme", "HTTP").lower(), get.get("host") or ip
        url = f"{scheme}://{host}:{port}{get.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - node address
                return 200 <= int(resp.status) < 400
        except OSError:
            return False
    if "tcpSocket" in probe:
        port = ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
        try:
            with socket.create_connection((ip, int(port)), timeout=timeout):
                return True
        except OSError:
            return False
    return True


@dataclass
class Liveness:
    """A container's liveness probe, as a kubelet runs it: from ``initialDelaySeconds``
    after the start, every ``periodSeconds``; ``failureThreshold`` failures in a row and the
    container is to be killed (once per start: ``failed`` then answers False)."""

    probe: dict[str, Any] = field(default_factory=dict)
    next_at: float = 0.0
    failures: int = 0
    fired: bool = False

    @classmethod
    def start(cls, container: dict[str, Any]) -> Liveness:
        probe = dict(container.get("livenessProbe") or {})
        delay = float(probe.get("initialDelaySeconds", 0))
        return cls(probe=probe, next_at=time.monotonic() + delay)

    def failed(self, container: dict[str, Any], ip: str) -> bool:
        if not self.probe or self.fired or time.monotonic() < self.next_at:
            return False
        self.next_at = time.monotonic() + float(self.probe.get("periodSeconds", 10))
        if probe_once(self.probe, ip, container):
            self.failures = 0
            return False
        self.failures += 1
        self.fired = self.failures >= int(self.probe.get("failureThreshold", 3))
        return self.fired
