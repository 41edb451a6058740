"""The chart's label guard (decision 0063) installed for one world of the fault matrix.

Rendered from the chart as a user installs it, with two changes for the matrix: the operator
runs beside the sandbox with the admin kubeconfig (``kubernetes-admin``), not as the
chart's ServiceAccount, so that user is the guard's allowed identity; and the binding covers
only the world's own nodes (``kubernetes.io/hostname In [...]``), so no other case of the
round is refused anything. A person is ``jane`` in ``system:masters``, impersonated: RBAC
lets her through, only the guard stops her.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.engine.observed import MODE_LABEL
from proxymode_sandbox import Sandbox
from proxymode_sandbox.binaries import binary_dir
from tests.chart.conftest import by_kind, render, run
from tests.faults.patient import patient_client
from tests.sandbox.harness import eventually

OPERATOR_USER = "kubernetes-admin"
"""The sandbox's admin identity, which the matrix's operator runs as."""


def person(box: Sandbox) -> client.CoreV1Api:
    """A person with every RBAC right who is not the operator."""
    api = patient_client(box.kubeconfig)  # the round restarts kube-apiserver beside it
    api.set_default_header("Impersonate-User", "jane")
    api.set_default_header("Impersonate-Group", "system:masters")
    return client.CoreV1Api(api)


@contextmanager
def label_guard(box: Sandbox, nodes: list[str]) -> Iterator[None]:
    """The guard over ``nodes``, enforced on entry (a dry-run edit by a person is refused),
    deleted on exit, also on failure."""
    values = {
        "fullnameOverride": "faults",
        "labelGuard": {
            "allowedUsers": [OPERATOR_USER],
            "nodeSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(nodes)}
                ]
            },
        },
    }
    bins = binary_dir()
    with tempfile.TemporaryDirectory(prefix="pm-guard-") as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        objects = render(bins, path)
    picked = [
        o
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        for o in by_kind(objects, kind)
    ]
    assert len(picked) == 2, [o["kind"] for o in objects]
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": picked})
    kubectl = [bins / "kubectl", f"--kubeconfig={box.kubeconfig}"]
    # The round restarts kube-apiserver beside this case: apply until it answers.
    eventually(
        lambda: (
            run(
                [*kubectl, "apply", "--server-side", "-f", "-"], input=manifest, check=False
            ).returncode
            == 0
        ),
        timeout=420,
        interval=2,
        what="the label guard applied",
    )
    try:
        jane = person(box)

        def refused() -> bool:
            patch = {"metadata": {"labels": {MODE_LABEL: "guard-probe"}}}
            try:
                jane.patch_node(nodes[0], patch, dry_run="All")
            except ApiException as e:
                return e.status == 403
            return False

        eventually(refused, timeout=120, what="the label guard to be enforced")
        yield
    finally:
        run([*kubectl, "delete", "--ignore-not-found", "-f", "-"], input=manifest, check=False)
