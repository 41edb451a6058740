"""One readiness probe, as a kubelet runs it: httpGet or tcpSocket against the pod's IP."""

from __future__ import annotations

import socket
import urllib.request
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
