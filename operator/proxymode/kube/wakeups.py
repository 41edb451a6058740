"""Wake-ups: a policy's daemon looks again as soon as something it depends on changed.

The engine asks for a requeue interval (seconds while nodes move, a minute when idle);
that interval is only the fallback. A change to the policy itself (its generation: any
spec edit, ``spec.paused`` included; its ``proxymode.io/action`` annotation; its deletion)
or to a node, kube-proxy pod or cleanup Job wakes the daemon at once. Wake-ups coalesce:
ten node changes during one look make one more look, not ten.

The events are ``asyncio.Event`` objects of kopf's loop; ``wake`` may be called from any
thread (the watch threads in ``kube.cache``), it hands over to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from proxymode.engine.observed import ACTION_ANNOTATION

PolicyKey = tuple[int, str | None, bool]


def policy_key(body: Mapping[str, Any]) -> PolicyKey:
    """What of a policy, when changed, must wake its daemon (not its own status patches)."""
    meta = body.get("metadata") or {}
    return (
        int(meta.get("generation") or 0),
        (meta.get("annotations") or {}).get(ACTION_ANNOTATION),
        bool(meta.get("deletionTimestamp")),
    )


class Wakeups:
    """One wake-up flag per policy, set from any thread, awaited by that policy's daemon."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._keys: dict[str, tuple[str | None, PolicyKey]] = {}
        """The uid and key of the policy last seen under each name (a name can be
        re-created: another uid's key is not compared with)."""
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.count = 0
        """How many wake-ups were delivered (for telemetry and benchmarks)."""

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _event(self, name: str) -> asyncio.Event:
        with self._lock:
            event = self._events.get(name)
            if event is None:
                event = self._events[name] = asyncio.Event()
            return event

    def track(self, name: str) -> None:
        """Keep ``name``'s wake-ups from now on, before its daemon first waits.

        ``wake_all`` (what the watch caches call) wakes the policies it knows; a daemon's
        first look, the one that creates the target pair and patches the source, ran before
        its first ``wait`` made the flag, so the changes it caused woke nothing and the next
        look came on the engine's 1 s fallback (a second of every walk's start, measured).
        """
        self._event(name)

    def policy_changed(self, name: str, body: Mapping[str, Any]) -> bool:
        """Wake ``name`` if what its daemon acts on changed since last seen; True if woken."""
        key = policy_key(body)
        uid = (body.get("metadata") or {}).get("uid")
        with self._lock:
            seen = self._keys.get(name)
            self._keys[name] = (uid, key)
        before = seen[1] if seen is not None and seen[0] in (None, uid) else None
        if before is not None and before != key:
            self.wake(name)
            return True
        return False

    def wake(self, name: str) -> None:
        event = self._event(name)
        self.count += 1
        loop = self._loop
        if loop is None or loop.is_closed():
            event.set()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(event.set)

    def wake_all(self) -> None:
        with self._lock:
            names = list(self._events)
        for name in names:
            self.wake(name)

    async def wait(self, name: str, timeout: float, stopped: Any) -> bool:
        """Sleep up to ``timeout`` s, less when woken or stopped; True if woken."""
        event = self._event(name)
        woken = asyncio.ensure_future(event.wait())
        halted = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait({woken, halted}, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            woken.cancel()
            halted.cancel()
        was_woken = event.is_set()
        event.clear()
        return was_woken

    def forget(self, name: str) -> None:
        with self._lock:
            self._events.pop(name, None)
            self._keys.pop(name, None)

    def gone(self, name: str, uid: str | None) -> bool:
        """The policy ``uid`` is gone from the server: forget ``name`` unless a newer
        policy of that name was seen since (kopf handles each object's events in its own
        worker, so an old policy's DELETED may come after its successor's first events).
        True if forgotten: what else the process keeps for ``name`` may go too."""
        with self._lock:
            seen = self._keys.get(name)
            if uid and seen is not None and seen[0] not in (None, uid):
                return False
        self.forget(name)
        return True
