"""kube-proxy's DaemonSets and ConfigMaps from watches, on the real API server.

A look reads five of them; the cache must answer from memory in steady state, give the
operator its own writes at once even when its watch has not caught up (here: has stopped),
wake the daemons only for objects a look reads, and fall back to GETs where the RBAC
refuses the list (a chart from before these verbs).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from proxymode.engine.actions import ApplyObject, PatchObject
from proxymode.engine.observed import SPEC_WRITERS
from proxymode.kube.execute import Executor
from proxymode.kube.object_cache import CONFIG_MAP, DAEMON_SET, ObjectCache
from proxymode_sandbox import Sandbox
from tests.sandbox.harness import eventually, service_account_client

pytestmark = pytest.mark.sandbox


def _config_map(core: client.CoreV1Api, namespace: str, value: str) -> str:
    name = f"cm-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"a": value})
    )
    return name


def _data(cache: ObjectCache, namespace: str, name: str) -> dict[str, str] | None:
    obj = cache.get(CONFIG_MAP, namespace, name)
    return None if obj is None else dict(obj.get("data") or {})


def test_reads_come_from_the_watch_and_only_read_objects_wake(
    api: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    read = _config_map(core, namespace, "1")
    other = _config_map(core, namespace, "1")
    woken = threading.Event()
    cache = ObjectCache(api, woken.set)
    try:
        obj = cache.get(CONFIG_MAP, namespace, read)
        assert obj is not None and obj["data"] == {"a": "1"}
        assert obj["kind"] == "ConfigMap" and obj["apiVersion"] == "v1", "as a GET returns it"
        assert "managedFields" not in obj["metadata"]
        assert cache.get(CONFIG_MAP, namespace, "absent") is None
        core.patch_namespaced_config_map(other, namespace, {"data": {"a": "2"}})
        core.patch_namespaced_config_map(read, namespace, {"data": {"a": "2"}})
        eventually(
            lambda: _data(cache, namespace, read) == {"a": "2"}, timeout=30, what="the change"
        )
        assert woken.is_set(), "a change to an object a look read wakes the daemons"
        woken.clear()
        core.patch_namespaced_config_map(other, namespace, {"data": {"a": "3"}})
        marker = _config_map(core, namespace, "x")  # events arrive in order: after `other`'s
        eventually(
            lambda: cache.all()[0].item(marker) is not None, timeout=30, what="the later add"
        )
        assert not woken.is_set(), "a ConfigMap no look reads woke the daemons"
        for _ in range(20):  # twenty looks' worth of reads
            cache.get(CONFIG_MAP, namespace, read)
        assert cache.gets == 0, f"{cache.gets} GETs: steady-state reads come from the watch"
        assert [w.lists for w in cache.all()] == [1], "one list, then the watch"
        # `other` was kept as a stub (no look had read it): its first read is a GET that
        # fills the stub, the next come from the cache.
        assert _data(cache, namespace, other) == {"a": "3"}
        assert _data(cache, namespace, other) == {"a": "3"}
        assert cache.gets == 1, "one GET fills a stub"
    finally:
        cache.close()


def test_own_writes_are_read_fresh_until_the_watch_has_them(
    api: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    name = _config_map(core, namespace, "before")
    cache = ObjectCache(api, lambda: None)
    try:
        assert _data(cache, namespace, name) == {"a": "before"}
        (watched,) = cache.all()
        eventually(lambda: watched.watches, timeout=30, what="the watch to open")
        # A slow stream: the watch's events wait here instead of reaching the cache.
        held: list[Any] = []
        deliver = watched._apply
        watched._apply = held.append  # type: ignore[method-assign]
        key = (CONFIG_MAP, namespace, name)
        cache.unsettle({key})
        core.patch_namespaced_config_map(name, namespace, {"data": {"a": "after"}})
        assert _data(cache, namespace, name) == {"a": "after"}, "its own write, read fresh"
        assert _data(cache, namespace, name) == {"a": "after"}, "and again: still behind"
        assert cache.gets == 2
        assert watched.item(name)["data"] == {"a": "before"}, "the cache is behind"
        eventually(lambda: held, timeout=30, what="the write's event to arrive")
        watched._apply = deliver  # type: ignore[method-assign]
        for event in held:
            deliver(event)
        assert _data(cache, namespace, name) == {"a": "after"}  # a GET that settles it
        assert _data(cache, namespace, name) == {"a": "after"}
        assert cache.gets == 3, "settled: back to the cache"
    finally:
        cache.close()


def test_a_stopped_watch_is_not_trusted(
    api: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    """Between a broken watch and the next (a backoff of up to 30 s) the cache may be far
    behind what others wrote: reads go to the API server."""
    name = _config_map(core, namespace, "1")
    cache = ObjectCache(api, lambda: None)
    try:
        assert _data(cache, namespace, name) == {"a": "1"}
        (watched,) = cache.all()
        watched.close()
        core.patch_namespaced_config_map(name, namespace, {"data": {"a": "by a person"}})
        assert _data(cache, namespace, name) == {"a": "by a person"}
        assert watched.item(name)["data"] == {"a": "1"}, "the stopped watch has not got it"
    finally:
        cache.close()


def test_a_refused_list_falls_back_to_gets(
    sandbox: Sandbox, api: client.ApiClient, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    """A Role that grants get but not list (the chart before these verbs): each read is a
    GET, the look goes on, and nothing spins."""
    rbac = client.RbacAuthorizationV1Api(api)
    name = _config_map(core, namespace, "1")
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "get-only"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "get-only"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "get-only"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "get-only",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "get-only", "namespace": namespace}],
        },
    )
    weak = service_account_client(sandbox, core, namespace, "get-only", tmp_path)
    eventually(
        lambda: client.CoreV1Api(weak).read_namespaced_config_map(name, namespace),
        timeout=30,
        what="the binding to take effect",
    )
    cache = ObjectCache(weak, lambda: None)
    try:
        for _ in range(3):
            assert _data(cache, namespace, name) == {"a": "1"}
        assert cache.all() == [], "no watch without the list"
        assert cache.gets == 3, "each read a GET"
    finally:
        cache.close()


def _daemon_set(namespace: str, name: str, image: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"proxymode.test/none": "none"},  # no pod anywhere
                    "containers": [{"name": "kube-proxy", "image": image}],
                },
            },
        },
    }


def test_a_daemon_set_says_who_else_edited_its_spec(api: client.ApiClient, namespace: str) -> None:
    """``managedFields`` as the API server keeps them: the operator's own apply and patch
    are nobody else's; a person's ``kubectl set image`` is, until the operator's next apply
    of that field takes it back; a status write (the DaemonSet controller's) never is."""
    name = f"ds-{uuid.uuid4().hex[:6]}"
    run = Executor(api, "cache-test", lambda _: None).run
    apps = client.AppsV1Api(api)
    cache = ObjectCache(api, lambda: None)
    key = (DAEMON_SET, namespace, name)

    def writers() -> list[str]:
        cache.unsettle({key})  # read fresh: the answer must not wait for the watch
        obj = cache.get(*key)
        assert obj is not None
        assert "managedFields" not in obj["metadata"]
        return list(obj[SPEC_WRITERS])

    try:
        assert run([ApplyObject(_daemon_set(namespace, name, "k8s/kube-proxy:v1"))]) == 1
        strategy = [{"op": "add", "path": "/spec/updateStrategy", "value": {"type": "OnDelete"}}]
        assert run([PatchObject("apps/v1", "DaemonSet", namespace, name, strategy)]) == 1
        assert writers() == [], "the operator's own writes"
        apps.patch_namespaced_daemon_set_status(
            name, namespace, {"status": {"numberMisscheduled": 0}}, field_manager="kcm-test"
        )
        assert writers() == [], "a status write"
        apps.patch_namespaced_daemon_set(
            name,
            namespace,
            {
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [{"name": "kube-proxy", "image": "k8s/kube-proxy:hotfix"}]
                        }
                    }
                }
            },
            field_manager="kubectl-set",
        )
        assert writers() == ["kubectl-set"]
        assert run([ApplyObject(_daemon_set(namespace, name, "k8s/kube-proxy:v2"))]) == 1
        assert writers() == [], "the operator's apply took the image back"
    finally:
        cache.close()
        apps.delete_namespaced_daemon_set(name, namespace)
