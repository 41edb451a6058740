"""Two operators with kopf peering (the chart's two replicas): exactly one acts, and when it
is SIGKILLed mid-migration the other takes over and completes it (decision 0071).

The session's standalone operator is stopped for the test (it ignores peering and would
act too) and started again after. Both peered operators run as the chart runs them
(``--peering``, seniority priority, a short ``--peering-lifetime`` so that a crash is
noticed in seconds) with ``--verbose``, so every request the operator's API client makes
is in its log: a write (POST, PATCH, PUT, DELETE) in the standby's log before the kill
would be two operators acting.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode_sandbox import Sandbox
from proxymode_sandbox.process import free_port, stop_popen
from tests.sandbox.harness import KubeProxy, Policies, eventually, mode_of, node_modes

pytestmark = pytest.mark.sandbox
ROOT = Path(__file__).resolve().parents[2]
PEERING_CRD = ROOT / "crds" / "kopf.dev_clusterkopfpeerings.yaml"
LIFETIME = 6
"""Seconds a keep-alive counts: the standby takes over at most this long after a crash."""
WRITE = re.compile(r'"(POST|PATCH|PUT|DELETE) (/[^ "?]+)')


@dataclass
class Peer:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def writes(self) -> list[str]:
        """The operator's own writes (kopf's peering keep-alives go through aiohttp, not
        this client, and would be excluded anyway)."""
        text = self.log.read_text(errors="replace")
        return [
            f"{m.group(1)} {m.group(2)}"
            for m in WRITE.finditer(text)
            if "clusterkopfpeerings" not in m.group(2)
        ]


class Peers:
    def __init__(
        self, sandbox: Sandbox, peering: str, logs: Path, custom: client.CustomObjectsApi
    ) -> None:
        self.sandbox, self.peering, self.logs, self.custom = sandbox, peering, logs, custom
        self.started: list[Peer] = []

    def start(self, identity: str) -> Peer:
        port = free_port()
        log = self.logs / f"{identity}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "proxymode",
                    f"--kubeconfig={self.sandbox.kubeconfig}",
                    f"--liveness=http://127.0.0.1:{port}/healthz",
                    f"--peering={self.peering}",
                    f"--peering-lifetime={LIFETIME}",
                    "--verbose",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "POD_ID": identity},
            )
        peer = Peer(identity, proc, log)
        self.started.append(peer)
        eventually(
            lambda: proc.poll() is None and _healthy(f"http://127.0.0.1:{port}/healthz"),
            timeout=60,
            what=f"{identity}'s liveness endpoint",
        )
        return peer

    def stop(self) -> None:
        for peer in self.started:
            stop_popen(peer.proc, grace_seconds=15)


@pytest.fixture
def peers(
    sandbox: Sandbox, api: client.ApiClient, policies: Policies, tmp_path: Path
) -> Iterator[Peers]:
    """Two peered operators may be started; the session's operator is off meanwhile.
    (After ``policies``, so that its teardown, the rollback, runs under the session's
    operator again.)"""
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    try:
        ext.create_custom_resource_definition(yaml.safe_load(PEERING_CRD.read_text()))
    except ApiException as e:
        if e.status != 409:
            raise
    eventually(
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(
                "clusterkopfpeerings.kopf.dev"
            ).status.conditions
            or []
        ),
        what="the peering CRD to be Established",
    )
    # No peering object: the first operator creates it (``kube.peering``), as in the chart.
    peering = f"ha-{uuid.uuid4().hex[:6]}"
    sandbox.stop_operator()
    made = Peers(sandbox, peering, tmp_path, custom)
    try:
        yield made
    finally:
        made.stop()
        for peer in made.started:
            print(f"--- {peer.name} (last 1500 chars) ---\n{peer.log.read_text()[-1500:]}")
        sandbox.start_operator()
        try:
            custom.delete_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)
        except ApiException as e:
            if e.status != 404:
                raise


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
        return bool(response.status == 200)


def _peering_uid(peers: Peers) -> str:
    body = peers.custom.get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", peers.peering
    )
    return str(body["metadata"]["uid"])


def _keepalives(peers: Peers) -> set[str]:
    body = peers.custom.get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", peers.peering
    )
    return set((body.get("status") or {}).keys())


def test_one_of_two_peered_operators_acts_and_the_other_takes_over_after_a_crash(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, peers: Peers
) -> None:
    core = client.CoreV1Api(api)
    first = peers.start("operator-a")
    eventually(lambda: "operator-a" in _keepalives(peers), what="operator-a's keep-alive")
    made = _peering_uid(peers)  # operator-a created the missing peering object
    second = peers.start("operator-b")
    eventually(lambda: "operator-b" in _keepalives(peers), what="operator-b's keep-alive")
    # operator-b found it and left it as it was: operator-a's keep-alive is still in it.
    assert _peering_uid(peers) == made
    assert {"operator-a", "operator-b"} <= _keepalives(peers)

    name = policies.create(proxy.namespace)
    # The first stage moved and is baking: the senior operator acted, the junior did not.
    policies.wait_phase(name, "Analyzing", timeout=120)
    assert first.writes(), "the senior operator acted on nothing"
    assert not second.writes(), f"the standby acted too: {second.writes()[:5]}"

    first.proc.kill()  # SIGKILL: no goodbye in the peering object, only an expiring keep-alive
    killed = time.monotonic()
    first.proc.wait(timeout=10)
    eventually(second.writes, timeout=LIFETIME * 5, what="operator-b to take over")
    takeover = time.monotonic() - killed

    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack", timeout=180)
    assert status["phase"] == "Completed", status.get("message")
    assert status["finalized"] is True
    assert sum(len(s["nodes"]) for s in status["stages"]) == len(proxy.nodes)
    assert mode_of(core, proxy.namespace) == "nftables"
    assert all(v is None for v in node_modes(core).values()), "no proxymode.io/ label left"
    assert second.proc.poll() is None, "the survivor is still running"
    print(f"\nfailover: operator-b acted {takeover:.1f}s after operator-a was killed")
