"""Kubernetes Events about a policy, posted as the API server's own components post them.

A ProxyModePolicy is cluster-scoped. kopf's ``kopf.event`` posts its Events in ``default``
and writes that namespace into ``involvedObject`` too; ``kubectl describe pmp NAME`` looks
for ``involvedObject.namespace=""`` (a cluster-scoped object's), so it showed ``Events:
<none>`` for every policy. Events are posted here the way Node events are: stored in
``default``, the involved object without a namespace.

Posting is off the look's thread: a look's events go into a queue and one thread sends
them in order, so a slow API server delays the Events, never the rollout. An Event that
cannot be posted is logged and dropped (Events are auxiliary; the status says it all).
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.engine.actions import EmitEvent

log = logging.getLogger(__name__)

NAMESPACE = "default"
"""Where a cluster-scoped object's Events are kept (as the node controller keeps Node's)."""
COMPONENT = "proxymode"
MAX_MESSAGE = 1024
POST_TIMEOUT_SECONDS = 10.0
"""A hung POST must not hold every later Event behind it."""
QUEUE_SIZE = 10_000
"""Events waiting to be posted; beyond, new ones are dropped (and logged), never the look."""


def event_body(policy: Mapping[str, Any], event: EmitEvent, now: datetime) -> dict[str, Any]:
    """The core/v1 Event for ``event`` about ``policy`` (its wire body)."""
    meta = policy.get("metadata") or {}
    name = str(meta.get("name", ""))
    stamp = now.astimezone(UTC)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # As client-go's recorder names them: the object's name and a unique suffix.
            "name": f"{name}.{uuid.uuid4().hex[:16]}",
            "namespace": NAMESPACE,
        },
        "involvedObject": {
            "apiVersion": str(policy.get("apiVersion", "")),
            "kind": str(policy.get("kind", "")),
            "name": name,
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": _cut(event.message),
        "action": event.reason,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "eventTime": stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "count": 1,
    }


def _cut(message: str) -> str:
    """At most ``MAX_MESSAGE`` bytes of UTF-8 (the API server counts bytes), whole characters."""
    raw = message.encode()
    if len(raw) <= MAX_MESSAGE:
        return message
    return raw[: MAX_MESSAGE - 3].decode(errors="ignore") + "..."


class EventPoster:
    """Posts Events from a queue, in order, on a thread of its own."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._run, name="proxymode-events", daemon=True)
        self._thread.start()
        self.posted = 0
        self.dropped = 0

    def post(self, policy: Mapping[str, Any], event: EmitEvent) -> None:
        """Queue ``event`` about ``policy``; never blocks."""
        try:
            self._queue.put_nowait(event_body(policy, event, datetime.now(UTC)))
        except queue.Full:
            self.dropped += 1
            log.warning("event queue full; dropped %s: %s", event.reason, event.message)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            if body is None:
                return
            try:
                self.core.create_namespaced_event(
                    NAMESPACE,
                    body,  # type: ignore[arg-type]
                    _request_timeout=POST_TIMEOUT_SECONDS,
                )
                self.posted += 1
            except Exception as e:  # one Event lost, never the thread
                self.dropped += 1
                reason = e.status if isinstance(e, ApiException) else type(e).__name__
                log.warning("could not post an Event (%s): %s", reason, body.get("message"))

    def close(self, timeout: float = 5.0) -> None:
        """Post what is queued (for up to ``timeout`` seconds), then stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)
