"""The ``ClusterKopfPeering`` object peered replicas exchange keep-alives in.

kopf does not create it, and without it a replica run with ``--peering`` never learns of
the others. The chart used to create it as a Helm hook, which ``helm upgrade`` (and every
Argo CD sync: hooks are recreated by default there) deleted and created again: empty, so
the standby saw no peer and acted beside the senior replica until the senior's next
keep-alive, seconds later. Created by the operator when missing and never replaced, the
object keeps every replica's keep-alive across upgrades (decision 0071).
"""

from __future__ import annotations

import logging

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering"


def ensure_peering(api: client.ApiClient, name: str) -> bool:
    """Create the peering object ``name`` unless it exists; True if this call created it.

    An existing object is left as it is (its keep-alives are the peers'). A refusal (no
    RBAC to create it, no CRD) is logged and not raised: kopf then says the object is
    missing and waits for it, which is what an administrator who made it by hand expects.
    """
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name}}
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    except ApiException as e:
        if e.status == 409:
            return False
        if e.status in (403, 404):
            log.warning(
                "could not create the %s %r (HTTP %s): create it, or install kopf's peering"
                " CRD (crds/kopf.dev_clusterkopfpeerings.yaml); until it exists this replica"
                " waits",
                KIND,
                name,
                e.status,
            )
            return False
        raise
    log.info("created the %s %r", KIND, name)
    return True
