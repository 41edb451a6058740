"""The kopf shell: thin handlers around ``Reconciler`` (``kopf run -m proxymode.handlers``).

- one daemon per policy looks again after however long the engine asked (seconds while
  nodes move, a minute when idle); spec edits wake it at once through kopf's own loop;
- the delete handler rolls a policy back before kopf removes its finalizer;
- every transition the engine reports becomes a Kubernetes Event on the policy.

kopf keeps its own bookkeeping in annotations under ``proxymode.io``; the rollout's state
lives in ``status`` and on node labels, never in this process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, cast

import kopf
from kubernetes import client, config

from proxymode.api import models
from proxymode.engine.actions import EmitEvent
from proxymode.kube.reconcile import Reconciler
from proxymode.telemetry import Telemetry

FINALIZER = "proxymode.io/finalizer"
log = logging.getLogger("proxymode")
_state: dict[str, Reconciler] = {}
_lock = threading.Lock()
telemetry = Telemetry()
"""The process's metrics; ``__main__`` serves them when ``--metrics-address`` is given."""


def _api_client() -> client.ApiClient:
    """In a pod: its ServiceAccount. Elsewhere: $KUBECONFIG (``make run``)."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        api: client.ApiClient = config.new_client_from_config(
            config_file=os.environ.get("KUBECONFIG")
        )
        return api


def reconciler() -> Reconciler:
    with _lock:
        if "r" not in _state:
            _state["r"] = Reconciler(_api_client(), events=_post_event, telemetry=telemetry)
        return _state["r"]


def _post_event(body: dict[str, Any], event: EmitEvent) -> None:
    kopf.event(
        cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message[:1024]
    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="proxymode.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="proxymode.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 60
    reconciler()


@kopf.daemon(models.GROUP, models.VERSION, models.PLURAL, cancellation_timeout=10.0)
def drive(name: str, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any) -> None:
    """Look at the policy again and again, as often as the engine asks."""
    driver = reconciler()
    while not stopped:
        try:
            outcome = driver.once(name)
        except Exception:  # one bad look must not end the daemon
            logger.exception("reconcile failed; trying again in 5s")
            stopped.wait(5)
            continue
        if outcome.gone:
            return
        stopped.wait(max(0.5, min(outcome.requeue_seconds, 60.0)))


@kopf.on.delete(models.GROUP, models.VERSION, models.PLURAL, retries=None, backoff=2)
def roll_back_on_delete(name: str, logger: kopf.Logger, **_: Any) -> None:
    """A policy deleted mid-rollout is rolled back before its finalizer goes.

    The handler drives the rollback itself for up to a minute at a time, then hands back
    to kopf (which records the attempt and calls again), so a long rollback neither blocks
    forever nor floods the log.
    """
    driver = reconciler()
    deadline = time.monotonic() + 60
    while True:
        outcome = driver.once(name, deleting=True)
        if outcome.release_finalizer:
            logger.info("nothing left to undo; releasing the finalizer")
            return
        if time.monotonic() > deadline:
            raise kopf.TemporaryError(
                f"still rolling back before the policy goes (phase {outcome.phase})", delay=1
            )
        time.sleep(max(0.5, min(outcome.requeue_seconds, 5.0)))
