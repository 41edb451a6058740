"""The request counter names requests as the API server does and counts each once."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.kube.counted import count_requests, describe

H = "https://127.0.0.1:6443"


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", f"{H}/api/v1/nodes", ("list", "nodes")),
        ("GET", f"{H}/api/v1/nodes?watch=True&resourceVersion=5", ("watch", "nodes")),
        ("GET", f"{H}/api/v1/nodes/general-1", ("get", "nodes")),
        ("PATCH", f"{H}/api/v1/nodes/general-1", ("patch", "nodes")),
        ("GET", f"{H}/api/v1/namespaces/kube-system/pods?watch=true", ("watch", "pods")),
        (
            "GET",
            f"{H}/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy",
            ("get", "daemonsets"),
        ),
        ("POST", f"{H}/apis/batch/v1/namespaces/kube-system/jobs", ("create", "jobs")),
        ("DELETE", f"{H}/apis/batch/v1/namespaces/kube-system/jobs/j-1", ("delete", "jobs")),
        (
            "PATCH",
            f"{H}/apis/proxymode.io/v1alpha1/proxymodepolicies/p/status",
            ("patch", "proxymodepolicies/status"),
        ),
        ("GET", f"{H}/api/v1/namespaces/kube-system", ("get", "namespaces")),
        ("GET", f"{H}/api/v1/namespaces", ("list", "namespaces")),
        ("GET", f"{H}/version/", ("get", "version")),
        ("PUT", f"{H}/api/v1/namespaces/kube-system/configmaps/c", ("update", "configmaps")),
        ("GET", f"{H}/api", ("get", "discovery")),
        ("GET", f"{H}/apis/apps/v1", ("get", "discovery")),
        ("GET", f"{H}/api/v1/watch/nodes/node-7", ("watch", "nodes")),
        ("GET", f"{H}/api/v1/watch/namespaces/ns/pods", ("watch", "pods")),
        ("PUT", f"{H}/api/v1/namespaces/ns/status", ("update", "namespaces/status")),
        ("GET", f"{H}/api/v1/namespaces/ns/pods/p/log", ("get", "pods/log")),
        ("DELETE", f"{H}/apis/batch/v1/namespaces/ns/jobs", ("deletecollection", "jobs")),
    ],
)
def test_describe_names_verb_and_resource(method: str, url: str, expected: tuple[str, str]) -> None:
    assert describe(method, url) == expected


def test_a_server_path_prefix_is_taken_off_first() -> None:
    url = "https://rancher.example/k8s/clusters/c-1/api/v1/namespaces/a/pods?watch=true"
    assert describe("GET", url, "/k8s/clusters/c-1") == ("watch", "pods")


def test_no_object_name_becomes_a_label() -> None:
    names = ("node-7", "ns-x", "pod-q", "job-z")
    urls = [
        f"{H}/api/v1/watch/nodes/node-7",
        f"{H}/api/v1/watch/namespaces/ns-x/pods/pod-q",
        f"{H}/api/v1/namespaces/ns-x/pods/pod-q/exec/extra",
        f"{H}/apis/batch/v1/namespaces/ns-x/jobs/job-z/status",
    ]
    for url in urls:
        _, resource = describe("GET", url)
        assert not any(n in resource for n in names), (url, resource)


class _Answer:
    status = 200


def test_every_request_is_recorded_once_with_its_code() -> None:
    api = client.ApiClient(client.Configuration(host=H))
    sent: list[str] = []

    def fake(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(url)
        if url.endswith("/missing"):
            raise ApiException(status=404, reason="Not Found")
        if url.endswith("/broken"):
            raise ConnectionError("reset")
        return _Answer()

    api.rest_client.request = fake  # type: ignore[method-assign]
    seen: list[tuple[str, str, str]] = []
    count_requests(api, lambda *labels: seen.append(labels))
    api.rest_client.request("GET", f"{H}/api/v1/nodes")
    with pytest.raises(ApiException):
        api.rest_client.request("GET", f"{H}/api/v1/nodes/missing")
    with pytest.raises(ConnectionError):
        api.rest_client.request("DELETE", f"{H}/api/v1/nodes/broken")
    assert seen == [
        ("list", "nodes", "200"),
        ("get", "nodes", "404"),
        ("delete", "nodes", "error"),
    ]
    assert len(sent) == 3


def test_a_failing_record_changes_nothing_the_request_returns() -> None:
    api = client.ApiClient(client.Configuration(host=H))
    answer = _Answer()
    api.rest_client.request = lambda *a, **k: answer  # type: ignore[method-assign]

    def broken(*_labels: str) -> None:
        raise RuntimeError("registry gone")

    count_requests(api, broken)
    assert api.rest_client.request("GET", f"{H}/api/v1/nodes") is answer
