"""The peering object at start (pure: the API is a stand-in; the failover sandbox test has a
real one create it): read first, created when missing, waited for while the CRD or RBAC is
not there yet, and a clear stop instead of a replica paused for good."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from proxymode.kube import peering


class _Api:
    def __init__(self, gets: list[int | None], creates: list[int | None]) -> None:
        self.gets, self.creates = gets, creates
        self.created = 0

    def __call__(self, _api: Any) -> _Api:
        return self

    def get_cluster_custom_object(self, *_: Any) -> dict[str, Any]:
        status = self.gets.pop(0) if len(self.gets) > 1 else self.gets[0]
        if status == 0:  # no answer: what urllib3 raises when the connection fails
            raise MaxRetryError(None, "/apis", reason=OSError(113, "No route to host"))  # type: ignore[arg-type]
        if status is not None:
            raise ApiException(status=status, reason="no")
        return {}

    def create_cluster_custom_object(self, *_: Any) -> dict[str, Any]:
        status = self.creates.pop(0) if len(self.creates) > 1 else self.creates[0]
        if status is not None:
            raise ApiException(status=status, reason="no")
        self.created += 1
        return {}


def _ensure(monkeypatch: pytest.MonkeyPatch, api: _Api, wait: float = 60.0) -> tuple[bool, int]:
    monkeypatch.setattr(client, "CustomObjectsApi", api)
    naps: list[float] = []
    made = peering.ensure_peering(
        client.ApiClient(), "proxymode", wait_seconds=wait, sleep=naps.append
    )
    return made, len(naps)


def test_an_existing_object_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _Api(gets=[None], creates=[403])  # may read, may not create: fine, it exists
    assert _ensure(monkeypatch, api) == (False, 0)


def test_a_missing_object_is_created_once_the_crd_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _Api(gets=[404], creates=[404, 404, None])  # the CRD is served on the third try
    assert _ensure(monkeypatch, api) == (True, 2)
    assert api.created == 1


def test_another_replica_creating_it_first_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _ensure(monkeypatch, _Api(gets=[404], creates=[409])) == (False, 0)


def test_never_creatable_stops_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(peering.PeeringUnavailableError, match="grant get and create"):
        _ensure(monkeypatch, _Api(gets=[403], creates=[403]), wait=0.0)


def test_an_api_server_out_of_reach_at_start_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI: the operator's pod started on a node whose kube-proxy had not yet written the
    rules for 10.96.0.1 ("No route to host"), exited, and was restarted three times."""
    api = _Api(gets=[0, 0, 0, 404], creates=[None])
    assert _ensure(monkeypatch, api) == (True, 3)


def test_an_api_server_that_never_answers_stops_with_why() -> None:
    """A real connection to a loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = client.Configuration()
    cfg.host = f"https://127.0.0.1:{port}"
    cfg.retries = 0
    with pytest.raises(peering.PeeringUnavailableError, match="the API server did not answer"):
        peering.ensure_peering(client.ApiClient(cfg), "proxymode", wait_seconds=0.0)
