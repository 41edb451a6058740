"""The cleanup Job: ``kube-proxy --cleanup`` on one node, run as the source runs kube-proxy.

An iptables <-> ipvs move leaves the old mode's rules behind unless kube-proxy cleans them
(kube-proxy.md §5); this Job does it with the source DaemonSet's own image and the program
path its container calls (EKS calls ``kube-proxy`` from PATH, kubeadm an absolute path).
Split from ``objects`` (the target pair, the source patch, the snapshot), which it uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxymode.engine import naming
from proxymode.engine.objects import job_node_metadata, owner_reference
from proxymode.engine.observed import Object


def cleanup_job(
    policy: str, uid: str, source: Object, node: str, deadline_seconds: int = 120
) -> dict[str, Any]:
    """A Job that runs ``kube-proxy --cleanup`` on ``node`` with the source's own image.

    ``--cleanup`` removes every mode's rules (kube-proxy.md §5); it runs between the two
    proxies, when neither runs on the node, with the privileges kube-proxy itself has.
    ``activeDeadlineSeconds`` ends a Job that hangs (a pod stuck Pending, an image that never
    pulls) as Failed, so a node never waits at ``switching`` on it forever.
    """
    pod_spec = source["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    mounts = [m for m in container.get("volumeMounts", []) if m.get("name") != "kube-proxy"]
    mount_names = {m["name"] for m in mounts}
    volumes = [v for v in pod_spec.get("volumes", []) if v["name"] in mount_names]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": naming.cleanup_job(policy, node),
            "namespace": source["metadata"]["namespace"],
            **job_node_metadata(policy, node),
            "ownerReferences": [owner_reference(policy, uid)],
        },
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": job_node_metadata(policy, node),
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "hostNetwork": True,
                    "priorityClassName": pod_spec.get("priorityClassName", "system-node-critical"),
                    "tolerations": [{"operator": "Exists"}],
                    "serviceAccountName": pod_spec.get("serviceAccountName", "kube-proxy"),
                    "containers": [
                        {
                            "name": "cleanup",
                            "image": container["image"],
                            "command": [kube_proxy_program(container), "--cleanup", "--v=2"],
                            "securityContext": {"privileged": True},
                            "volumeMounts": mounts,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


def kube_proxy_program(container: Mapping[str, Any]) -> str:
    """The kube-proxy binary as the source container calls it: kubeadm's
    ``/usr/local/bin/kube-proxy``, EKS's ``kube-proxy`` from PATH, or the word naming it
    inside a ``sh -c`` line; ``kube-proxy`` (from PATH) when nothing names it."""
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    for word in words:
        for part in word.split():
            if part.rsplit("/", 1)[-1] == "kube-proxy":
                return part
    return "kube-proxy"


def kube_proxy_image(source: Object) -> str:
    containers = source["spec"]["template"]["spec"].get("containers", [])
    return str(containers[0].get("image", "")) if containers else ""
