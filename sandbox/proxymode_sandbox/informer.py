"""A list-then-watch copy of one kind of object, for the sandbox's own long-running parts.

Why: the metrics simulator and the sandbox kubelet used to LIST their nodes and pods every
0.5-1 s, and read every kube-proxy ConfigMap a second, in every sandbox for the whole run.
Summed over a ``make test`` run that was a large part of kube-apiserver's CPU (and the
simulator's own JSON parsing), spent on objects that mostly did not change. An informer
lists once and then only receives what changes, as client-go's does; its readers work on
the local copy.

It keeps raw JSON objects (no model deserialisation: the readers want a few fields), keyed
by namespace and name. A watch that ends (its timeout, an API server restart, a 410 Gone)
is started again from the last resourceVersion seen, or from a new list when that version
is too old or the connection failed. While the API server is away, the copy keeps the last
state it saw, as a kubelet's does.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError

Key = tuple[str, str]

WATCH_SECONDS = 120
"""How long one watch request lasts before it is renewed from its last version."""
RETRY_SECONDS = 0.5
"""The pause before listing again after a failure (an API server restart)."""
LIST_TIMEOUT = (5, 60)
"""Connect and read timeouts of a list: a frozen API server fails it, and it is tried again."""
WATCH_TIMEOUT = (5, WATCH_SECONDS + 30)
"""Of a watch: the server ends it after ``WATCH_SECONDS`` and sends bookmarks meanwhile, so
a read that waits longer is a half-open connection (a frozen or vanished server)."""


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class Informer:
    """The objects one list call returns, kept current by a watch on a thread of its own.

    ``list_call`` is a kubernetes client list method (``CoreV1Api.list_node``); ``selectors``
    are passed to both the list and the watch (``label_selector``, ``field_selector``).
    ``changed`` is set whenever the copy changes; a reader clears it before it reads. Several
    informers may share one ``changed`` event, so a reader waits on all of them at once.
    """

    def __init__(
        self,
        list_call: Callable[..., Any],
        changed: threading.Event | None = None,
        **selectors: str,
    ) -> None:
        self._list_call = list_call
        self._selectors = selectors
        self._objects: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._response: Any = None
        self.synced = threading.Event()
        """Set once the first list is in: until then ``items()`` is not the cluster."""
        self.changed = changed if changed is not None else threading.Event()
        self.lists = 0
        """How many lists it made (the first, then one after each failure or 410)."""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch now: ``shutdown`` breaks the read under way (``close`` alone waits
        for the stream's next byte, up to a bookmark a minute away)."""
        self._halt.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # a stream that may be gone already
                response.shutdown()
        self._thread.join(timeout=5)

    def items(self) -> list[dict[str, Any]]:
        """The objects as last seen (a new list; the objects are shared, do not change them)."""
        with self._lock:
            return list(self._objects.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    # -- the thread --

    def _run(self) -> None:
        version = ""
        while not self._halt.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
            except (ApiException, HTTPError, OSError, ValueError) as e:
                version = ""
                if isinstance(e, ApiException) and e.status == 410:
                    continue  # too old: list again at once
                self._halt.wait(RETRY_SECONDS)
            except Exception as e:
                if self._halt.is_set():
                    return  # ``stop`` closed the stream under the read
                # Not a failure it knows: say so (the owner's log), and list again.
                print(f"informer: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                version = ""
                self._halt.wait(RETRY_SECONDS)

    def _list(self) -> str:
        raw = self._list_call(
            _preload_content=False, _request_timeout=LIST_TIMEOUT, **self._selectors
        )
        body = json.loads(raw.data)
        objects = {_key(o): o for o in body.get("items") or []}
        with self._lock:
            self._objects = objects
        self.lists += 1
        self.synced.set()
        self.changed.set()
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        """Follow one watch request until it ends; the version to go on from ("" to list)."""
        response = self._list_call(
            _preload_content=False,
            _request_timeout=WATCH_TIMEOUT,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            **self._selectors,
        )
        self._response = response
        heard = False
        try:
            if self._halt.is_set():
                return version  # stopped while the request was made
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._halt.is_set():
                    break
                if not line:
                    continue
                heard = True
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    # 410 Gone: list again at once; anything else after a pause (``_run``).
                    code = int(obj.get("code") or 500)
                    raise ApiException(status=code, reason=str(obj.get("message", "")))
                meta = obj.get("metadata") or {}
                version = str(meta.get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                with self._lock:
                    if kind == "DELETED":
                        self._objects.pop(_key(obj), None)
                    else:
                        self._objects[_key(obj)] = obj
                self.changed.set()
        finally:
            self._response = None
            response.close()  # a stream left part-read must not go back to the pool
        # A watch the server ended with not even a bookmark (sent about once a minute) is
        # one it could not serve from this version (an etcd restored to an older revision):
        # list again rather than watch from it forever.
        return version if heard else ""
