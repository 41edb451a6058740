"""Job labels stay valid for every node name, and the operator reads the exact name back."""

from __future__ import annotations

import re

import pytest

from proxymode.engine import jobs, naming, objects, verify

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# A valid node name (a DNS subdomain, up to 253 characters) longer than a label value's 63.
LONG_NODE = "worker-0001.rack-17.row-b.datacenter-east.prod.cluster-7.example.internal"

assert len(LONG_NODE) > 63


def test_verification_job_labels_are_valid_for_a_long_node_name() -> None:
    settings = verify.Settings("default/kubernetes:443", 60, "img", "10.96.0.1")
    body = verify.verify_job(
        "to-nft", "uid-1", namespace="kube-system", node=LONG_NODE,
        modes=("nftables", "iptables"), settings=settings,
    )  # fmt: skip
    for labels in (body["metadata"]["labels"], body["spec"]["template"]["metadata"]["labels"]):
        bad = {k: v for k, v in labels.items() if len(v) > 63 or not LABEL_VALUE.match(v)}
        assert not bad, bad


@pytest.mark.parametrize(
    "node", [LONG_NODE, "n1", "a" * 63, "a" * 64, "node.with.dots-" + "x" * 60, "ip-10-0-0-1"]
)
def test_both_jobs_name_the_node_exactly_whatever_its_length(node: str) -> None:
    settings = verify.Settings("default/kubernetes:443", 60, "img", "10.96.0.1")
    source = {
        "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
        "spec": {"template": {"spec": {"containers": [{"name": "kube-proxy", "image": "kp"}]}}},
    }
    bodies = [
        verify.verify_job(
            "to-nft", "uid-1", namespace="kube-system", node=node,
            modes=("nftables", "iptables"), settings=settings,
        ),
        jobs.cleanup_job("to-nft", "uid-1", source, node, deadline_seconds=60),
    ]  # fmt: skip
    for body in bodies:
        for meta in (body["metadata"], body["spec"]["template"]["metadata"]):
            value = meta["labels"][objects.JOB_NODE_LABEL]
            assert len(value) <= 63 and LABEL_VALUE.match(value), value
            assert objects.job_node(meta) == node
        assert body["spec"]["template"]["spec"]["nodeName"] == node


def test_label_values_of_two_long_names_differ_and_short_valid_ones_are_kept() -> None:
    assert naming.label_value("n1") == "n1"
    assert naming.label_value(LONG_NODE) != naming.label_value(LONG_NODE + "x")
    assert naming.label_value("-odd-") != "-odd-" and LABEL_VALUE.match(naming.label_value("-odd-"))


def test_a_job_from_before_the_annotation_is_read_from_its_label() -> None:
    assert objects.job_node({"labels": {objects.JOB_NODE_LABEL: "n1"}}) == "n1"
