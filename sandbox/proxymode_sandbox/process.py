"""Start, watch and stop the sandbox's component processes.

Each component runs in its own session (so one signal reaches it and anything it
forks), logs to a file in the state directory, and is identified by pid *and* by
its command line naming the state directory, so a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 25


PORT_HOLD_SECONDS = 120.0
"""How long a port handed out stays reserved for the component it was meant for."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, and likely to stay free until the
    component it is for binds it.

    A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, which every
    outgoing connection draws from too: in a CI rehearsal (five sandboxes, thousands of
    client connections) kube-controller-manager found its port taken by one ("bind: address
    already in use") a moment after it was chosen. Ports are chosen below that range
    instead, where no connection is given one, and reserved for ``PORT_HOLD_SECONDS`` in a
    directory every sandbox process on the machine shares, so two sandboxes starting at
    once do not pick the same one. ``bind(0)`` is the fallback when no such port is free.
    """
    low, _ = _ephemeral_range()
    start, stop = max(1024, low - 12000), low
    holds = Path(tempfile.gettempdir()) / "proxymode-ports"
    holds.mkdir(exist_ok=True)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(start, stop)
        if _reserve(holds / str(port)) and _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
        return chosen


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _reserve(hold: Path) -> bool:
    """Take ``hold`` unless another caller took it within ``PORT_HOLD_SECONDS``."""
    if _create(hold):
        return True
    try:
        if time.time() - hold.stat().st_mtime < PORT_HOLD_SECONDS:
            return False
        hold.unlink()  # an old hold: its component bound the port long ago, or died
    except FileNotFoundError:
        pass
    return _create(hold)  # False: another caller took it over first


def _create(hold: Path) -> bool:
    try:
        os.close(os.open(hold, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class ProcessRecord:
    """What the state file keeps about one running component."""

    name: str
    pid: int
    log: Path

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "log": str(self.log)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcessRecord:
        return cls(name=str(data["name"]), pid=int(str(data["pid"])), log=Path(str(data["log"])))


GO_GC_PERCENT = "400"
"""``GOGC`` for what the sandbox starts (only Go programs read it: kube-apiserver, etcd, the
controllers, kwok, kube-proxy, Prometheus). Go's default, 100, collects each time the heap
doubles; 400 collects a fifth as often for more memory, a few hundred MB per sandbox on a
machine whose suite is bound by its 2 cores, not its 24 GiB. Measured side by side (two
sandboxes, tests/sandbox/test_gates.py in each at once): kube-apiserver 21.9 CPU-s against
24.6 (-11 %). A ``GOGC`` in the caller's environment wins."""


def start(
    name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> ProcessRecord:
    """Start ``argv`` detached from the caller's session, logging to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={"GOGC": GO_GC_PERCENT, **os.environ, **(env or {})},
        )
    return ProcessRecord(name=name, pid=proc.pid, log=log)


def _cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def argv_of(pid: int) -> list[str]:
    """The command line ``pid`` runs, argument by argument (to start it again the same way)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return raw.rstrip(b"\0").decode().split("\0")


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _reap(pid: int) -> None:
    """Collect a child we started in this process, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(record: ProcessRecord, marker: str) -> bool:
    """True when ``record.pid`` still runs the component we started.

    ``marker`` (the state directory) must appear in its command line; a pid that
    was recycled for an unrelated process does not count as alive.
    """
    _reap(record.pid)
    cmd = _cmdline(record.pid)
    deadline = time.monotonic() + 1.0
    # Right after Popen returns, the child may still be inside execve, when
    # /proc/<pid>/cmdline reads empty; give it a moment rather than call it dead.
    while cmd == "" and not _is_zombie(record.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
        cmd = _cmdline(record.pid)
    return cmd is not None and marker in cmd and not _is_zombie(record.pid)


def _ancestors() -> set[int]:
    """This process and its parents: ``make sandbox-down SANDBOX=/abs/dir`` names the
    directory too, and must not be stopped by the ``down`` it runs."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            break
        ppid = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")), "0")
        pid = int(ppid)
    return found


def pids_referencing(marker: str) -> list[int]:
    """Every process whose command line mentions ``marker`` (the state directory),
    except this one and its ancestors."""
    found = []
    mine = _ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in mine:
            continue
        cmd = _cmdline(pid)
        if cmd and marker in cmd and not _is_zombie(pid):
            found.append(pid)
    return found


def stop_pids(pids: Sequence[int], grace_seconds: float = 10.0) -> None:
    """SIGTERM each process group, wait up to ``grace_seconds``, then SIGKILL."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    remaining = list(pids)
    while remaining and time.monotonic() < deadline:
        for pid in remaining:
            _reap(pid)
        remaining = [p for p in remaining if _cmdline(p) is not None and not _is_zombie(p)]
        if remaining:
            time.sleep(0.1)
    for pid in remaining:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)
    # Return only once they are gone (`make sandbox-down` promises that).
    deadline = time.monotonic() + 5.0
    while remaining and time.monotonic() < deadline:
        remaining = [p for p in remaining if _cmdline(p) is not None and not _is_zombie(p)]
        for pid in remaining:
            _reap(pid)
        if remaining:
            time.sleep(0.05)


def stop_popen(proc: subprocess.Popen[Any], grace_seconds: float = 10.0) -> None:
    """Stop a child this process started with ``Popen``: SIGTERM, then SIGKILL after
    ``grace_seconds``, and wait for it either way (no zombie, no ResourceWarning)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def kill_now(pid: int) -> None:
    """SIGKILL a process group, as a crash or an OOM kill would end it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _cmdline(pid) is not None and not _is_zombie(pid):
        _reap(pid)
        time.sleep(0.05)
    _reap(pid)
