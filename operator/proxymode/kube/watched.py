"""List-then-watch: one kind kept current in memory, informer-style, from the API server.

Listed once (a cold start), then watched from that list's resourceVersion; a watch that
expires (410) or breaks lists again, and a refused one backs off instead of spinning. Each
item is kept in the reduced form its caller chooses. Used by ``kube.cache`` (nodes, pods,
Jobs) and ``kube.object_cache`` (DaemonSets and ConfigMaps).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import ReadTimeoutError

log = logging.getLogger(__name__)
T = TypeVar("T")
WATCH_SECONDS = 240
LIST_PAGE = 500
"""Items per page of a list (``limit``; the API server's own default page for kubectl)."""
READ_TIMEOUT_SECONDS = 90.0
"""A watch silent this long is taken as a dead connection (a half-open TCP stream would
otherwise block forever and the cache would never change again): the API server sends a
bookmark at least every minute (``allowWatchBookmarks``), so a live one never is. It is
watched again from the version it had, without a list."""


def comparable(version: str) -> bool:
    """A resourceVersion that compares as a number (KEP-5504: decimal, no leading zero)."""
    return (
        version.isascii() and version.isdigit() and (version == "0" or not version.startswith("0"))
    )


def at_least(version: str, other: str) -> bool:
    """``version`` is as new as ``other`` or newer; False when either does not compare."""
    return comparable(version) and comparable(other) and int(version) >= int(other)


def _backoff(failures: int) -> float:
    """Seconds before listing again after ``failures`` broken watches in a row: 1, 2, 4 … 30."""
    return float(min(30, 2 ** max(0, failures - 1)))


class Watched(Generic[T]):
    """One kind kept current by list-then-watch; ``items`` maps a name to its reduced form.

    A change calls ``on_change``; with ``wakes``, only a change to a name it accepts does.
    ``current`` is False from a broken, refused or silent watch until the next list or open
    watch (a backoff of up to 30 s): meanwhile what is kept may be behind by more than an
    event, and a caller that must not act on that can read the server instead. (A watch
    the server ends on time loses nothing: the next goes on from its version.)
    """

    def __init__(
        self,
        what: str,
        call: Callable[..., Any],
        reduce: Callable[[Mapping[str, Any]], T],
        on_change: Callable[[], None],
        *args: Any,
        wakes: Callable[[str], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        self.what = what
        self._wakes = wakes
        self._call, self._args, self._kwargs = call, args, kwargs
        self._reduce = reduce
        self._on_change = on_change
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        self._versions: dict[str, str] = {}
        """Each item's resourceVersion: a caller can tell whether it holds what a GET saw."""
        self._version = ""
        self._closed = threading.Event()
        self._response: Any = None
        self._current = False
        self.lists = 0
        self.watches = 0
        self.events = 0
        self._relist()  # a cold start lists once, before the first look reads
        self._thread = threading.Thread(target=self._run, name=f"watch-{what}", daemon=True)
        self._thread.start()

    @property
    def current(self) -> bool:
        return self._current and not self._closed.is_set()

    def items(self) -> list[T]:
        with self._lock:
            return list(self._items.values())

    def item(self, name: str) -> T | None:
        with self._lock:
            return self._items.get(name)

    def version(self, name: str) -> str | None:
        """The resourceVersion of ``name``'s item as kept, None if none is kept."""
        with self._lock:
            return self._versions.get(name)

    def seen(self, version: str) -> bool:
        """Whether the watch has got as far as ``version`` of this kind (resourceVersions of
        one resource compare as numbers, KEP-5504, GA in Kubernetes 1.35): events arrive
        in order, so every item kept is then at least as new as that version."""
        with self._lock:
            return at_least(self._version, version)

    def replace_if(self, name: str, keep: Callable[[T | None], bool], value: T) -> bool:
        """Put ``value`` in place of ``name``'s item if ``keep`` accepts the current one
        (under the lock, so no watch event slips in between). The kept resourceVersion
        stays: ``value`` must be of the same version (``keep`` checks it)."""
        with self._lock:
            if not keep(self._items.get(name)):
                return False
            self._items[name] = value
            return True

    def _relist(self) -> None:
        """List in pages of ``LIST_PAGE`` (one consistent snapshot: the pages share the first
        one's resourceVersion), reducing each page before the next is read: 5,000 pods
        decoded at once made the operator's peak memory, and Python keeps what it grew."""
        fresh: dict[str, T] = {}
        versions: dict[str, str] = {}
        token, version = "", ""
        while True:
            page = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
            response = self._call(*self._args, _preload_content=False, **page, **self._kwargs)
            data = json.loads(response.data)
            for item in data.get("items") or []:
                meta = item["metadata"]
                fresh[meta["name"]] = self._reduce(item)
                versions[meta["name"]] = str(meta.get("resourceVersion"))
            meta = data.get("metadata") or {}
            version = meta.get("resourceVersion", "")
            token = meta.get("continue") or ""
            del data, response
            if not token:
                break
        self.lists += 1
        with self._lock:
            before = self._items
            changed = [n for n in fresh.keys() | before.keys() if fresh.get(n) != before.get(n)]
            self._items, self._versions = fresh, versions
            self._version = version
        self._current = True
        if self.lists > 1 and any(self._wakes is None or self._wakes(n) for n in changed):
            self._on_change()

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                self._watch()
                failures = 0
            except ReadTimeoutError:
                self._current = False
                if self._closed.is_set():
                    return
                log.info(
                    "watch of %s silent for %.0fs; watching again", self.what, READ_TIMEOUT_SECONDS
                )
            except ApiException as e:
                self._current = False
                if self._closed.is_set():
                    return
                if e.status == 410:  # too old to resume from: list again at once
                    failures = 0
                    log.info("watch of %s expired; listing again", self.what)
                else:
                    # A refusal (a 403: a watch verb missing from the RBAC) fails again at
                    # once: without a pause this thread spins, list after refused watch,
                    # and starves the looks it feeds. The looks still list as a fallback.
                    failures += 1
                    log.warning(
                        "watch of %s refused (%s %s); listing again in %.0fs",
                        self.what,
                        e.status,
                        e.reason,
                        _backoff(failures),
                    )
                    self._closed.wait(_backoff(failures))
                self._safe_relist()
            except Exception as e:  # a broken connection: list again, then watch on
                self._current = False
                if self._closed.is_set():
                    return
                failures += 1
                log.info("watch of %s broke (%s); listing again", self.what, e)
                self._closed.wait(_backoff(failures))
                self._safe_relist()

    def _safe_relist(self) -> None:
        try:
            self._relist()
        except Exception as e:
            log.warning("listing %s failed: %s", self.what, e)
            self._closed.wait(2)

    def _watch(self) -> None:
        self.watches += 1
        self._response = self._call(
            *self._args,
            watch=True,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=(10, READ_TIMEOUT_SECONDS),
            **self._kwargs,
        )
        self._current = True
        try:
            for line in iter_resp_lines(self._response):
                if self._closed.is_set():
                    return
                self._apply(json.loads(line))
        finally:
            self._response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:  # too old: list again from now
                self._relist()
                return
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        meta = obj.get("metadata") or {}
        with self._lock:
            if meta.get("resourceVersion"):
                self._version = meta["resourceVersion"]
            if kind == "BOOKMARK":
                return
            self.events += 1
            name = meta["name"]
            before = self._items.get(name)
            if kind == "DELETED":
                self._items.pop(name, None)
                self._versions.pop(name, None)
                changed = before is not None
            else:
                after = self._reduce(obj)
                self._items[name] = after
                self._versions[name] = str(meta.get("resourceVersion"))
                changed = after != before
        if changed and (self._wakes is None or self._wakes(name)):
            self._on_change()

    def close(self) -> None:
        self._closed.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # older urllib3 has no shutdown; the server timeout ends it
                log.debug("could not interrupt the %s watch", self.what)
        self._thread.join(timeout=5)
