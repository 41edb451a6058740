"""Fixtures for the fault matrix: one sandbox for the module, its operator, its policies.

The sandbox has a node set of its own (``worlds.WORLD_NODES``: every case of the concurrent
round on disjoint nodes), so the matrix runs in a sandbox of its own rather than the session
one the other sandbox tests share; everything started here is stopped in a ``finally``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from kubernetes import client

from proxymode_sandbox import Sandbox, SandboxConfig
from proxymode_sandbox.process import log_tail
from tests.faults.patient import patient_client
from tests.faults.worlds import CANARY_NODES, NODES
from tests.sandbox.harness import Policies


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A real control plane with kwok nodes (canary and general pools), simulated kube-proxy
    metrics and a real Prometheus; stopped however the module ends."""
    state = tmp_path_factory.mktemp("faults-sandbox")
    box = Sandbox(SandboxConfig(state_dir=state / "state", nodes=NODES, canary_nodes=CANARY_NODES))
    try:
        box.up()
        yield box
    finally:
        # The logs outlive the sandbox (pytest keeps its last base temp dirs): a failed case
        # is read from the operator's and the control plane's own words.
        shutil.copytree(box.dir / "logs", state / "logs", dirs_exist_ok=True)
        box.down()


@pytest.fixture(scope="module")
def api(sandbox: Sandbox) -> client.ApiClient:
    """The cases' client: patient through a kube-apiserver restart (``patient_client``);
    the invariants' sampler keeps a plain one, so a sample the API could not answer is
    counted as missed rather than late."""
    return patient_client(sandbox.kubeconfig)


@pytest.fixture(scope="module")
def operator(sandbox: Sandbox, api: client.ApiClient) -> Iterator[Sandbox]:
    """The CRD installed and the operator running as its own process (cases restart it)."""
    sandbox.install_crd()
    record = sandbox.start_operator()
    try:
        yield sandbox
    finally:
        sandbox.stop_operator()
        print(f"--- last lines of {record.log} ---\n{log_tail(record.log, 60)}")


@pytest.fixture(scope="module")
def policies(api: client.ApiClient, operator: Sandbox) -> Iterator[Policies]:
    made = Policies(api)
    try:
        yield made
    finally:
        operator.freeze_operator(False)  # a failed case must not leave it stopped
        if not any(r.name == "operator" for r in operator.status().components if r.running):
            operator.start_operator()
        made.delete_all()
