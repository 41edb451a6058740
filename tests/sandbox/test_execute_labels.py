"""The executor's label changes on the real API server: one request each, refused whenever
the label is no longer what the engine saw, and on several nodes sent side by side.

A node of its own (created here, deleted after) so that no other test's nodes move.
"""

from __future__ import annotations

import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from proxymode.engine.actions import ClearAction, SetNodeMode
from proxymode.engine.observed import ACTION_ANNOTATION, MODE_LABEL
from proxymode.kube.execute import Executor, dynamic_client
from proxymode_sandbox import Sandbox


class Counting:
    """Every request an API client makes, as (method, path)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.calls: list[tuple[str, str]] = []
        inner: Callable[..., Any] = api.call_api

        def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, urllib.parse.urlsplit(url).path))
            return inner(method, url, *args, **kwargs)

        api.call_api = call_api  # type: ignore[method-assign]

    def take(self) -> list[tuple[str, str]]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def counted(sandbox: Sandbox) -> tuple[client.ApiClient, Counting]:
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    return api, Counting(api)


@pytest.fixture
def node(core: client.CoreV1Api) -> Iterator[str]:
    name = f"exec-{uuid.uuid4().hex[:6]}"
    core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"pool": "exec-test"}))
    )
    try:
        yield name
    finally:
        core.delete_node(name)


def label(core: client.CoreV1Api, node: str) -> str | None:
    labels = core.read_node(node).metadata.labels or {}
    value: str | None = labels.get(MODE_LABEL)
    return value


def test_each_label_change_is_one_patch_and_no_read(
    counted: tuple[client.ApiClient, Counting], core: client.CoreV1Api, node: str
) -> None:
    api, counting = counted
    executor = Executor(api, "exec-test", lambda _: None)
    walk = [(None, "switching"), ("switching", "nftables"), ("nftables", "switching")]
    walk += [("switching", None)]
    counting.take()
    for expect, value in walk:
        assert executor.run([SetNodeMode(node, value, expect)]) == 1
        assert label(core, node) == value
    calls = counting.take()
    assert calls == [("PATCH", f"/api/v1/nodes/{node}")] * len(walk), calls
    # Absent and to stay absent: nothing is written at all.
    assert executor.run([SetNodeMode(node, None, None)]) == 1
    assert counting.take() == []


def test_a_stale_expectation_changes_nothing_and_stops_the_batch(
    counted: tuple[client.ApiClient, Counting], core: client.CoreV1Api, node: str
) -> None:
    api, _ = counted
    executor = Executor(api, "exec-test", lambda _: None)
    core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: "switching"}}})
    # The engine saw no label (a person set it since): refused, and the next action waits.
    done = executor.run([SetNodeMode(node, "nftables", None), SetNodeMode(node, None, "switching")])
    assert done == 0
    assert label(core, node) == "switching"
    # It saw "nftables" where the node says "switching": the removal is refused too.
    assert executor.run([SetNodeMode(node, None, "nftables")]) == 0
    assert label(core, node) == "switching"
    # A node that is gone is a conflict, not an error that ends the look.
    assert executor.run([SetNodeMode(f"{node}-gone", "switching", None)]) == 0


@pytest.fixture
def bare(core: client.CoreV1Api) -> Iterator[str]:
    """A Node of this test's own with no labels map at all (deleted afterwards)."""
    name = f"bare-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        try:
            core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


def test_a_node_without_any_label_still_gets_its_mode(
    counted: tuple[client.ApiClient, Counting], core: client.CoreV1Api, bare: str
) -> None:
    api, _ = counted
    # No labels map at all, so the single patch's test has no parent to look in.
    assert not core.read_node(bare).metadata.labels
    assert (
        Executor(api, "exec-test", lambda _: None).run([SetNodeMode(bare, "switching", None)]) == 1
    )
    assert label(core, bare) == "switching"


def test_a_bare_node_labelled_by_someone_else_meanwhile_is_not_overwritten(
    counted: tuple[client.ApiClient, Counting], core: client.CoreV1Api, bare: str
) -> None:
    """The bare node's patch adds the whole labels map, so it must not land on a map that
    appeared after the read: the map's absence is tested by the API server, in the patch.
    Someone's label lands between the read that finds no map and the patch."""
    api, _ = counted
    executor = Executor(api, "exec-test", lambda _: None)
    read = executor.core.read_node

    def read_then_someone_labels(*args: Any, **kwargs: Any) -> SimpleNamespace:
        answer = read(*args, **kwargs).data  # no labels map: the fallback's case
        core.patch_node(bare, {"metadata": {"labels": {"team": "net"}}})
        return SimpleNamespace(data=answer)

    executor.core.read_node = read_then_someone_labels
    assert executor.run([SetNodeMode(bare, "switching", None)]) == 0
    assert core.read_node(bare).metadata.labels == {"team": "net"}, "overwritten"


