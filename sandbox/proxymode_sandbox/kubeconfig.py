"""Kubeconfig files for the sandbox's clients (admin, controllers, kwok, test identities)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from proxymode_sandbox.certs import KeyPair


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(
    path: Path,
    server: str,
    ca_pem: bytes,
    *,
    user: str,
    client: KeyPair | None = None,
    token: str | None = None,
    cluster: str = "proxymode-sandbox",
) -> Path:
    """Write a self-contained kubeconfig and return its path.

    The user authenticates with a client certificate (``client``) or a bearer token
    (``token``, e.g. a ServiceAccount's from the TokenRequest API).
    """
    if (client is None) == (token is None):
        raise ValueError("give exactly one of client or token")
    creds: dict[str, Any]
    if client is not None:
        creds = {
            "client-certificate-data": _b64(client.cert_pem),
            "client-key-data": _b64(client.key_pem),
        }
    else:
        creds = {"token": token}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
