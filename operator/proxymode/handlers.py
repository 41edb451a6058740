"""The kopf shell: thin handlers around ``Reconciler`` (``kopf run -m proxymode.handlers``).

- one daemon per policy looks again when woken (its spec or ``proxymode.io/action``
  changed, or a node, kube-proxy pod or cleanup Job it depends on did), and otherwise after
  however long the engine asked, which is only the fallback (``kube.wakeups``);
- the delete handler rolls a policy back before kopf removes its finalizer; it and the
  daemon never look at the same policy at once (``Reconciler.once`` holds a per-policy lock);
- every transition the engine reports becomes a Kubernetes Event on the policy.

The reconciler, its API client, the watch caches and the wake-ups live in kopf's ``memo``,
made on startup and closed on cleanup. kopf keeps its own bookkeeping in annotations under
``proxymode.io``; the rollout's state lives in ``status`` and on node labels, never in
this process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import kopf
from kubernetes import client, config

from proxymode.api import models
from proxymode.kube.cache import ClusterCache
from proxymode.kube.counted import count_requests
from proxymode.kube.events import EventPoster
from proxymode.kube.kubeconfig import kubectl_context
from proxymode.kube.peering import ensure_peering as _ensure_peering
from proxymode.kube.reconcile import Reconciler
from proxymode.kube.wakeups import Wakeups
from proxymode.telemetry import Telemetry

FINALIZER = "proxymode.io/finalizer"
MAX_REQUEUE_SECONDS = 60.0
"""The longest a daemon sleeps without a wake-up (the engine asks for 1-30 s, 60 when idle)."""
log = logging.getLogger("proxymode")
POOL_THREADS = 256
"""Threads for kopf's sync handlers and the looks the daemons run off the event loop."""
telemetry = Telemetry()
"""The process's metrics; ``__main__`` serves them when ``--metrics-address`` is given."""


CONNECTIONS = 32
"""The API client's connection pool. Each watch holds one for good (nodes, and per
kube-proxy namespace its pods, Jobs, DaemonSets and ConfigMaps), and a look's label changes
go out ``LABEL_WRITERS`` at a time beside other looks: the client's default pool (five per
CPU, ten on two cores) would be full, and every request past it would open a connection
only to drop it."""


def _api_client() -> client.ApiClient:
    """In a pod: its ServiceAccount. Elsewhere: $KUBECONFIG (``make run``)."""
    settings = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=settings)
    except config.ConfigException:
        config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG"),
            context=kubectl_context(),
            client_configuration=settings,
        )
    settings.connection_pool_maxsize = CONNECTIONS
    return client.ApiClient(settings)


def ensure_peering(name: str) -> None:
    """Before kopf starts: the peering object exists (``kube.peering``)."""
    api = _api_client()
    try:
        _ensure_peering(api, name)
    finally:
        api.close()


class _QuietWakeups(logging.Filter):
    """kopf logs every run of an event handler; the wake-up handler runs on every change."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "'policy_event' succeeded" not in record.getMessage()


logging.getLogger("kopf.objects").addFilter(_QuietWakeups())


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="proxymode.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="proxymode.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    # A look runs in a pool thread and the delete handler needs one too: kopf's default pool
    # (min(32, CPUs + 4) threads, 6 on two cores) left the seventh policy of the fault matrix
    # never looked at while others' looks waited on a slow API server.
    settings.execution.max_workers = POOL_THREADS
    wakeups = Wakeups()
    wakeups.bind(asyncio.get_running_loop())
    api = _api_client()
    count_requests(api, lambda *labels: telemetry.api_requests.labels(*labels).inc())
    cache = ClusterCache(api, on_change=wakeups.wake_all)
    memo.wakeups = wakeups
    memo.api = api
    memo.cache = cache
    # Not kopf.event: it names "default" as a cluster-scoped object's namespace, so `kubectl
    # describe pmp` found none of the policy's Events (kube.events).
    memo.events = EventPoster(api)
    memo.reconciler = Reconciler(api, events=memo.events.post, telemetry=telemetry, cache=cache)


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    """Stop the watches, drop the Prometheus clients (and their CA files), close the client."""
    reconciler = memo.get("reconciler")
    if reconciler is not None:
        reconciler.close()
    cache = memo.get("cache")
    if cache is not None:
        await asyncio.to_thread(cache.close)
    events = memo.get("events")
    if events is not None:
        await asyncio.to_thread(events.close)
    api = memo.get("api")
    if api is not None:
        api.close()


@kopf.on.event(models.GROUP, models.VERSION, models.PLURAL)
def policy_event(name: str, body: kopf.Body, type: str, memo: kopf.Memo, **_: Any) -> None:
    """A spec edit, an action annotation or a deletion wakes that policy's daemon at once.

    The policy gone from the server (``DELETED``): what the process kept for it goes too
    (its wake-up flag, lock, Prometheus client and state series), unless a policy of the
    same name was seen since; kopf stops the daemon when the deletion starts, so the
    daemon's own "gone" branch never runs for it."""
    wakeups: Wakeups | None = memo.get("wakeups")
    if type == "DELETED":
        uid = (body.get("metadata") or {}).get("uid")
        if wakeups is not None and not wakeups.gone(name, uid):
            return  # a policy of the same name was created since: what is kept is its own
        reconciler: Reconciler | None = memo.get("reconciler")
        if reconciler is not None:
            reconciler.forget(name)
        return
    if wakeups is not None:
        wakeups.policy_changed(name, body)


@kopf.daemon(models.GROUP, models.VERSION, models.PLURAL, cancellation_timeout=10.0)
async def drive(
    name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Look at the policy again and again: when woken, or as often as the engine asks."""
    driver: Reconciler = memo.reconciler
    wakeups: Wakeups = memo.wakeups
    wakeups.track(name)
    while not stopped:
        try:
            outcome = await asyncio.to_thread(driver.once, name)
        except Exception:  # one bad look must not end the daemon
            logger.exception("reconcile failed; trying again in 5s")
            await wakeups.wait(name, 5.0, stopped)
            continue
        if outcome.gone:
            wakeups.forget(name)
            driver.forget(name)
            return
        await wakeups.wait(
            name, max(0.5, min(outcome.requeue_seconds, MAX_REQUEUE_SECONDS)), stopped
        )


@kopf.on.delete(models.GROUP, models.VERSION, models.PLURAL, retries=None, backoff=2)
async def roll_back_on_delete(name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """A policy deleted mid-rollout is rolled back before its finalizer goes.

    The handler drives the rollback itself for up to a minute at a time, then hands back
    to kopf (which records the attempt and calls again), so a long rollback neither blocks
    forever nor floods the log. Between looks it waits for a wake-up, as the daemon does.
    """
    driver: Reconciler = memo.reconciler
    wakeups: Wakeups = memo.wakeups
    wakeups.track(name)
    deadline = time.monotonic() + 60
    never = asyncio.Event()
    while True:
        outcome = await asyncio.to_thread(driver.once, name, deleting=True)
        if outcome.release_finalizer:
            logger.info("nothing left to undo; releasing the finalizer")
            return
        if time.monotonic() > deadline:
            raise kopf.TemporaryError(
                f"not released yet: the policy goes once nothing is left to undo"
                f" (phase {outcome.phase}; status.message says what it waits for)",
                delay=1,
            )
        await wakeups.wait(name, max(0.5, min(outcome.requeue_seconds, 5.0)), never)
