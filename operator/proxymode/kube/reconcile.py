"""One look at one policy: read it, observe the world, let the engine decide, act, store.

This is the glue between the pure engine and the API. It knows nothing of kopf: the
kopf handlers call ``Reconciler.once`` from a daemon (and from the delete handler), and
tests may call it directly.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from proxymode.api import models
from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.api.reasons import EventReason
from proxymode.engine.actions import EmitEvent
from proxymode.engine.machine import advance
from proxymode.kube import rounds
from proxymode.kube.execute import Executor
from proxymode.kube.observe import Observer
from proxymode.telemetry import Telemetry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What one look did: when to look again, and whether a deleted policy may go."""

    requeue_seconds: float
    release_finalizer: bool = False
    phase: str | None = None
    gone: bool = False


class Reconciler:
    """Drives policies through one API client."""

    def __init__(
        self,
        api: client.ApiClient,
        events: Callable[[dict[str, Any], EmitEvent], None] = lambda _body, _event: None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.observer = Observer(api)
        self.events = events
        self.telemetry = telemetry or Telemetry()

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            body = self.custom.get_cluster_custom_object(
                models.GROUP, models.VERSION, models.PLURAL, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(body)  # type: ignore[call-overload,no-any-return]

    def once(self, name: str, *, deleting: bool = False) -> Outcome:
        started = time.perf_counter()
        try:
            return self._once(name, deleting=deleting)
        except Exception:
            self.telemetry.reconcile_errors.inc()
            raise
        finally:
            self.telemetry.reconcile_seconds.observe(time.perf_counter() - started)

    def _once(self, name: str, *, deleting: bool) -> Outcome:
        body = self.read(name)
        if body is None:
            self.telemetry.forget(name)
            return Outcome(requeue_seconds=0, release_finalizer=True, gone=True)
        try:
            policy = ProxyModePolicy.model_validate(body)
        except ValidationError as e:
            # The API server's schema and CEL should have refused this; say so, act on nothing.
            message = f"the policy is invalid and was not acted on: {_first_error(e)}"
            self._store(name, {"phase": Phase.FAILED.value, "message": message})
            return Outcome(requeue_seconds=60, release_finalizer=deleting, phase=Phase.FAILED)
        deleting = deleting or bool(body["metadata"].get("deletionTimestamp"))
        now = datetime.now(UTC)
        try:
            observed = self.observer.observe(policy, deleting=deleting, now=now)
        except ApiException as e:
            if e.status != 403:
                raise
            # RBAC refuses a look (typically spec.kubeProxy.namespace is not one the chart
            # granted): say so where the user looks, change nothing, look again later.
            message = f"not allowed to read what this policy needs: {_forbidden(e)}"
            if policy.status.message != message:
                self.events(body, EmitEvent(EventReason.FORBIDDEN, message, "Warning"))
            self._store(name, {"message": message})
            # Still Pending: preflight never ran, so nothing was changed and a deleted
            # policy may go at once.
            pending = policy.status.phase == Phase.PENDING
            return Outcome(
                requeue_seconds=60 if not deleting else 5,
                release_finalizer=deleting and pending,
                phase=str(policy.status.phase),
            )
        if not deleting and rounds.round_due(policy, now):
            observed = replace(observed, analysis=rounds.run_round(self.api, policy, observed, now))
        decision = advance(policy, observed)
        executor = Executor(self.api, name, lambda event: self.events(body, event))
        executor.run(decision.actions)
        status = decision.status.model_dump(by_alias=True, mode="json", exclude_none=False)
        self._store(name, status)
        self.telemetry.looked(
            name,
            before=policy.status,
            after=decision.status,
            target_mode=str(policy.spec.target_mode),
            observed=observed,
            events=[a for a in decision.actions if isinstance(a, EmitEvent)],
        )
        return Outcome(
            requeue_seconds=decision.requeue_seconds,
            release_finalizer=decision.release_finalizer,
            phase=str(decision.status.phase),
        )

    def _store(self, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource; ``None`` values clear fields the engine dropped."""
        try:
            self.custom.patch_cluster_custom_object_status(
                models.GROUP, models.VERSION, models.PLURAL, name, {"status": status}
            )
        except ApiException as e:
            if e.status != 404:
                raise


def _forbidden(error: ApiException) -> str:
    """The API server's own sentence for a 403 (it names the verb, resource and namespace)."""
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or error.reason or "forbidden")[:500]


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')}"
