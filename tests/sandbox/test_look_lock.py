"""One look at a time per policy: the daemon and the delete handler never overlap.

kopf may run a policy's delete handler while its daemon is still finishing a look; two
looks acting on two snapshots would act twice. ``Reconciler.once`` holds a per-policy
lock. Here two threads look at the same policy at once through a real reconciler on the
real API server; a spy around ``observe`` (it delegates, and holds each look open for a
moment so that an unguarded pair would certainly overlap) records when each look ran.
Looks at two different policies still run side by side.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes import client

from proxymode.kube.reconcile import Reconciler
from tests.sandbox.harness import KubeProxy, Policies

pytestmark = pytest.mark.sandbox
HOLD = 0.5


class SpyReconciler(Reconciler):
    """A real reconciler whose observe() records its interval per policy."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self.intervals: list[tuple[str, float, float]] = []
        real = self.observer.observe

        def observe(policy: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                time.sleep(HOLD)
                return real(policy, **kwargs)
            finally:
                self.intervals.append((policy.metadata["name"], started, time.monotonic()))

        self.observer.observe = observe  # type: ignore[method-assign]


def _overlap(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_daemon_and_delete_handler_never_look_at_once(
    api: client.ApiClient, policies: Policies, proxy: KubeProxy
) -> None:
    # Paused before preflight: every look observes and changes nothing.
    first = policies.create(proxy.namespace, paused=True)
    second = policies.create(proxy.namespace, paused=True)
    spy = SpyReconciler(api)
    threads = [
        threading.Thread(target=spy.once, args=(first,)),
        threading.Thread(target=spy.once, args=(first,), kwargs={"deleting": True}),
        threading.Thread(target=spy.once, args=(second,)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    same = [i for i in spy.intervals if i[0] == first]
    other = [i for i in spy.intervals if i[0] == second]
    assert len(same) == 2 and len(other) == 1, spy.intervals
    assert not _overlap(same[0], same[1]), f"two looks at {first} overlapped: {same}"
    assert any(_overlap(s, other[0]) for s in same), (
        f"looks at different policies were serialised too: {spy.intervals}"
    )