def test_one_dynamic_client_per_api_client(counted: tuple[client.ApiClient, Counting]) -> None:
    api, _ = counted
    assert dynamic_client(api) is dynamic_client(api)
    assert Executor(api, "a", lambda _: None).dyn is Executor(api, "b", lambda _: None).dyn


@pytest.fixture
def three(core: client.CoreV1Api) -> Iterator[list[str]]:
    names = [f"exec-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    try:
        for name in names:
            core.create_node(
                client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"pool": "exec"}))
            )
        yield names
    finally:
        for name in names:
            try:
                core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise


def test_label_changes_on_several_nodes_go_out_side_by_side(
    sandbox: Sandbox, core: client.CoreV1Api, three: list[str]
) -> None:
    """The first two PATCHes wait for each other: sent one after the other, the first would
    wait alone until the barrier broke, and the batch would fail."""
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    meeting = threading.Barrier(2, timeout=10)
    inner: Callable[..., Any] = api.call_api
    met: list[str] = []
    lock = threading.Lock()

    def call_api(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            meets = method == "PATCH" and len(met) < 2
            if meets:
                met.append(url)
        if meets:
            meeting.wait()
        return inner(method, url, *args, **kwargs)

    api.call_api = call_api  # type: ignore[method-assign]
    executor = Executor(api, "exec-test", lambda _: None)
    assert executor.run([SetNodeMode(n, "switching", None) for n in three]) == 3
    assert [label(core, n) for n in three] == ["switching"] * 3
    assert not meeting.broken


def test_a_refused_change_among_several_stops_the_count_at_its_place(
    sandbox: Sandbox, core: client.CoreV1Api, three: list[str]
) -> None:
    """The others of that run went out with it and are done (each had its own test); the
    count says where the engine's order met the refusal, and the next look reads the rest."""
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    second = three[1]
    core.patch_node(second, {"metadata": {"labels": {MODE_LABEL: "nftables"}}})  # a person
    executor = Executor(api, "exec-test", lambda _: None)
    assert executor.run([SetNodeMode(n, "switching", None) for n in three]) == 1
    assert [label(core, n) for n in three] == ["switching", "nftables", "switching"]


def test_a_second_change_of_one_node_waits_for_the_first(
    sandbox: Sandbox, core: client.CoreV1Api, three: list[str]
) -> None:
    """Its test expects the first change's value, so it cannot go out beside it."""
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    first, second, _ = three
    batch = [
        SetNodeMode(first, "switching", None),
        SetNodeMode(second, "switching", None),
        SetNodeMode(first, "nftables", "switching"),
        SetNodeMode(second, "nftables", "switching"),
    ]
    assert Executor(api, "exec-test", lambda _: None).run(batch) == 4
    assert [label(core, n) for n in (first, second)] == ["nftables", "nftables"]


@pytest.mark.usefixtures("crd")
def test_clearing_an_action_removes_only_the_value_the_look_handled(sandbox: Sandbox) -> None:
    """A look that handled ``resume`` must not erase an ``abort`` a person set meanwhile (a
    review: a slow analysis round, and the abort vanished unseen): the removal tests the
    value, is refused (the batch stops, the next look acts on the abort), and removes it
    only when it is still the one handled."""
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    custom = client.CustomObjectsApi(api)
    name = f"clear-{uuid.uuid4().hex[:6]}"
    sandbox.stop_operator()  # its own looks would take the annotation first
    custom.create_cluster_custom_object(
        "proxymode.io",
        "v1alpha1",
        "proxymodepolicies",
        {
            "apiVersion": "proxymode.io/v1alpha1",
            "kind": "ProxyModePolicy",
            "metadata": {"name": name, "annotations": {ACTION_ANNOTATION: "abort"}},
            "spec": {
                "targetMode": "nftables",
                "paused": True,
                "stages": [{"name": "all", "percent": 100}],
            },
        },
    )
    try:
        executor = Executor(api, name, lambda _event: None)

        def action() -> str | None:
            body = custom.get_cluster_custom_object(
                "proxymode.io", "v1alpha1", "proxymodepolicies", name
            )
            return (body["metadata"].get("annotations") or {}).get(ACTION_ANNOTATION)

        assert executor.run([ClearAction("resume")]) == 0, "refused: not the value handled"
        assert action() == "abort"
        assert executor.run([ClearAction("abort")]) == 1
        assert action() is None
        assert executor.run([ClearAction("abort")]) == 0, "already gone: nothing to remove"
    finally:
        sandbox.start_operator()  # before the delete: the finalizer, if any, is its to release
        custom.delete_cluster_custom_object("proxymode.io", "v1alpha1", "proxymodepolicies", name)
