"""Carry out the engine's actions against the API server. The only writes the operator makes.

Actions run in order; the first that the server refuses because the world moved on
(a failed JSON-patch ``test``, a label that is no longer what the engine saw, a 409)
stops the batch with ``Conflict``: the next look decides again from fresh reads. (Label
changes sent side by side with the refused one have been sent too; see below.)
Nothing is overwritten blindly: patches carry their preconditions, creates of objects
that exist are no-ops (the backup is never replaced), and deletes of missing objects
are fine.

Label changes next to each other in a batch, on different nodes, are sent side by side
(``LABEL_WRITERS`` at a time): at 1,000 nodes a look carries up to 10 % of them, and one
after the other they made the look seconds long (decision 0072).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from proxymode.api import models
from proxymode.engine.actions import (
    Action,
    ApplyObject,
    ClearAction,
    CreateJob,
    CreateObject,
    DeleteObject,
    EmitEvent,
    PatchObject,
    SaveBackup,
    SetNodeMode,
)
from proxymode.engine.observed import ACTION_ANNOTATION, MODE_LABEL

FIELD_MANAGER = "proxymode"
JSON_PATCH = "application/json-patch+json"
log = logging.getLogger(__name__)

EventSink = Callable[[EmitEvent], None]
NodeSink = Callable[[Mapping[str, Any]], None]
"""Takes the node a label change's PATCH answered with (as the server stored it)."""

LABEL_WRITERS = 8
"""Label changes of one batch in flight at once. Below the API client's connection pool
(``cpu_count * 5`` connections, 10 on two cores) so none opens a connection it then drops;
looks at other policies share that pool."""


class ConflictError(RuntimeError):
    """The world changed under an action; nothing after it in the batch ran, except label
    changes of its own run (sent at the same time, each with its own test)."""


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


_MAKING = threading.Lock()


