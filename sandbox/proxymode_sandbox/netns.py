"""The sandbox's own network: one bridge, one network namespace per real node or backend.

Every name carries a short id derived from the sandbox's state directory, so several
sandboxes on one machine never share a namespace, a link or an address, and ``down``
finds everything a sandbox made by that id alone, even when its state file is gone
(a crash):

- bridge ``pm<id>br``; host-side veths ``pm<id>n<k>`` (nodes) and ``pm<id>b<k>``
  (backends), all within the kernel's 15-character limit;
- namespaces ``pm-<id>-<name>``; inside each, the veth is ``eth0``.

Addresses come from one /24 per sandbox, ``10.250.<X>.0/24``: the host side of the
bridge is ``.1`` (the API server forwarder), nodes ``.11``-``.99``, backends ``.101``-``.199``.
Namespaces get no default route, only the bridge's /24 and a route for the Service
range onto the bridge (so a ClusterIP connect reaches netfilter's DNAT); the host does
not forward, so nothing leaves the machine.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NET_BASE = "10.250"
HOST_OCTET = 1
NODE_OCTETS = range(11, 100)
BACKEND_OCTETS = range(101, 200)
PREFIX_LEN = 24


class NetnsError(RuntimeError):
    """A namespace, link or address could not be made; the message has ``ip``'s answer."""


def sandbox_id(state_dir: Path) -> str:
    """Five hex digits naming this sandbox's network objects (stable for the directory)."""
    return hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:5]  # noqa: S324


def available() -> str | None:
    """None when this machine can make network namespaces, else why not (said once)."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    # Unique per process: parallel test workers and sandboxes probe at the same moment.
    probe = f"pm-probe-{os.getpid()}-{secrets.token_hex(2)}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@dataclass(frozen=True)
class Bridge:
    """One sandbox's bridge and its /24."""

    sid: str
    third_octet: int

    @property
    def name(self) -> str:
        return f"pm{self.sid}br"

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{NET_BASE}.{self.third_octet}.0/{PREFIX_LEN}")

    def address(self, octet: int) -> str:
        return f"{NET_BASE}.{self.third_octet}.{octet}"

    @property
    def host_ip(self) -> str:
        return self.address(HOST_OCTET)

    def netns(self, name: str) -> str:
        return f"pm-{self.sid}-{name}"

    def veth(self, kind: str, index: int) -> str:
        return f"pm{self.sid}{kind}{index}"

    def create(self) -> None:
        _run(["ip", "link", "add", self.name, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.host_ip}/{PREFIX_LEN}", "dev", self.name])
        _run(["ip", "link", "set", self.name, "up"])

    def attach(self, name: str, kind: str, index: int, octet: int, routes: Sequence[str]) -> str:
        """Make namespace ``name`` with ``eth0`` on the bridge at ``.octet``; returns its IP."""
        ns, host_end = self.netns(name), self.veth(kind, index)
        ip = self.address(octet)
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "link", "set", host_end, "master", self.name, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{ip}/{PREFIX_LEN}", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        for cidr in routes:
            _run(["ip", "-n", ns, "route", "add", cidr, "dev", "eth0"])
        return ip


def choose_octet(preferred: int | None) -> int:
    """A third octet whose 10.250.X.0/24 no interface on this machine uses yet."""
    used = _used_networks()
    candidates = ([preferred] if preferred is not None else []) + list(range(10, 250))
    for octet in candidates:
        if 0 < octet < 255 and f"{NET_BASE}.{octet}.0/{PREFIX_LEN}" not in used:
            return octet
    raise NetnsError(f"every {NET_BASE}.X.0/24 is in use on this machine")


def _used_networks() -> set[str]:
    out = _run(["ip", "-j", "-4", "addr", "show"], check=False).stdout or "[]"
    nets = set()
    for link in json.loads(out):
        for addr in link.get("addr_info", []):
            iface = ipaddress.IPv4Interface(f"{addr['local']}/{addr['prefixlen']}")
            nets.add(str(iface.network))
    return nets


def namespaces(sid: str) -> list[str]:
    """Every namespace of sandbox ``sid`` that exists now."""
    out = _run(["ip", "-j", "netns", "list"], check=False).stdout.strip() or "[]"
    return [n["name"] for n in json.loads(out) if n["name"].startswith(f"pm-{sid}-")]


def pids_in(ns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def teardown(sid: str) -> list[str]:
    """Delete every namespace and link of sandbox ``sid``; returns what it removed.

    Callers stop the processes inside first (``pids_in``); deleting a namespace
    removes its veth end and so the peer on the bridge.
    """
    removed = []
    for ns in namespaces(sid):
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    out = _run(["ip", "-j", "link", "show"], check=False).stdout.strip() or "[]"
    for link in json.loads(out):
        name = link.get("ifname", "")
        if name.startswith(f"pm{sid}"):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


def exec_argv(ns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``ns``."""
    return ["ip", "netns", "exec", ns, *argv]
