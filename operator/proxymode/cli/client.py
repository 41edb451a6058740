"""The plugin's only door to the cluster and to Prometheus: a thin client, no decisions.

Every read returns plain JSON (camelCase, as the API server sent it) so the pure modules
(``tree``, ``planning``, ``advice``, ``document``) work on data and are unit tested without a
cluster. Writes are the two a person makes by hand: the one-shot action annotation and
``spec.paused``, as JSON merge patches, so nothing else on the policy is touched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import requests
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from proxymode.api import models
from proxymode.api.models import ProxyModePolicy
from proxymode.engine.observed import ACTION_ANNOTATION, Observed
from proxymode.kube.kubeconfig import kubectl_context
from proxymode.kube.observe import Observer
from proxymode.kube.reach import (
    PrometheusAnswerError,
    api_server_session,
    prometheus_data,
    use_service_proxy,
)

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
OPERATOR_LABEL = "app.kubernetes.io/name=proxymode-operator"


class ClientError(RuntimeError):
    """A request the plugin could not complete; the message says what to do."""


@dataclass(frozen=True)
class Connection:
    """Where to talk to: the standard kubectl flags (kubectl passes none to a plugin)."""

    kubeconfig: str | None = None
    context: str | None = None


def _raw(call: Any, *args: Any, **kwargs: Any) -> Obj | None:
    try:
        response = call(*args, _preload_content=False, **kwargs)
    except ApiException as e:
        if e.status == 404:
            return None
        raise ClientError(f"the API server refused: {e.status} {e.reason}") from e
    data: Obj = json.loads(response.data)
    return data


class Cluster:
    """Reads and the two writes, through one API client."""

    def __init__(self, conn: Connection) -> None:
        try:
            self.api = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=conn.kubeconfig,
                context=conn.context or kubectl_context(conn.kubeconfig),
            )
        except (config.ConfigException, OSError) as e:
            raise ClientError(f"cannot load the kubeconfig: {e}") from e
        except yaml.YAMLError as e:
            problem = " ".join(str(e).split())
            raise ClientError(f"cannot load the kubeconfig: not YAML: {problem}") from e
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)

    # -- policies -----------------------------------------------------------------------

    def policies(self) -> list[Obj]:
        data = _raw(
            self.custom.list_cluster_custom_object, models.GROUP, models.VERSION, models.PLURAL
        )
        if data is None:
            raise ClientError("the ProxyModePolicy CRD is not installed in this cluster")
        return sorted(data.get("items") or [], key=lambda p: p["metadata"]["name"])

    def policy(self, name: str) -> Obj:
        data = _raw(
            self.custom.get_cluster_custom_object,
            models.GROUP,
            models.VERSION,
            models.PLURAL,
            name,
        )
        if data is None:
            raise ClientError(f'proxymodepolicy "{name}" not found')
        return data

    def watch_policy(self, name: str, timeout: float) -> Iterator[Obj]:
        """The policy each time it changes, for at most ``timeout`` seconds (0: no limit)."""
        kwargs: dict[str, Any] = {"field_selector": f"metadata.name={name}"}
        if timeout > 0:
            kwargs["timeout_seconds"] = max(1, int(timeout))
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            self.custom.list_cluster_custom_object,
            models.GROUP,
            models.VERSION,
            models.PLURAL,
            **kwargs,
        )
        for event in stream:
            obj = event.get("object")
            if isinstance(obj, dict):
                yield obj

    def patch_policy(self, name: str, body: Obj) -> Obj:
        try:
            result = self.custom.patch_cluster_custom_object(
                models.GROUP,
                models.VERSION,
                models.PLURAL,
                name,
                body,
                _content_type=MERGE_PATCH,
            )
        except ApiException as e:
            if e.status == 404:
                raise ClientError(f'proxymodepolicy "{name}" not found') from e
            raise ClientError(f"the API server refused the change: {e.reason}: {e.body}") from e
        patched: Obj = json.loads(json.dumps(result))
        return patched

    def request_action(self, name: str, action: str) -> Obj:
        """Set the one-shot annotation; the operator acts on it once and removes it."""
        return self.patch_policy(name, {"metadata": {"annotations": {ACTION_ANNOTATION: action}}})

    def set_paused(self, name: str, paused: bool) -> Obj:
        return self.patch_policy(name, {"spec": {"paused": paused}})

    def events(self, name: str) -> list[Obj]:
        """Events about the policy (kopf posts a cluster-scoped object's in ``default``)."""
        data = _raw(
            self.core.list_event_for_all_namespaces,
            field_selector=f"involvedObject.kind={models.KIND},involvedObject.name={name}",
        )
        return list((data or {}).get("items") or [])

    # -- the cluster --------------------------------------------------------------------

    def nodes(self) -> list[Obj]:
        return list((_raw(self.core.list_node) or {}).get("items") or [])

    def services(self) -> list[Obj]:
        return list((_raw(self.core.list_service_for_all_namespaces) or {}).get("items") or [])

    def endpoint_slices(self) -> list[Obj]:
        discovery = client.DiscoveryV1Api(self.api)
        data = _raw(discovery.list_endpoint_slice_for_all_namespaces)
        return list((data or {}).get("items") or [])

    def daemon_sets(self) -> list[Obj]:
        return list((_raw(self.apps.list_daemon_set_for_all_namespaces) or {}).get("items") or [])

    def config_map(self, namespace: str, name: str) -> Obj | None:
        return _raw(self.core.read_namespaced_config_map, name, namespace)

    def server_version(self) -> str:
        version: str = client.VersionApi(self.api).get_code().git_version
        return version

    def observe(self, policy: ProxyModePolicy) -> Observed:
        """The operator's own snapshot of the cluster for ``policy`` (reads only)."""
        try:
            return Observer(self.api).observe(policy)
        except ApiException as e:
            raise ClientError(f"the API server refused a read: {e.status} {e.reason}") from e

    def operators(self) -> list[Obj]:
        """Deployments of the operator (the chart's labels), in any namespace."""
        data = _raw(self.apps.list_deployment_for_all_namespaces, label_selector=OPERATOR_LABEL)
        return list((data or {}).get("items") or [])

    def crd(self) -> Obj | None:
        return _raw(self.ext.read_custom_resource_definition, f"{models.PLURAL}.{models.GROUP}")

    def prometheus(self, url: str) -> Prometheus:
        """A client for ``url`` that reaches it as the operator does from outside the cluster:
        an in-cluster Service URL through the API server's service proxy, with the
        kubeconfig's credentials (decision 0032). In a pod too: the kubeconfig may name
        another cluster than the one the pod's DNS would resolve the name in."""
        service = use_service_proxy(url, in_pod_too=True)
        if service is None:
            return Prometheus(url)
        session = requests.Session()
        verify = api_server_session(self.api, session)
        through = service.through(str(self.api.configuration.host))
        shown = f"{url} (through the API server's service proxy)"
        return Prometheus(through, session=session, verify=verify, shown=shown)


class Prometheus:
    """Instant and range queries by POST (long matchers stay out of URLs); built by
    ``Cluster.prometheus``, which decides how the URL is reached."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        *,
        session: requests.Session | None = None,
        verify: bool | str = True,
        shown: str | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ClientError(f"not a Prometheus URL: {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()
        self.verify = verify
        self.shown = shown or self.url
        """The URL as the user or the policy wrote it, for messages."""

    def _post(self, path: str, form: dict[str, str]) -> Any:
        try:
            response = self.session.post(
                f"{self.url}{path}", data=form, timeout=self.timeout, verify=self.verify
            )
        except (requests.RequestException, OSError, ValueError) as e:
            raise ClientError(f"Prometheus at {self.shown} did not answer: {e}") from e
        try:
            data = prometheus_data(response)
        except PrometheusAnswerError as e:
            raise ClientError(f"Prometheus {e}; at {self.shown}") from e
        if not isinstance(data.get("result"), list):
            raise ClientError(f"Prometheus answered without a result: {data!r}; at {self.shown}")
        return data["result"]

    def instant(self, query: str) -> list[tuple[dict[str, str], float]]:
        """Each series' labels and value now."""
        return [
            (r.get("metric") or {}, float(r["value"][1]))
            for r in self._post("/api/v1/query", {"query": query})
        ]

    def scalar(self, query: str) -> float | None:
        """The first series' value, None when the query returns nothing."""
        rows = self.instant(query)
        return rows[0][1] if rows else None

    def range(
        self, query: str, start: float, end: float, step: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """Each series' labels and ``(unix time, value)`` points over ``[start, end]``."""
        form = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"}
        return [
            (r.get("metric") or {}, [(float(t), float(v)) for t, v in r.get("values") or []])
            for r in self._post("/api/v1/query_range", form)
        ]
