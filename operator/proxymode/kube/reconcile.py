"""One look at one policy: read it, observe the world, let the engine decide, act, store.

This is the glue between the pure engine and the API. It knows nothing of kopf: the
kopf handlers call ``Reconciler.once`` from a daemon (and from the delete handler), and
tests may call it directly.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3 import HTTPResponse
from urllib3.exceptions import HTTPError

from proxymode.api import models
from proxymode.api.models import Analysis, Phase, ProxyModePolicy
from proxymode.api.reasons import EventReason
from proxymode.engine.actions import Action, Decision, EmitEvent, SetNodeMode
from proxymode.engine.machine import advance
from proxymode.engine.observed import ACTION_ANNOTATION, Observed
from proxymode.engine.second_look import needs_second_look
from proxymode.engine.summary import refused
from proxymode.kube import object_cache, rounds, series
from proxymode.kube.cache import ClusterCache
from proxymode.kube.execute import Executor
from proxymode.kube.look_timer import LookTimer
from proxymode.kube.observe import Observer
from proxymode.kube.status_merge import merged as _merged
from proxymode.kube.wakeups import policy_key
from proxymode.telemetry import Telemetry

log = logging.getLogger(__name__)

FORBIDDEN_PREFIX = "not allowed to read what this policy needs"
"""How ``status.message`` starts while RBAC refuses a look's reads."""
REREAD_AFTER_SECONDS = 1.0
"""An analysis round longer than this is followed by a read of the policy (``_reread``)."""
UNREAD_RETRY_SECONDS = 5.0
"""How soon a look whose second read failed comes again (nothing was acted on)."""
PROMETHEUS_CLIENT_SECONDS = 300.0
"""How long a Prometheus client (its Secrets, its CA file) is kept before it is made again,
so a rotated credential is picked up without a read of the Secrets every round."""


@dataclass(frozen=True)
class Outcome:
    """What one look did: when to look again, and whether a deleted policy may go."""

    requeue_seconds: float
    release_finalizer: bool = False
    phase: str | None = None
    gone: bool = False


