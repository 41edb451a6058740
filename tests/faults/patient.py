"""A Kubernetes client for the fault cases that waits out a kube-apiserver restart."""

from __future__ import annotations

import os

from kubernetes import client, config
from urllib3.util.retry import Retry

PATIENT_CONNECTS = 40
"""Connections refused (kube-apiserver restarting) retried this many times, backing off to
4 s: about 2.5 minutes, more than the longest restart seen in CI (decision 0100)."""


def patient_client(kubeconfig: str | os.PathLike[str]) -> client.ApiClient:
    """A client whose requests wait out a kube-apiserver restart instead of failing.

    The matrix restarts kube-apiserver beside the other cases of its round, and a case's
    one-shot call (creating its policy, a person's label edit) that lands in the restart
    failed the case with "connection refused" (a rehearsal, label-guarded). Refused
    connections are retried: such a request never reached the server, so a POST or PATCH
    is safe to send again. A connection the stopping server closes without an answer is
    retried for reads only (GET, HEAD): a write may have been carried out (CI's run of
    2264251: a case's world set-up read its ConfigMap as the restart began, "Remote end
    closed connection without response")."""
    settings = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=settings)
    settings.retries = Retry(
        total=None,
        connect=PATIENT_CONNECTS,
        read=PATIENT_CONNECTS,
        allowed_methods=frozenset({"GET", "HEAD"}),  # read errors: reads only
        redirect=0,
        status=0,
        other=0,
        backoff_factor=0.5,
        backoff_max=4,
    )
    return client.ApiClient(settings)
