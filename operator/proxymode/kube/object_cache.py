"""kube-proxy's DaemonSets and ConfigMaps, kept whole from watches, read-your-writes.

Every look reads five objects: the source and target DaemonSets, the source and target
ConfigMaps, the backup. At 1,000 nodes those GETs were more than half of the operator's
requests while nodes moved (docs/architecture.md). Here each namespace's DaemonSets and
ConfigMaps are listed once and kept current by a watch (``cache.Watched``), whole, as the
engine copies and patches them (less ``managedFields``, which it never reads), so a look
in steady state sends none of those requests.

A cache trails the API server by a watch event. That is harmless for what others write
(the next event wakes the daemon and the next look sees it), but a look right after the
operator's own write must not decide again from the state before it: it would repeat the
write (a no-op at best, a refused patch at worst) and, worse, judge the rollout on an
object it already changed. So an object the operator writes, or a policy whose batch was
refused, is marked *unsettled*: looks read it with a GET until the cache holds the same
``resourceVersion`` (or both say it is absent), then go back to the cache. This is the
informer pattern's "expectations", kept to the objects actually written. While a watch is
not open (broken or refused, up to 30 s of backoff), every read is a GET too.

Only objects some look has read are kept whole, and only their changes wake the daemons;
the rest of a namespace (kube-system's ConfigMaps can be many and large) is kept as name
and version.

A namespace whose list the RBAC refuses (a chart from before these verbs) is read with
GETs, as before, and tried again every ``REFUSED_RETRY_SECONDS``.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import astuple, dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.api.models import ProxyModePolicy
from proxymode.engine import naming
from proxymode.engine.actions import (
    Action,
    ApplyObject,
    CreateObject,
    DeleteObject,
    PatchObject,
    SaveBackup,
)
from proxymode.engine.observed import SPEC_WRITERS
from proxymode.kube.execute import FIELD_MANAGER
from proxymode.kube.watched import Watched

log = logging.getLogger(__name__)

Object = dict[str, Any]
Key = tuple[str, str, str]
"""(kind, namespace, name)."""

DAEMON_SET = "DaemonSet"
CONFIG_MAP = "ConfigMap"
KINDS = {DAEMON_SET: "apps/v1", CONFIG_MAP: "v1"}
REFUSED_RETRY_SECONDS = 300.0
STUB = "proxymode/stub"
"""Marks a kept item that holds only name and version (an object no look has read)."""


def kept(kind: str) -> Callable[[Mapping[str, Any]], Object]:
    """The form an object is kept in: as a GET returns it (a list's items carry no kind or
    apiVersion), without ``managedFields``."""

    def reduce(item: Mapping[str, Any]) -> Object:
        whole = item.get("metadata") or {}
        meta = {k: v for k, v in whole.items() if k != "managedFields"}
        kept_item = {**item, "apiVersion": KINDS[kind], "kind": kind, "metadata": meta}
        if kind == DAEMON_SET:
            kept_item[SPEC_WRITERS] = spec_writers(whole.get("managedFields") or [])
        return kept_item

    return reduce


def spec_writers(managed_fields: Iterable[Mapping[str, Any]]) -> list[str]:
    """The managers other than the operator's that own fields of the object's spec (a
    status subresource's entries own none): who edited what the operator renders."""
    return sorted(
        {
            str(entry.get("manager") or "(unnamed)")
            for entry in managed_fields
            if not entry.get("subresource")
            and entry.get("manager") != FIELD_MANAGER
            and "f:spec" in (entry.get("fieldsV1") or {})
        }
    )


def written(actions: Iterable[Action]) -> set[Key]:
    """The DaemonSets and ConfigMaps a batch of actions writes (or may have written)."""
    keys: set[Key] = set()
    for action in actions:
        if isinstance(action, ApplyObject | SaveBackup | CreateObject):
            meta = action.obj.get("metadata") or {}
            keys.add((str(action.obj.get("kind")), str(meta.get("namespace")), str(meta["name"])))
        elif isinstance(action, PatchObject | DeleteObject):
            keys.add((action.kind, action.namespace, action.name))
    return {k for k in keys if k[0] in KINDS}


@dataclass(frozen=True)
class PolicyObjects:
    """The DaemonSets and ConfigMaps a look at one policy reads (``kube.observe``), named
    once so that what a look reads and what a refused batch unsettles cannot differ."""

    source_daemon_set: Key
    target_daemon_set: Key
    source_config_map: Key
    target_config_map: Key
    backup: Key


def objects_of(policy: ProxyModePolicy) -> PolicyObjects:
    ref = policy.spec.kube_proxy
    mode = str(policy.spec.target_mode)
    name = str(policy.metadata.get("name", ""))
    ns = ref.namespace
    return PolicyObjects(
        source_daemon_set=(DAEMON_SET, ns, ref.daemon_set),
        target_daemon_set=(DAEMON_SET, ns, naming.target_daemon_set(ref.daemon_set, mode)),
        source_config_map=(CONFIG_MAP, ns, ref.config_map),
        target_config_map=(CONFIG_MAP, ns, naming.target_config_map(ref.config_map, mode)),
        backup=(CONFIG_MAP, ns, naming.backup_config_map(name)),
    )


def read_by(policy: ProxyModePolicy) -> set[Key]:
    """Every object ``objects_of`` names: what a refused batch unsettles."""
    return set(astuple(objects_of(policy)))


def read_object(api: client.ApiClient, key: Key) -> Object | None:
    """One GET, kept as the cache keeps it; None when it is absent."""
    kind, namespace, name = key
    call: Callable[..., Any] = (
        client.AppsV1Api(api).read_namespaced_daemon_set
        if kind == DAEMON_SET
        else client.CoreV1Api(api).read_namespaced_config_map
    )
    try:
        response = call(name, namespace, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return kept(kind)(json.loads(response.data))


def _version(obj: Mapping[str, Any] | None) -> str | None:
    return None if obj is None else str((obj.get("metadata") or {}).get("resourceVersion"))


class ObjectCache:
    """DaemonSets and ConfigMaps per namespace; ``get`` is a look's only way to read one."""

    def __init__(self, api: client.ApiClient, on_change: Callable[[], None]) -> None:
        self.api = api
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.on_change = on_change
        self._lock = threading.Lock()
        self._making = threading.Lock()
        self._watched: dict[tuple[str, str], Watched[Object]] = {}
        self._refused: dict[tuple[str, str], float] = {}
        self._unsettled: dict[Key, int] = {}
        """Unsettled objects, each with the count of the ``unsettle`` that marked it."""
        self._marks = 0
        self._wanted: set[Key] = set()
        self.gets = 0
        """GETs sent: for unsettled objects, and where the list was refused (benchmarks)."""

    def unsettle(self, keys: Iterable[Key]) -> None:
        """Read these with a GET until the cache shows what the GET shows."""
        with self._lock:
            for key in keys:
                self._marks += 1
                self._unsettled[key] = self._marks

    def get(self, kind: str, namespace: str, name: str) -> Object | None:
        """The object as the API server has it (None if absent); see the module's docstring."""
        key = (kind, namespace, name)
        with self._lock:
            self._wanted.add(key)
            mark = self._unsettled.get(key)
        watched = self._watch(kind, namespace)
        if watched is not None and mark is None and watched.current:
            held = watched.item(name)
            if held is None or STUB not in held:
                # A copy: what a look is handed is its own, as a GET's answer was.
                return copy.deepcopy(held)
        fresh = self._read(kind, namespace, name)
        if watched is None:
            return fresh
        if fresh is None:
            same = watched.item(name) is None
        else:
            # The same version: the GET's copy may stand in for a stub (a whole, read object).
            version = _version(fresh)
            same = watched.replace_if(
                name,
                lambda held: held is not None and _version(held) == version,
                copy.deepcopy(fresh),
            )
        if same:
            with self._lock:
                # Not if an ``unsettle`` came after this GET was sent (another look's write).
                if mark is not None and self._unsettled.get(key) == mark:
                    del self._unsettled[key]
        return fresh

    def _wakes(self, kind: str, namespace: str) -> Callable[[str], bool]:
        """Only a change to an object some look read wakes the daemons (a namespace's
        other ConfigMaps, a leader election's say, change often and matter to none)."""

        def wakes(name: str) -> bool:
            with self._lock:
                return (kind, namespace, name) in self._wanted

        return wakes

    def _reduce(self, kind: str, wanted: Callable[[str], bool]) -> Callable[..., Object]:
        """Objects a look reads are kept whole; the rest of the namespace (kube-system's
        ConfigMaps can be many and large: old Helm releases, status reports) as a stub of
        name and version, filled by the first GET of an object that becomes wanted."""
        whole = kept(kind)

        def reduce(item: Mapping[str, Any]) -> Object:
            meta = item.get("metadata") or {}
            if wanted(str(meta.get("name"))):
                return whole(item)
            return {STUB: True, "metadata": {k: meta.get(k) for k in ("name", "resourceVersion")}}

        return reduce

    def _watch(self, kind: str, namespace: str) -> Watched[Object] | None:
        where = (kind, namespace)
        with self._making:  # one list and watch per namespace, even when looks race
            with self._lock:
                found = self._watched.get(where)
                refused = self._refused.get(where, 0.0) > time.monotonic()
            if found is not None or refused:
                return found
            return self._start(kind, namespace)

    def _start(self, kind: str, namespace: str) -> Watched[Object] | None:
        call = (
            self.apps.list_namespaced_daemon_set
            if kind == DAEMON_SET
            else self.core.list_namespaced_config_map
        )
        wakes = self._wakes(kind, namespace)
        try:
            made = Watched(
                f"{kind.lower()}s/{namespace}",
                call,
                self._reduce(kind, wakes),
                self.on_change,
                namespace,
                wakes=wakes,
            )
        except ApiException as e:
            if e.status != 403:
                raise
            log.warning(
                "may not list %ss in %s (the chart's Role lacks list and watch): reading "
                "them one by one; trying again in %.0fs",
                kind,
                namespace,
                REFUSED_RETRY_SECONDS,
            )
            with self._lock:
                self._refused[(kind, namespace)] = time.monotonic() + REFUSED_RETRY_SECONDS
            return None
        with self._lock:
            self._watched[(kind, namespace)] = made
        return made

    def _read(self, kind: str, namespace: str, name: str) -> Object | None:
        self.gets += 1
        return read_object(self.api, (kind, namespace, name))

    def all(self) -> list[Watched[Object]]:
        with self._lock:
            return list(self._watched.values())

    def close(self) -> None:
        for watched in self.all():
            watched.close()