class Reconciler:
    """Drives policies through one API client.

    One look at a time per policy: the daemon and the delete handler may both call
    ``once`` for the same policy (kopf runs the delete handler while a daemon is still
    finishing its look), and two looks acting on one snapshot each would act twice.
    """

    def __init__(
        self,
        api: client.ApiClient,
        events: Callable[[dict[str, Any], EmitEvent], None] = lambda _body, _event: None,
        telemetry: Telemetry | None = None,
        cache: ClusterCache | None = None,
    ) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.observer = Observer(api, cache)
        self.events = events
        self.telemetry = telemetry or Telemetry()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._prometheus: dict[str, tuple[str, float, rounds.Prometheus]] = {}
        self.status_patches = 0
        self.status_unchanged = 0
        """Status patches sent, and those skipped because nothing changed (benchmarks)."""
        self.fresh = Observer(api) if cache is not None else None
        """Reads the server itself, for a decision that must not rest on a cache's copy."""
        self.second_looks = 0
        self.withdrawn = 0
        """Decisions read again from the server, and those the second read did not bear out."""
        self._counts = threading.Lock()

    def lock(self, name: str) -> threading.Lock:
        """The lock every look at ``name`` holds."""
        with self._locks_lock:
            return self._locks.setdefault(name, threading.Lock())

    def prometheus(self, name: str, analysis: Analysis) -> rounds.Prometheus:
        """The kept client for this policy and these settings (made again when they change)."""
        key = analysis.prometheus.model_dump_json()
        kept = self._prometheus.get(name)
        if kept is not None:
            if kept[0] == key and time.monotonic() - kept[1] < PROMETHEUS_CLIENT_SECONDS:
                return kept[2]
            kept[2].close()
            del self._prometheus[name]
        made = rounds.Prometheus(self.api, analysis)
        self._prometheus[name] = (key, time.monotonic(), made)
        return made

    def forget(self, name: str) -> None:
        """A policy went: drop its Prometheus client (and its CA file), its state series
        and its lock. A lock a look still holds stays, so no second look at the name can
        start beside it; that look (a daemon's, cancelled by kopf but still running in its
        thread) finds the policy gone when it stores and forgets it again."""
        self.telemetry.forget(name)
        self._drop_client(name)
        with self._locks_lock:
            held = self._locks.get(name)
            if held is not None and not held.locked():
                del self._locks[name]

    def _drop_client(self, name: str) -> None:
        kept = self._prometheus.pop(name, None)
        if kept is not None:
            kept[2].close()

    def close(self) -> None:
        """The operator stops: close every kept Prometheus client (their CA files go)."""
        for name in list(self._prometheus):
            self._drop_client(name)

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
        while True:
            lock = self.lock(name)
            with lock:
                # ``forget`` may have dropped the lock between ``lock()`` and the acquire,
                # and another look taken a new one: look only under the registered lock.
                with self._locks_lock:
                    registered = self._locks.setdefault(name, lock)
                if registered is lock:
                    return self._timed(name, deleting=deleting)

    def _timed(self, name: str, *, deleting: bool) -> Outcome:
        started = time.perf_counter()
        try:
            return self._once(name, deleting=deleting)
        except Exception:
            self.telemetry.reconcile_errors.inc()
            raise
        finally:
            self.telemetry.reconcile_seconds.observe(time.perf_counter() - started)

    def _once(self, name: str, *, deleting: bool) -> Outcome:
        clock = LookTimer(self.telemetry)
        body = self.read(name)
        if body is None:
            self.forget(name)
            return Outcome(requeue_seconds=0, release_finalizer=True, gone=True)
        try:
            policy = models.from_wire(body)
        except ValidationError as e:
            # The API server's schema and CEL should have refused this (a spec stored before
            # a CRD upgrade that added a rule); say so, act on nothing.
            message = f"the policy is invalid and was not acted on: {_first_error(e)}"
            backup = (body.get("status") or {}).get("backup")
            if backup:
                # A run that changed the cluster: its rollback needs a valid spec, and letting
                # the finalizer go would leave its nodes on the target with nobody to bring
                # them back (a review: a selector the new rules refuse, then a delete).
                message += (
                    f"; this run changed the cluster (snapshot {backup.get('namespace')}/"
                    f"{backup.get('name')}): nothing is done until the spec is fixed, then it"
                    " goes on from where it was (or rolls back, if deleted); the finalizer"
                    " stays until then"
                )
            if backup:
                # Only the words: the run's own phase stays, so it goes on (or rolls back)
                # from where it was once the spec is valid; Failed has no way back (a review
                # saw a rollback half done, a node without any kube-proxy, frozen there).
                self._store(name, {"message": message}, body)
            else:
                self._store(name, {"phase": Phase.FAILED.value, "message": message}, body)
            deleting = deleting or bool(body["metadata"].get("deletionTimestamp"))
            return Outcome(
                requeue_seconds=60, release_finalizer=deleting and not backup, phase=Phase.FAILED
            )
        clock.done("read")  # the GET and the parse of the policy
        deleting = deleting or bool(body["metadata"].get("deletionTimestamp"))
        now = datetime.now(UTC)
        try:
            observed = self.observer.observe(policy, deleting=deleting, now=now)
            clock.done("observe")
        except ApiException as e:
            if e.status != 403:
                raise
            return self._refused(name, body, policy, e, deleting=deleting, now=now)
        measured = self._measure(name, body, policy, observed, now=now, deleting=deleting)
        if measured is None:  # gone while its round ran: nothing is acted on
            self.forget(name)
            return Outcome(requeue_seconds=0, release_finalizer=True, gone=True)
        body, policy, observed = measured
        deleting = observed.deleting
        clock.done("measure")
        decision = advance(policy, observed)
        decision, observed = self._second_look(name, policy, observed, decision, deleting=deleting)
        said = decision.status.message or ""
        if said.startswith(FORBIDDEN_PREFIX) and said == policy.status.message:
            # Access is back (this look read everything): a phase that keeps its message
            # (Completed, RolledBack, a spec pause) would keep saying it was refused.
            decision.status.message = None
        clock.done("decide")
        done = self._act(name, body, policy, decision.actions)
        clock.done("act")
        status = decision.status.model_dump(by_alias=True, mode="json", exclude_none=False)
        if done < len(decision.actions):
            # The world moved under the batch: the next look decides again, and until one
            # succeeds the policy's generation does not count as observed.
            status["observedGeneration"] = policy.status.observed_generation
        if not self._store(name, status, body):
            # Gone while this look ran (a look kopf cancelled, still in its thread, after
            # the finalizer went): what the process keeps for the policy goes, not back in.
            self.forget(name)
            return Outcome(requeue_seconds=0, release_finalizer=True, gone=True)
        clock.done("store")
        self.telemetry.looked(
            name,
            before=policy.status,
            after=decision.status,
            target_mode=str(policy.spec.target_mode),
            observed=observed,
            events=[a for a in decision.actions if isinstance(a, EmitEvent)],
        )
        clock.done("record")
        clock.flush()
        return Outcome(
            requeue_seconds=decision.requeue_seconds,
            # Not when the batch stopped short: what it did not do (a label left on a node)
            # would be left for good once the policy is gone.
            release_finalizer=decision.release_finalizer and done == len(decision.actions),
            phase=str(decision.status.phase),
        )

    def _refused(
        self,
        name: str,
        body: dict[str, Any],
        policy: ProxyModePolicy,
        error: ApiException,
        *,
        deleting: bool,
        now: datetime,
    ) -> Outcome:
        """RBAC refuses a look (typically spec.kubeProxy.namespace is not one the chart
        granted): say so where the user looks, change nothing, look again later."""
        message = f"{FORBIDDEN_PREFIX}: {_forbidden(error)}"
        pending = policy.status.phase == Phase.PENDING
        if deleting and not pending:
            message += (
                "; the deletion waits (nodes may need walking back): grant the access"
                " again, or see docs/install.md#a-deletion-that-cannot-go-on"
            )
        if policy.status.message != message:
            self.events(body, EmitEvent(EventReason.FORBIDDEN, message, "Warning"))
        generation = int(body["metadata"].get("generation") or 0)
        held = refused(policy.status, message, generation, now)
        conditions = held.model_dump(by_alias=True, mode="json")["conditions"]
        self._store(name, {"message": message, "conditions": conditions}, body)
        # Still Pending: preflight never ran, so nothing was changed and a deleted policy
        # may go at once.
        return Outcome(
            requeue_seconds=60 if not deleting else 5,
            release_finalizer=deleting and pending,
            phase=str(policy.status.phase),
        )

    def _measure(
        self,
        name: str,
        body: dict[str, Any],
        policy: ProxyModePolicy,
        observed: Observed,
        *,
        now: datetime,
        deleting: bool,
    ) -> tuple[dict[str, Any], ProxyModePolicy, Observed] | None:
        """Prometheus's part of a look: the node series when due, the analysis round when
        due; after a slow round, the policy as it is now (``_reread``; None: it is gone)."""
        if series.due(policy, deleting=deleting):
            observed = replace(
                observed, series=series.look(policy, observed, partial(self.prometheus, name))
            )
        if deleting or not rounds.round_due(policy, now):
            return body, policy, observed
        started = time.monotonic()
        measured = rounds.run_round(self.api, policy, observed, now, partial(self.prometheus, name))
        observed = replace(observed, analysis=measured)
        if time.monotonic() - started > REREAD_AFTER_SECONDS:
            return self._reread(name, body, policy, observed)
        return body, policy, observed

    def _reread(
        self, name: str, body: dict[str, Any], policy: ProxyModePolicy, observed: Observed
    ) -> tuple[dict[str, Any], ProxyModePolicy, Observed] | None:
        """The policy again after a slow analysis round: an abort, a pause, a deletion or a
        spec edit made while Prometheus answered is acted on in this look, not the next one
        (a review waited 16 s for an abort behind a round of 4 s queries). What the engine
        reads of the policy through ``Observed`` (its action, generation, deletion) comes
        from this read too; the round is kept unless the analysis it measured was edited.
        None: the policy is gone. An unreadable or invalid read keeps the first."""
        try:
            fresh = self.read(name)
            if fresh is None:
                return None
            again = models.from_wire(fresh)
        except (ApiException, HTTPError, ValidationError) as e:
            log.info("policy %s: not read again after a slow round: %s", name, e)
            return body, policy, observed
        if policy_key(fresh) == policy_key(body):
            return body, policy, observed
        meta = fresh.get("metadata") or {}
        observed = replace(
            observed,
            action=(meta.get("annotations") or {}).get(ACTION_ANNOTATION),
            generation=int(meta.get("generation") or 0),
            deleting=observed.deleting or bool(meta.get("deletionTimestamp")),
        )
        if again.spec.analysis != policy.spec.analysis:
            observed = replace(observed, analysis=None)  # measured for the old checks
        return fresh, again, observed

    def _second_look(
        self,
        name: str,
        policy: ProxyModePolicy,
        observed: Observed,
        decision: Decision,
        *,
        deleting: bool,
    ) -> tuple[Decision, Observed]:
        """The decision again, on a read of the server, when it would roll back, pause or
        fail for what a cache showed (``engine.second_look``); the second one is acted on,
        and what it was decided from is what the look records.

        The analysis round and the series already taken are kept: they were read fresh, and
        a round measured twice would count twice. When the server cannot be read, nothing
        is acted on: the status says why and the policy is looked at again in a moment."""
        if self.fresh is None or not needs_second_look(policy.status, decision):
            return decision, observed
        with self._counts:
            self.second_looks += 1
        try:
            fresh = self.fresh.observe(policy, deleting=deleting, now=datetime.now(UTC))
        except (ApiException, HTTPError) as e:
            self.telemetry.second_looks.labels("unread").inc()
            refused = _forbidden(e) if isinstance(e, ApiException) and e.status == 403 else None
            pending = policy.status.phase == Phase.PENDING
            if refused is not None and decision.release_finalizer and pending:
                # The rule of a refused first look (``_once``): a deleted policy still
                # Pending where the operator may not read goes, or it could never go.
                log.warning("policy %s: deleted while Pending, refused a read: let go", name)
                return decision, observed
            # Kept the same from one try to the next (no error text, no countdown), so a
            # server out of reach for a while costs one status write, not one per try.
            error = f"HTTP {e.status}" if isinstance(e, ApiException) else type(e).__name__
            if refused is not None:
                error = f"{error}: {refused}"  # a refusal stays: say what was refused
            message = (
                f"could not confirm from the API server before acting ({error}); nothing was"
                f" done, looking again in {UNREAD_RETRY_SECONDS:.0f}s; the cache's copy calls"
                f" for {_verdict_code(decision)}"
            )
            log.warning("policy %s: %s: %s", name, message, e)
            held = policy.status.model_copy(update={"message": message})
            return Decision(status=held, requeue_seconds=UNREAD_RETRY_SECONDS), observed
        if observed.series is not None and {n.name for n in fresh.nodes} != {
            n.name for n in observed.nodes
        }:
            # The series were asked for the cache's nodes; ask again for the server's (not
            # a counted round: asking twice costs a query, nothing else).
            fresh = replace(
                fresh, series=series.look(policy, fresh, partial(self.prometheus, name))
            )
        else:
            fresh = replace(fresh, series=observed.series)
        fresh = replace(fresh, analysis=observed.analysis)
        again = advance(policy, fresh)
        if needs_second_look(policy.status, again):
            self.telemetry.second_looks.labels("confirmed").inc()
            log.info(
                "policy %s: read again from the server before acting: %s",
                name,
                _verdict(again),
            )
            return again, fresh
        with self._counts:
            self.withdrawn += 1
        self.telemetry.second_looks.labels("withdrawn").inc()
        log.warning(
            "policy %s: the cache's copy would have moved it to %s (%s); the server's does"
            " not bear that out, so it goes on as %s",
            name,
            decision.status.phase,
            _verdict(decision),
            again.status.phase,
        )
        return again, fresh

    def _act(
        self, name: str, body: dict[str, Any], policy: ProxyModePolicy, actions: Sequence[Action]
    ) -> int:
        """Run the engine's actions; what they write is read fresh until the cache has it."""
        cache = self.observer.cache
        answered: set[str] = set()

        def wrote_node(node: Mapping[str, Any]) -> None:
            if cache is not None:
                cache.wrote_node(node)
            answered.add(str(node["metadata"]["name"]))  # set.add: safe from writer threads

        executor = Executor(self.api, name, lambda event: self.events(body, event), wrote_node)
        touched = object_cache.written(actions)
        self._unsettle(touched)
        try:
            done = executor.run(actions)
        finally:
            # Again once the writes are in: a look in between may have found the cache
            # agreeing with the state before them.
            self._unsettle(touched)
            if cache is not None:
                # A label change the server answered is served from its answer; any other
                # (refused, failed, not sent) is read fresh until the watch has it.
                cache.unsettle_nodes(
                    a.node for a in actions if isinstance(a, SetNodeMode) and a.node not in answered
                )
        if done < len(actions):
            # Refused: what was decided on may itself have been a cache's stale copy.
            self._unsettle(object_cache.read_by(policy))
        return done

    def _unsettle(self, keys: set[object_cache.Key]) -> None:
        """The next looks read these with a GET until the watches have caught up."""
        if keys and self.observer.cache is not None:
            self.observer.cache.objects.unsettle(keys)

    def _store(self, name: str, status: dict[str, Any], body: dict[str, Any]) -> bool:
        """Merge-patch the status subresource; ``None`` values clear fields the engine dropped.

        Nothing is sent when the merge would change nothing: an idle policy's look writes
        nothing (and so wakes no watcher of policies, the operator's own included). When
        something changed, the whole status goes, not only the changed fields: a write that
        landed between this look's GET and its patch (a second replica's cancelled look, a
        person's edit of the subresource) is then replaced by one look's whole decision,
        never mixed with it field by field into a status no look decided. The server's
        answer, the whole policy (~170 KiB at 5,000 nodes), is read but not decoded. False:
        the policy is gone (404).
        """
        current = body.get("status") or {}
        if _merged(current, status) == current:
            self.status_unchanged += 1
            return True
        self.status_patches += 1
        try:
            answer = self.custom.patch_cluster_custom_object_status(
                models.GROUP,
                models.VERSION,
                models.PLURAL,
                name,
                {"status": status},
                _preload_content=False,
            )
            # The raw response (``_preload_content=False``): read to its end, not decoded.
            if isinstance(answer, HTTPResponse):
                answer.drain_conn()
                answer.release_conn()
        except ApiException as e:
            if e.status != 404:
                raise
            return False
        return True


def _verdict(decision: Decision) -> str:
    """What a decision does, in the words a person reads: the rollback's own reason while it
    rolls back, else the status message (a stuck rollback's Failed says why it is stuck)."""
    st = decision.status
    what = st.rollback_message if st.phase == Phase.ROLLING_BACK else None
    return f"{st.phase}: {what or st.message or ''}".rstrip(": ")


def _verdict_code(decision: Decision) -> str:
    """A decision's phase and typed reason (``RollingBack (KubeProxyUnhealthy)``): the same
    from one look to the next, unlike its message, which counts seconds. A deletion's
    release is named as such: its phase is only the one the policy was in."""
    st = decision.status
    if decision.release_finalizer:
        return f"letting the deleted policy go (in {st.phase})"
    reason: str | None = None
    if st.phase == Phase.ROLLING_BACK:
        reason = st.rollback_reason
    elif st.phase == Phase.PAUSED:
        reason = st.paused_reason
    elif st.history:
        reason = st.history[-1].reason
    return f"{st.phase} ({reason})" if reason else str(st.phase)


def _forbidden(error: ApiException) -> str:
    """The API server's own sentence for a refusal (a 403 names verb, resource, namespace)."""
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or error.reason or "forbidden")[:500]


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')}"
