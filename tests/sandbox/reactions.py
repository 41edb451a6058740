"""How fast the operator reacts to a person: pause, resume, a spec edit, abort.

Shared by ``test_wakeups.py`` (which asserts the behaviour) and ``benchmarks/wakeups.py``
(which prints the figures side by side with another build of the operator). Each action
is taken right after the policy entered the phase it acts on, that is right after a look:
an operator that only looks again when its requeue interval runs out (30 s while a stage
bakes or while paused) then answers only after that interval, one that is woken answers
at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch

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

    A watch opened before the change, not a poll: ``wait_phase`` polls every 0.5 s, which
    would round every reaction up to the next poll (the figures were all 0.51 s)."""
    custom = policies.custom
    version = custom.get_cluster_custom_object(G, V, P, name)["metadata"]["resourceVersion"]
    stream = watch.Watch()
    started = time.monotonic()
    change()
    try:
        for event in stream.stream(
            custom.list_cluster_custom_object,
            G,
            V,
            P,
            field_selector=f"metadata.name={name}",
            resource_version=version,
            timeout_seconds=int(timeout * PATIENCE),
        ):
            if ((event["object"].get("status") or {}).get("phase")) in phases:
                return time.monotonic() - started
    finally:
        stream.stop()
    # The watch ended (its timeout, or the server closed it): say where the policy is.
    policies.wait_phase(name, *phases, timeout=timeout)
    return time.monotonic() - started


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
