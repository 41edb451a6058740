"""The chart's label guard on a real API server (decision 0063).

The chart's ValidatingAdmissionPolicy and its binding, rendered for a ServiceAccount of this
module and bound (``labelGuard.nodeSelector``) to nodes that carry this module's own label,
are applied to the sandbox with the chart's ClusterRole and ClusterRoleBinding; everything
is deleted after, also on failure. Identities are impersonated by the admin kubeconfig:

- a person (``jane``, in ``system:masters`` so RBAC lets her through) who sets, changes or
  removes ``proxymode.io/mode`` is refused with the guard's message; her other label edits,
  and a node she creates without the label, pass;
- the operator's ServiceAccount, with nothing but the chart's RBAC, sets and removes the
  label through the operator's own code (``kube.execute.Executor``: the resourceVersion-guarded
  JSON patch);
- a break-glass user of ``labelGuard.allowedUsers`` and a member of a
  ``labelGuard.allowedGroups`` group may edit the label.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from proxymode.engine.actions import SetNodeMode
from proxymode.kube.execute import Executor
from proxymode_sandbox import Sandbox
from tests.chart.conftest import NAMESPACE, by_kind, render, run
from tests.sandbox.harness import eventually

pytestmark = pytest.mark.sandbox
MODE = "proxymode.io/mode"
SCOPE_LABEL = "label-guard-test"
BREAK_GLASS_USER = "oncall@example.com"
BREAK_GLASS_GROUP = "platform-admins"
GUARD_KINDS = (
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ClusterRole",
    "ClusterRoleBinding",
)


class Guard:
    """The installed guard: its scope, the operator's identity, and clients by identity."""

    def __init__(self, box: Sandbox, scope: str, service_account: str) -> None:
        self.box = box
        self.scope = scope
        self.operator = f"system:serviceaccount:{NAMESPACE}:{service_account}"
        self.admin = client.CoreV1Api(
            config.new_client_from_config(config_file=str(box.kubeconfig))
        )

    def api_as(self, user: str, group: str | None = None) -> client.ApiClient:
        """An API client that impersonates ``user`` (and ``group``)."""
        api = config.new_client_from_config(config_file=str(self.box.kubeconfig))
        api.set_default_header("Impersonate-User", user)
        if group:
            api.set_default_header("Impersonate-Group", group)
        return api

    def core_as(self, user: str, group: str | None = None) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_as(user, group))

    def node_body(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {SCOPE_LABEL: self.scope, **(labels or {})}}}


def _kubectl(box: Sandbox, bins: Path, *args: str, stdin: str) -> None:
    run([bins / "kubectl", f"--kubeconfig={box.kubeconfig}", *args], input=stdin)


@pytest.fixture(scope="module")
def guard(sandbox: Sandbox, bins: Path) -> Iterator[Guard]:
    scope = f"g{uuid.uuid4().hex[:7]}"  # never all digits: helm --set would make it a number
    service_account = f"guard-operator-{scope}"
    objects = render(
        bins,
        set_values=[
            f"fullnameOverride=guard-{scope}",
            f"serviceAccount.name={service_account}",
            f"labelGuard.allowedUsers[0]={BREAK_GLASS_USER}",
            f"labelGuard.allowedGroups[0]={BREAK_GLASS_GROUP}",
            f"labelGuard.nodeSelector.matchLabels.{SCOPE_LABEL}={scope}",
        ],
    )
    picked = [o for kind in GUARD_KINDS for o in by_kind(objects, kind)]
    assert [o["kind"] for o in picked] == list(GUARD_KINDS)
    # The break-glass group needs RBAC of its own to patch nodes at all.
    group_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"guard-{scope}-break-glass"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"guard-{scope}",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": BREAK_GLASS_GROUP}
        ],
    }
    manifest = yaml.safe_dump_all([*picked, group_binding])
    made = Guard(sandbox, scope, service_account)
    admin = client.CoreV1Api(config.new_client_from_config(config_file=str(sandbox.kubeconfig)))
    try:
        _kubectl(sandbox, bins, "apply", "--server-side", "-f", "-", stdin=manifest)
        policy = next(o for o in picked if o["kind"] == "ValidatingAdmissionPolicy")
        _wait_until_enforced(sandbox, made, admin, policy["metadata"]["name"])
        yield made
    finally:
        for node in admin.list_node(label_selector=f"{SCOPE_LABEL}={scope}").items:
            admin.delete_node(node.metadata.name)
        run(
            [
                bins / "kubectl",
                f"--kubeconfig={sandbox.kubeconfig}",
                "delete",
                "--ignore-not-found",
                "-f",
                "-",
            ],
            input=manifest,
            check=False,
        )


def _wait_until_enforced(box: Sandbox, guard: Guard, admin: client.CoreV1Api, policy: str) -> None:
    """The policy type-checks without warnings, then the API server enforces it (it loads
    policies asynchronously): a dry-run label edit by a person on a probe node is refused."""
    admission = client.AdmissionregistrationV1Api(admin.api_client)
    checked = eventually(
        lambda: admission.read_validating_admission_policy(policy).status.type_checking,
        what="the label guard's type check",
    )
    assert not checked.expression_warnings, checked.expression_warnings
    probe = f"guard-probe-{guard.scope}"
    admin.create_node(guard.node_body(probe))
    jane = guard.core_as("jane", "system:masters")

    def refused() -> bool:
        try:
            jane.patch_node(probe, {"metadata": {"labels": {MODE: "nftables"}}}, dry_run="All")
        except ApiException as e:
            return e.status == 403
        return False

    eventually(refused, what="the label guard to be enforced")


