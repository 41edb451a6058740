"""The sandbox's informer (a list, then a watch) on the real API server.

The metrics simulator and the sandbox kubelet read their nodes, pods and ConfigMaps from
it instead of listing them every second, so every sandbox test depends on it following
adds, changes and deletes, and on it coming back after kube-apiserver restarts (the fault
matrix and the real-node verify test restart it under a running simulator and kubelet).
"""

from __future__ import annotations

import functools
import uuid

from kubernetes import client

from proxymode_sandbox import Sandbox
from proxymode_sandbox.informer import Informer
from tests.sandbox.harness import eventually


def _data(informer: Informer, name: str) -> dict[str, str] | None:
    for obj in informer.items():
        if obj["metadata"]["name"] == name:
            return dict(obj.get("data") or {})
    return None


def test_an_informer_follows_adds_changes_and_deletes_from_one_list(
    core: client.CoreV1Api, namespace: str
) -> None:
    informer = Informer(functools.partial(core.list_namespaced_config_map, namespace)).start()
    try:
        assert informer.wait_synced(30), "the first list"
        name = f"cm-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"a": "1"})
        )
        eventually(lambda: _data(informer, name) == {"a": "1"}, timeout=30, what="the add")
        core.patch_namespaced_config_map(name, namespace, {"data": {"a": "2"}})
        eventually(lambda: _data(informer, name) == {"a": "2"}, timeout=30, what="the change")
        assert informer.get(namespace, name) is not None
        core.delete_namespaced_config_map(name, namespace)
        eventually(lambda: _data(informer, name) is None, timeout=30, what="the delete")
        assert informer.lists == 1, "a watch that works needs no second list"
    finally:
        informer.stop()


def test_an_informer_lists_again_after_an_api_server_restart_and_follows_on(
    sandbox: Sandbox, core: client.CoreV1Api, namespace: str
) -> None:
    informer = Informer(functools.partial(core.list_namespaced_config_map, namespace)).start()
    try:
        assert informer.wait_synced(30)
        sandbox.restart_component("kube-apiserver", downtime=1.0)
        name = f"after-{uuid.uuid4().hex[:6]}"
        eventually(
            lambda: core.create_namespaced_config_map(
                namespace,
                client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"b": "1"}),
            ),
            timeout=60,
            what="a ConfigMap made after the restart",
        )
        # Whether it went on from its version or listed again is the API server's choice
        # (a version its new watch cache no longer has is 410 Gone); either way it follows.
        eventually(lambda: _data(informer, name) == {"b": "1"}, timeout=60, what="it is seen")
    finally:
        informer.stop()
