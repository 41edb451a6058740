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
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering"


RETRY_SECONDS = 2.0
WAIT_SECONDS = 120.0
"""How long a start waits for the peering object to be readable or creatable: the chart's
peering CRD and RBAC are applied beside the Deployment, so the first start may come before
the CRD is served or the binding is in effect; and the pod may start on a node whose
kube-proxy has not yet written the rules for ``10.96.0.1`` (a node just booted, or one this
operator is moving between proxies), so the API server is out of reach for a while."""


class PeeringUnavailableError(RuntimeError):
    """The peering object neither exists nor can be created: the replica would wait forever."""


def ensure_peering(
    api: client.ApiClient,
    name: str,
    *,
    wait_seconds: float = WAIT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Make sure the peering object ``name`` exists; True if this call created it.

    Read first (an object an administrator made is used as it is, even without the right to
    create one), then created when missing (409: another replica made it first). While the
    CRD is not served or RBAC refuses (404, 403), or the API server does not answer at all
    (no route to its Service yet), it tries again for ``wait_seconds``; then it raises: kopf
    would keep a replica without the object paused for good, with a healthy liveness probe
    and no word why, so the operator stops and says so instead.
    """
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            created = _read_or_create(custom, name)
        except ApiException as e:
            if e.status not in (403, 404):
                raise
            why = f"HTTP {e.status}: {e.reason}"
            hint = (
                ": install kopf's peering CRD (crds/kopf.dev_clusterkopfpeerings.yaml) and"
                " grant get and create on clusterkopfpeerings, or create the object yourself"
            )
        except HTTPError as e:  # no answer at all: no route, refused, reset, timed out
            why = f"the API server did not answer: {_reason(e)}"
            hint = ": check that this pod reaches the API server's Service"
        else:
            return created
        if time.monotonic() >= deadline:
            raise PeeringUnavailableError(
                f"the {KIND} {name!r} does not exist and could not be created ({why}){hint}"
            )
        log.warning("the %s %r cannot be read or created yet (%s); trying again", KIND, name, why)
        sleep(RETRY_SECONDS)


def _read_or_create(custom: client.CustomObjectsApi, name: str) -> bool:
    """True if this call created the object; an ApiException 403/404 if it can do neither."""
    try:
        custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        return False
    except ApiException as e:
        if e.status not in (403, 404):
            raise
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name}}
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    except ApiException as e:
        if e.status == 409:  # another replica made it first
            return False
        raise
    log.info("created the %s %r", KIND, name)
    return True


def _reason(error: HTTPError) -> str:
    """The innermost cause urllib3 gives (``MaxRetryError`` wraps the connection's own)."""
    reason = getattr(error, "reason", None)
    return str(reason if reason is not None else error)
