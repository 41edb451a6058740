"""How fast the operator reacts to a person: pause, resume, a spec edit, abort.

Shared by ``test_wakeups.py`` (which asserts the behaviour) and ``benchmarks/wakeups.py``
(which prints the figures side by side with another build of the operator). Each action
is taken right after the policy entered the phase it acts on, that is right after a look:
an operator that only looks again when its requeue interval runs out (30 s while a stage
bakes or while paused) then answers only after that interval, one that is woken answers
at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from proxymode.api import models
from tests.sandbox.harness import PATIENCE, Policies

G, V, P = models.GROUP, models.VERSION, models.PLURAL
LONG_BAKE = [
    {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 3600},
    {"name": "all", "percent": 100, "bakeSeconds": 3600},
]


@dataclass(frozen=True)
class Reactions:
    """Seconds from each change to the phase it causes."""

    pause: float
    resume: float
    spec_edit: float
    abort: float


def _react(
    policies: Policies,
    name: str,
    phases: tuple[str, ...],
    timeout: float,
    change: Callable[[], object],
) -> float:
    """Seconds from ``change()`` to the watch event that shows one of ``phases``.

    The watch is open (its request answered) before the change is sent, from the
    resourceVersion read just before, so no event is missed and the figure holds only the
    change's own round trip besides the reaction. Not a poll: ``wait_phase`` polls every
    0.5 s, which rounded every reaction up to the next poll (the figures were all 0.51 s)."""
    custom = policies.custom
    version = custom.get_cluster_custom_object(G, V, P, name)["metadata"]["resourceVersion"]
    seconds = int(timeout * PATIENCE)
    response = custom.list_cluster_custom_object(
        G,
        V,
        P,
        field_selector=f"metadata.name={name}",
        resource_version=version,
        watch=True,
        timeout_seconds=seconds,
        _preload_content=False,
        _request_timeout=seconds + 10,
    )
    try:
        started = time.monotonic()
        change()
        seen = []
        for line in iter_resp_lines(response):
            event = json.loads(line)
            if event.get("type") == "ERROR":
                raise AssertionError(f"the watch of {name} ended: {event.get('object')}")
            phase = ((event.get("object") or {}).get("status") or {}).get("phase")
            seen.append(phase)
            if phase in phases:
                return time.monotonic() - started
    finally:
        response.release_conn()
    raise AssertionError(f"{name} did not reach {phases} within {seconds}s; phases seen: {seen}")


def measure(policies: Policies, namespace: str, timeout: float = 120) -> Reactions:
    """One policy through pause, resume, a stage edit (PlanChanged pauses it) and abort."""
    custom = client.CustomObjectsApi(policies.custom.api_client)
    name = policies.create(namespace, stages=LONG_BAKE)
    policies.wait_phase(name, "Analyzing", timeout=timeout)

    def patch(body: dict[str, Any]) -> Callable[[], object]:
        return lambda: custom.patch_cluster_custom_object(G, V, P, name, body)

    pause = _react(policies, name, ("Paused",), timeout, patch({"spec": {"paused": True}}))
    resume = _react(
        policies, name, ("Analyzing", "Progressing"), timeout, patch({"spec": {"paused": False}})
    )
    policies.wait_phase(name, "Analyzing", timeout=timeout)

    # A longer bake on the stage that runs changes nothing planned; a renamed later stage
    # does: the engine pauses with PlanChanged.
    edited = [LONG_BAKE[0], {**LONG_BAKE[1], "name": "everything"}]
    spec_edit = _react(policies, name, ("Paused",), timeout, patch({"spec": {"stages": edited}}))

    abort = _react(
        policies, name, ("RollingBack", "RolledBack"), timeout, lambda: policies.act(name, "abort")
    )
    policies.wait_phase(name, "RolledBack", timeout=timeout)
    return Reactions(pause=pause, resume=resume, spec_edit=spec_edit, abort=abort)
