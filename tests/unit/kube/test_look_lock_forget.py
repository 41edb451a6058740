"""Forgetting a policy never lets two looks at one name run side by side (pure: the looks
are stand-ins; the sandbox test ``test_look_lock`` runs real ones on the API server)."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client

from proxymode.kube.reconcile import Outcome, Reconciler


class _Held(Reconciler):
    """A reconciler whose looks record themselves and wait until let go."""

    def __init__(self) -> None:
        super().__init__(client.ApiClient())
        self.running = 0
        self.most = 0
        self.entered = threading.Event()
        self.go = threading.Event()
        self._n = threading.Lock()

    def _timed(self, name: str, *, deleting: bool) -> Outcome:
        with self._n:
            self.running += 1
            self.most = max(self.most, self.running)
        self.entered.set()
        self.go.wait(5)
        with self._n:
            self.running -= 1
        return Outcome(requeue_seconds=1)


def test_forgetting_a_policy_whose_look_runs_keeps_the_lock_and_the_next_look_waits() -> None:
    rec = _Held()
    first = threading.Thread(target=rec.once, args=("p",))
    first.start()
    assert rec.entered.wait(5)
    rec.forget("p")  # its DELETED event, while a look still runs
    rec.entered.clear()
    second = threading.Thread(target=rec.once, args=("p",))
    second.start()
    assert not rec.entered.wait(0.3), "the second look waits for the first"
    rec.go.set()
    for t in (first, second):
        t.join(5)
    assert rec.most == 1


def test_a_lock_forgotten_before_it_was_taken_is_not_looked_under() -> None:
    """``lock()`` returned, ``forget`` dropped it and another look registered a new one
    before this one acquired it: this look must take the registered lock, not its own."""
    rec = _Held()
    rec.go.set()
    stale = rec.lock("p")
    rec.forget("p")
    fresh = rec.lock("p")
    assert stale is not fresh
    calls: list[Any] = []
    real = rec.lock

    def lock_once_stale(name: str) -> Any:
        calls.append(name)
        return stale if len(calls) == 1 else real(name)

    rec.lock = lock_once_stale  # type: ignore[method-assign]
    rec.once("p")
    assert len(calls) == 2, "it went back for the registered lock"
