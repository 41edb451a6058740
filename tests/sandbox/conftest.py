"""Fixtures for tests against the real control plane.

One sandbox per test session (it takes seconds with cached binaries), stopped in
a finalizer even when tests fail; each test gets its own namespace, deleted after.
Tests that change shared objects (node labels, kube-system) undo what they change.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from proxymode_sandbox import Sandbox, SandboxConfig
from proxymode_sandbox.kube_proxy_metrics import FAULT_ANNOTATION
from proxymode_sandbox.process import log_tail
from tests.sandbox.harness import (
    KubeProxy,
    Policies,
    Sampler,
    eventually,
    install_kube_proxy,
    pods_by_node,
)

T = TypeVar("T")
CRD = Path(__file__).resolve().parents[2] / "crds" / "proxymode.io_proxymodepolicies.yaml"


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A running 6-node sandbox (2 canary, 3 general, 1 legacy with an old kernel)."""
    # One per pytest-xdist worker: each has its own base temp dir (and node network, see
    # Sandbox._node_net); a fixed PROXYMODE_TEST_SANDBOX gets a subdirectory per worker.
    fixed = os.environ.get("PROXYMODE_TEST_SANDBOX")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    state = Path(fixed) / worker if fixed else tmp_path_factory.mktemp("sandbox")
    box = Sandbox(SandboxConfig(state_dir=state / "state", nodes=6, canary_nodes=2, legacy_nodes=1))
    try:
        box.up()
        yield box
    finally:
        box.down()


@pytest.fixture(scope="session")
def crd(api: client.ApiClient) -> str:
    """The ProxyModePolicy CRD from crds/, installed and Established."""
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD.read_text())
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as e:
        if e.status != 409:
            raise
    name: str = body["metadata"]["name"]
    eventually(
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(name).status.conditions or []
        ),
        what="the CRD to be Established",
    )
    return name


@pytest.fixture(scope="session")
def operator(sandbox: Sandbox, crd: str) -> Iterator[Sandbox]:
    """The proxymode operator running as its own process against the sandbox."""
    record = sandbox.start_operator()
    try:
        yield sandbox
    finally:
        sandbox.stop_operator()
        # Shown by pytest only when something failed: what the operator said last.
        print(f"--- last lines of {record.log} ---\n{log_tail(record.log, 40)}")


@pytest.fixture(scope="session")
def api(sandbox: Sandbox) -> client.ApiClient:
    """An admin API client for the sandbox."""
    return config.new_client_from_config(config_file=str(sandbox.kubeconfig))


@pytest.fixture(scope="session")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="session")
def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount, deleted after the test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    eventually(lambda: core.read_namespaced_service_account("default", name), what="default SA")
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def policies(api: client.ApiClient, operator: Sandbox) -> Iterator[Policies]:
    made = Policies(api)
    try:
        yield made
    finally:
        made.delete_all()


@pytest.fixture
def proxy(api: client.ApiClient, namespace: str) -> KubeProxy:
    return install_kube_proxy(api, namespace)


@pytest.fixture
def sampler(api: client.ApiClient, proxy: KubeProxy) -> Iterator[Sampler]:
    s = Sampler(api, proxy.namespace, budget=1)
    s.start()
    try:
        yield s
    finally:
        s.stop()
    assert s.violations == [], s.violations[:5]


__all__ = ["eventually", "pods_by_node"]


@pytest.fixture
def faults(core: client.CoreV1Api) -> Iterator[dict[str, str]]:
    """Sandbox faults to set, by node name; every annotation is removed afterwards."""
    chosen: dict[str, str] = {}
    try:
        yield chosen
    finally:
        for node in chosen:
            core.patch_node(node, {"metadata": {"annotations": {FAULT_ANNOTATION: None}}})