class _Dynamic:
    """An API client's one DynamicClient, and the lock its discovery cache is filled under
    (kept on the API client itself, so it lives and goes with it)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.client = dynamic.DynamicClient(api)
        self.lock = threading.Lock()


def _dynamic(api: client.ApiClient) -> _Dynamic:
    found: _Dynamic | None = getattr(api, "_proxymode_dynamic", None)
    if found is None:
        with _MAKING:
            found = getattr(api, "_proxymode_dynamic", None)
            if found is None:
                found = _Dynamic(api)
                api._proxymode_dynamic = found  # type: ignore[attr-defined]
    return found


def dynamic_client(api: client.ApiClient) -> dynamic.DynamicClient:
    """One DynamicClient per API client, made once.

    An Executor is made for every look. Each used to build its own DynamicClient, whose
    discovery (read from its cache file, or from the API server) cost about a tenth of a
    look at 1,000 nodes (py-spy) for the same few built-in kinds every time.
    """
    return _dynamic(api).client


class Executor:
    """Applies actions for one policy."""

    def __init__(
        self,
        api: client.ApiClient,
        policy_name: str,
        events: EventSink,
        wrote_node: NodeSink | None = None,
    ) -> None:
        self.api = api
        self.wrote_node = wrote_node
        """Given each node a label change wrote, as the server answered: the node cache
        serves it until its watch has caught up (``ClusterCache.wrote_node``)."""
        self._dynamic = _dynamic(api)
        self.dyn = self._dynamic.client
        self.core = client.CoreV1Api(api)
        self.policy = policy_name
        self.events = events

    def run(self, actions: Sequence[Action]) -> int:
        """Carry out ``actions`` in order; returns how many succeeded before a conflict.

        A run of label changes on distinct nodes goes out side by side; the count stops at
        the first of them (in the engine's order) that was refused, even when later ones of
        that run went through: the next look reads what happened, as it would after any
        conflict. Every label change still carries its own test, so none overwrites what it
        did not see.
        """
        done = 0
        i = 0
        while i < len(actions):
            labels = label_run(actions, i)
            batch: Sequence[Action] = labels if len(labels) > 1 else actions[i : i + 1]
            errors = self._side_by_side(labels) if len(labels) > 1 else [self._try(actions[i])]
            _say_the_rest(batch, errors)
            for action, error in zip(batch, errors, strict=True):
                if error is None:
                    done += 1
                    continue
                if isinstance(error, ConflictError):
                    log.info("stopped at %s: %s", type(action).__name__, error)
                    return done
                if isinstance(error, ApiException) and error.status in (409, 422):
                    log.info(
                        "stopped at %s: %s %s", type(action).__name__, error.status, error.reason
                    )
                    return done
                raise error
            i += len(batch)
        return done

    def _try(self, action: Action) -> Exception | None:
        try:
            self._one(action)
        except Exception as e:  # judged by run(), in the batch's order
            return e
        return None

    def _side_by_side(self, labels: Sequence[SetNodeMode]) -> list[Exception | None]:
        with ThreadPoolExecutor(
            max_workers=min(LABEL_WRITERS, len(labels)), thread_name_prefix="labels"
        ) as pool:
            return list(pool.map(self._try, labels))

    def _resource(self, api_version: str, kind: str) -> Any:
        with self._dynamic.lock:  # its discovery cache is not safe to fill from two threads
            return self.dyn.resources.get(api_version=api_version, kind=kind)

    def _one(self, action: Action) -> None:
        if isinstance(action, SetNodeMode):
            self._set_node_mode(action)
        elif isinstance(action, SaveBackup | CreateObject | CreateJob):
            obj = action.job if isinstance(action, CreateJob) else action.obj
            self._create(obj)
        elif isinstance(action, ApplyObject):
            obj = dict(action.obj)
            resource = self._resource(obj["apiVersion"], obj["kind"])
            self.dyn.server_side_apply(
                resource,
                body=obj,
                namespace=obj["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
            )
        elif isinstance(action, PatchObject):
            resource = self._resource(action.api_version, action.kind)
            self.dyn.patch(
                resource,
                body=list(action.ops),
                name=action.name,
                namespace=action.namespace,
                content_type=JSON_PATCH,
                field_manager=FIELD_MANAGER,
            )
        elif isinstance(action, DeleteObject):
            self._delete(action)
        elif isinstance(action, EmitEvent):
            self.events(action)
        elif isinstance(action, ClearAction):
            # Only the value this look handled: a person's newer action (an abort set while a
            # slow look ran) fails the test (422, the batch stops) and is acted on next look,
            # instead of being erased unseen.
            resource = self._resource(f"{models.GROUP}/{models.VERSION}", models.KIND)
            path = "/metadata/annotations/" + ACTION_ANNOTATION.replace("~", "~0").replace(
                "/", "~1"
            )
            self.dyn.patch(
                resource,
                body=[
                    {"op": "test", "path": path, "value": action.value},
                    {"op": "remove", "path": path},
                ],
                name=self.policy,
                content_type=JSON_PATCH,
            )

    def _create(self, obj: Any) -> None:
        resource = self._resource(obj["apiVersion"], obj["kind"])
        try:
            self.dyn.create(
                resource,
                body=dict(obj),
                namespace=obj["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER,
            )
        except ApiException as e:
            if e.status != 409:  # exists: never replaced (a snapshot must stay the first one)
                raise

    def _delete(self, action: DeleteObject) -> None:
        resource = self._resource(action.api_version, action.kind)
        try:
            self.dyn.delete(
                resource,
                name=action.name,
                namespace=action.namespace,
                body={"propagationPolicy": "Background"},
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def _set_node_mode(self, action: SetNodeMode) -> None:
        """Change the label only if it is still what the engine saw: one JSON patch whose
        first op tests the label itself (``null`` for absent: the API server's json-patch
        passes it on a missing key and fails it on a present one).

        It used to read the node, then patch with a test of its resourceVersion: two
        requests a change, and a refusal whenever anything else (a status heartbeat, a
        person's other label) had touched the node in between. The node is now read only
        when a change is refused, to say why.
        """
        if action.value is None and action.expect is None:
            return  # absent, and to stay absent: nothing to write
        path = f"/metadata/labels/{_escape(MODE_LABEL)}"
        change: dict[str, Any] = (
            {"op": "remove", "path": path}
            if action.value is None
            else {"op": "add", "path": path, "value": action.value}
        )
        try:
            response = self.core.patch_node(
                action.node,
                [{"op": "test", "path": path, "value": action.expect}, change],
                _content_type=JSON_PATCH,
                _preload_content=False,
            )
        except ApiException as e:
            if e.status == 404:
                raise ConflictError(f"node {action.node} is gone") from e
            if e.status != 422:  # a failed test (or a missing labels map) is a 422, only
                raise
            self._refused(action, e)
            return
        self._answered(response)

    def _answered(self, response: Any) -> None:
        """Hand the written node to ``wrote_node`` (raw JSON: no ``V1Node`` model is built
        for an answer of which only the labels, readiness and version are read)."""
        if self.wrote_node is not None:
            self.wrote_node(json.loads(response.data))

    def _refused(self, action: SetNodeMode, error: ApiException) -> None:
        """A refused label change: why (the node read again), or the one case the single
        patch cannot do, a node with no labels at all (no parent for the test's path)."""
        try:
            response = self.core.read_node(action.node, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                raise ConflictError(f"node {action.node} is gone") from e
            raise
        meta = json.loads(response.data)["metadata"]  # type: ignore[attr-defined]
        labels = meta.get("labels")
        current = (labels or {}).get(MODE_LABEL)
        if current != action.expect:
            raise ConflictError(
                f"node {action.node}: label is {current!r}, expected {action.expect!r}"
            ) from error
        if labels:
            raise error  # the label is as expected and the patch was still refused
        # The map itself tested for absence (``null`` passes on a missing key, as above), not
        # the resourceVersion: on a new node the controllers' own writes (the TTL
        # annotation, the not-ready taint) refused that test in a CI run.
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/labels", "value": None},
            {"op": "add", "path": "/metadata/labels", "value": {MODE_LABEL: action.value}},
        ]
        self._answered(
            self.core.patch_node(action.node, ops, _content_type=JSON_PATCH, _preload_content=False)
        )


def _say_the_rest(batch: Sequence[Action], errors: Sequence[Exception | None]) -> None:
    """Errors after a run's first: ``run`` reports only the first (in the engine's order),
    and these changes were sent all the same, so their fate is logged here."""
    failed = [(a, e) for a, e in zip(batch, errors, strict=True) if e is not None]
    for action, error in failed[1:]:
        refused = isinstance(error, ConflictError) or (
            isinstance(error, ApiException) and error.status in (409, 422)
        )
        log.log(logging.INFO if refused else logging.WARNING, "beside it, %s: %r", action, error)


def label_run(actions: Sequence[Action], start: int) -> list[SetNodeMode]:
    """The label changes from ``start`` on, up to the first action of another kind or the
    second change of one node (that one must wait for the first: its test expects it)."""
    run: list[SetNodeMode] = []
    nodes: set[str] = set()
    for action in actions[start:]:
        if not isinstance(action, SetNodeMode) or action.node in nodes:
            break
        run.append(action)
        nodes.add(action.node)
    return run