def _refusal(call: Callable[[], object]) -> str:
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status == 403, caught.value.body
    message: str = json.loads(caught.value.body)["message"]
    return message


def _labels(guard: Guard, node: str) -> dict[str, str]:
    return dict(guard.admin.read_node(node).metadata.labels or {})


def _put(core: client.CoreV1Api, node: str, edit: Callable[[dict[str, str]], None]) -> None:
    """A full update (read, edit the labels, PUT), again when the node controller's own update
    (a taint) came in between (409)."""
    for _ in range(5):
        body = core.read_node(node)
        edit(body.metadata.labels)
        try:
            core.replace_node(node, body)
            return
        except ApiException as e:
            if e.status != 409:
                raise
    raise AssertionError(f"node {node} kept changing under the update")


def test_a_person_cannot_set_change_or_remove_the_mode_label(guard: Guard) -> None:
    jane = guard.core_as("jane", "system:masters")
    node = f"guard-person-{guard.scope}"
    jane.create_node(guard.node_body(node))  # a node without the label: allowed

    set_it = _refusal(lambda: jane.patch_node(node, {"metadata": {"labels": {MODE: "nftables"}}}))
    assert f"{MODE} on node {node} is changed only by the proxymode operator" in set_it
    assert f"({guard.operator})" in set_it and "not by jane" in set_it
    assert "skips the switching step and can run two kube-proxies" in set_it
    assert "use a ProxyModePolicy" in set_it and "labelGuard.allowedUsers" in set_it
    assert MODE not in _labels(guard, node)

    # Other label edits, and a full update (PUT) that keeps the label as it is, pass.
    jane.patch_node(node, {"metadata": {"labels": {"team": "net"}}})
    assert _labels(guard, node)["team"] == "net"

    operator = guard.core_as(guard.operator)
    operator.patch_node(node, {"metadata": {"labels": {MODE: "nftables"}}})
    _put(jane, node, lambda labels: labels.update(team="edge"))
    # A status update (what a kubelet sends all the time) is not even matched.
    ready = {"type": "Ready", "status": "False", "reason": "Test", "message": "no kubelet"}
    jane.patch_node_status(node, {"status": {"conditions": [ready]}})
    assert _labels(guard, node) == {SCOPE_LABEL: guard.scope, MODE: "nftables", "team": "edge"}

    # Changing the value, removing it (merge patch, JSON patch, PUT): all refused.
    _refusal(lambda: jane.patch_node(node, {"metadata": {"labels": {MODE: "ipvs"}}}))
    _refusal(lambda: jane.patch_node(node, {"metadata": {"labels": {MODE: None}}}))
    _refusal(
        lambda: jane.patch_node(
            node,
            [{"op": "remove", "path": "/metadata/labels/proxymode.io~1mode"}],
            _content_type="application/json-patch+json",
        )
    )
    _refusal(lambda: _put(jane, node, lambda labels: labels.pop(MODE)))
    assert _labels(guard, node)[MODE] == "nftables"

    # Creating a node that already carries the label is refused too.
    _refusal(lambda: jane.create_node(guard.node_body(f"{node}-2", {MODE: "nftables"})))


def test_the_operator_and_break_glass_identities_edit_the_label(guard: Guard) -> None:
    node = f"guard-allowed-{guard.scope}"
    guard.core_as("jane", "system:masters").create_node(guard.node_body(node))

    # The operator's own code path, as its ServiceAccount with the chart's RBAC only.
    executor = Executor(guard.api_as(guard.operator), "guard-test", lambda _event: None)
    assert executor.run([SetNodeMode(node, "switching", None)]) == 1
    assert executor.run([SetNodeMode(node, "nftables", "switching")]) == 1
    assert _labels(guard, node)[MODE] == "nftables"
    assert executor.run([SetNodeMode(node, None, "nftables")]) == 1
    assert MODE not in _labels(guard, node)

    for user, group in ((BREAK_GLASS_USER, "system:masters"), ("bob", BREAK_GLASS_GROUP)):
        core = guard.core_as(user, group)
        core.patch_node(node, {"metadata": {"labels": {MODE: "ipvs"}}})
        assert _labels(guard, node)[MODE] == "ipvs", user
        core.patch_node(node, {"metadata": {"labels": {MODE: None}}})
        assert MODE not in _labels(guard, node), user


def test_nodes_outside_the_bindings_selector_are_not_guarded(guard: Guard) -> None:
    """The binding's objectSelector holds: what this module does never refuses another's edit."""
    admin = guard.admin
    node = f"guard-other-{guard.scope}"
    admin.create_node({"metadata": {"name": node, "labels": {MODE: "nftables"}}})
    try:
        guard.core_as("jane", "system:masters").patch_node(
            node, {"metadata": {"labels": {MODE: None}}}
        )
        assert MODE not in (admin.read_node(node).metadata.labels or {})
    finally:
        admin.delete_node(node)
