"""A moved node counts as moved only when it proves it (DESIGN §3.5, issue 11).

Ready is not enough: a kubeadm kube-proxy has no readiness probe, and kube-proxy deletes
the other modes' rules before it programs its own, so until its first full sync the node
has no Service rules while its pod looks fine (kube-proxy.md §9). Once the new pod is
Ready, the engine runs a verification Job pinned to the node (``proxymode verify-node``
from the operator's image): it waits for a full sync since kube-proxy started, reads the
rules, and connects to a Service through its ClusterIP. The Job's exit code is the
verdict; its termination message is the evidence (``proxymode.verify.report``). Until it
succeeds the move stays in ``status.moves``, so the node keeps holding ``maxUnavailable``.

Which step the node is at is read from the world each look (its Job and pods), like the
rest of the move: a restart resumes, a Job older than the node's new pod is stale and is
run again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from proxymode.api.models import (
    MAX_VERIFICATIONS,
    MoveDirection,
    NodeVerification,
    VerificationStatus,
)
from proxymode.api.reasons import EventReason
from proxymode.engine import naming
from proxymode.engine.actions import Action, CreateJob, DeleteObject
from proxymode.engine.look import Look
from proxymode.engine.objects import job_node_metadata, owner_reference
from proxymode.engine.observed import (
    JOB_KIND_LABEL,
    CleanupJobView,
    JobKind,
    Object,
    Observed,
)
from proxymode.kubeproxy import ConfigError, parse_config
from proxymode.verify import parse_report

DEFAULT_IMAGE = "proxymode/proxymode-operator:0.1.0"
"""The chart passes the operator's own image (``PROXYMODE_VERIFY_IMAGE``); this is the
Dockerfile's name for it, for an operator run outside the chart."""
JOB_SLACK_SECONDS = 60
"""The Job's own deadline past ``verify.timeoutSeconds``: its pod must start first."""
LATE_SLACK_SECONDS = 90
"""The engine gives up on a Job that has not finished this long past the timeout (a pod
that never starts, a Job controller that is down)."""


@dataclass(frozen=True)
class Settings:
    """What a move needs to verify a node; None in a MoveContext when verification is off."""

    service: str
    """``namespace/name:port``."""
    timeout_seconds: int
    image: str
    service_ip: str | None


@dataclass
class Outcome:
    """What one look at a node's verification found."""

    actions: list[Action] = field(default_factory=list)
    verified: bool = False
    failure: str | None = None
    record: NodeVerification | None = None


def modes(direction: MoveDirection | str, source: str, target: str) -> tuple[str, str]:
    """(the mode the node must run now, the mode it left). ``source`` is the mode the
    source DaemonSet's pods start in now (``source_running_mode``): for a hand-back that is
    the target mode already, so the node changes DaemonSet and not mode."""
    if direction == MoveDirection.FORWARD:
        return target, source
    return source, target


def service_key(service: str) -> str:
    """``namespace/name`` of ``namespace/name:port``."""
    return service.rsplit(":", 1)[0]


def step(
    node: str,
    direction: MoveDirection | str,
    *,
    pod_born: datetime | None,
    observed: Observed,
    policy: tuple[str, str, str],
    mode_pair: tuple[str, str],
    settings: Settings,
    source: Object | None,
) -> Outcome:
    """One look at the verification of ``node``, whose new kube-proxy is Ready.

    ``policy`` is (name, uid, namespace); ``mode_pair`` (source mode, target mode).
    """
    name, uid, namespace = policy
    expected, previous = modes(direction, *mode_pair)
    out = Outcome()
    job = observed.verify_job_on(node)
    if job is not None and _older(job.created, pod_born):
        # From before this kube-proxy started: not its proof. Run it again once it is gone.
        out.actions.append(DeleteObject("batch/v1", "Job", namespace, job.name))
        return out
    if job is None:
        if settings.service_ip is None:
            why = (
                f"the Service {service_key(settings.service)} (spec.verify.service) was not"
                " found or has no ClusterIP"
            )
            if not _back(
                out, direction=direction, node=node, expected=expected, why=why, now=observed.now
            ):
                out.failure = f"node {node} cannot be verified: {why}"
            return out
        body = verify_job(
            name,
            uid,
            namespace=namespace,
            node=node,
            modes=(expected, previous),
            settings=settings,
            service_account=_service_account(source),
        )
        out.actions.append(CreateJob(body))
        return out
    if not (job.succeeded or job.failed):
        age = (observed.now - job.created).total_seconds() if job.created else 0.0
        limit = settings.timeout_seconds + LATE_SLACK_SECONDS
        if age > limit:
            why = (
                f"the verification Job {job.name} has not finished {age:.0f}s after it was"
                f" created (limit {limit}s)"
            )
            if _back(
                out, direction=direction, node=node, expected=expected, why=why, now=observed.now
            ):
                out.actions.append(DeleteObject("batch/v1", "Job", namespace, job.name))
            else:
                out.failure = f"node {node} not verified: {why}"
        return out
    _finished(out, job, node=node, direction=direction, expected=expected, now=observed.now)
    if out.verified:
        out.actions.append(DeleteObject("batch/v1", "Job", namespace, job.name))
    return out


def _back(
    out: Outcome,
    *,
    direction: MoveDirection | str,
    node: str,
    expected: str,
    why: str,
    now: datetime,
) -> bool:
    """A move back that cannot be verified still counts as done: the node is on the proxy it
    had before the run and nothing better is left to move it to, so a rollback (or a
    deletion) goes on; the failed record goes to status and a Warning Event. True if so."""
    if direction != MoveDirection.BACK:
        return False
    out.record = NodeVerification(
        node=node,
        time=now,
        verified=False,
        mode=expected,
        direction=MoveDirection.BACK,
        summary=f"not verified: {why}"[:1024],
    )
    out.verified = True
    return True


def _finished(
    out: Outcome,
    job: CleanupJobView,
    *,
    node: str,
    direction: MoveDirection | str,
    expected: str,
    now: datetime,
) -> None:
    """The verdict of a finished verification Job: its record, and done or a failure."""
    report = parse_report(job.message)
    summary = report.summary if report is not None else ""
    out.record = NodeVerification(
        node=node,
        time=now,
        verified=job.succeeded,
        mode=expected,
        direction=MoveDirection(str(direction)),
        summary=(summary or ("verified" if job.succeeded else "failed"))[:1024],
        first_sync_seconds=report.first_sync_seconds if report else None,
        probe_millis=report.probe_millis if report else None,
    )
    if job.succeeded:
        out.verified = True
        return
    found = summary or _fallback(job.message)
    if direction == MoveDirection.BACK:
        # The node is back on the proxy it had before the run: nothing better is left to
        # move it to, so a rollback goes on (the failure is in status and a Warning Event).
        out.verified = True
        return
    out.failure = f"node {node} failed verification in {expected} mode: {found}"


def source_running_mode(look: Look, recorded: str) -> str:
    """The mode the source DaemonSet's pods start in now: its ConfigMap's, which Finalize
    has already set to the target (a hand-back, or a rollback from Finalizing), else the
    source mode recorded at the start."""
    cm = look.obs.source_config_map or {}
    text = (cm.get("data") or {}).get(look.spec.kube_proxy.config_key)
    if not text:
        return recorded
    try:
        return str(parse_config(str(text)).mode or recorded)
    except ConfigError:
        return recorded


def settings(look: Look) -> Settings | None:
    spec = look.spec.verify
    if not spec.enabled:
        return None
    return Settings(
        service=spec.service,
        timeout_seconds=spec.timeout_seconds,
        image=look.obs.verify_image,
        service_ip=look.obs.service_ips.get(service_key(spec.service)),
    )


def record(look: Look, entry: NodeVerification) -> None:
    """Count a node's verification in status (bounded lists) and say it in an Event."""
    status = look.status.verification or VerificationStatus()
    look.status.verification = status
    if not entry.verified:
        last = status.failures[-1] if status.failures else None
        key = (entry.node, entry.mode, entry.direction, entry.summary)
        if last is not None and (last.node, last.mode, last.direction, last.summary) == key:
            return  # the same failed Job seen again (a paused policy looks every few seconds)
        status.failed += 1
        status.failures = [*status.failures, entry][-MAX_VERIFICATIONS:]
    else:
        status.verified += 1
    status.latest = [*status.latest, entry][-MAX_VERIFICATIONS:]
    what = "verified" if entry.verified else "failed verification"
    look.event(
        EventReason.NODE_VERIFIED if entry.verified else EventReason.NODE_NOT_VERIFIED,
        f"{entry.node} {what} ({entry.mode}): {entry.summary}",
        warning=not entry.verified,
    )


def _older(created: datetime | None, born: datetime | None) -> bool:
    return created is not None and born is not None and created < born


def _fallback(message: str) -> str:
    tail = " ".join(message.split())[-300:]
    return f"the verification Job failed ({tail})" if tail else "the verification Job failed"


def _service_account(source: Object | None) -> str:
    spec = ((source or {}).get("spec") or {}).get("template", {}).get("spec", {})
    return str(spec.get("serviceAccountName") or "kube-proxy")


def verify_job(
    policy: str,
    uid: str,
    *,
    namespace: str,
    node: str,
    modes: tuple[str, str],
    settings: Settings,
    service_account: str = "kube-proxy",
) -> dict[str, Any]:
    """The Job that proves ``node``: ``proxymode verify-node`` with hostNetwork, as root
    with only NET_ADMIN and NET_RAW (reading netfilter), nothing mounted, no API token."""
    expected, previous = modes
    meta = job_node_metadata(policy, node, {JOB_KIND_LABEL: JobKind.VERIFY.value})
    port = settings.service.rsplit(":", 1)[1]
    command = [
        "proxymode",
        "verify-node",
        f"--mode={expected}",
        f"--previous={previous}",
        f"--service={settings.service}",
        f"--address={settings.service_ip}:{port}",
        f"--timeout={settings.timeout_seconds}",
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": naming.verify_job(policy, node),
            "namespace": namespace,
            **meta,
            "ownerReferences": [owner_reference(policy, uid)],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.timeout_seconds + JOB_SLACK_SECONDS,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": meta,
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "hostNetwork": True,
                    "automountServiceAccountToken": False,
                    "serviceAccountName": service_account,
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "verify",
                            "image": settings.image or DEFAULT_IMAGE,
                            "command": command,
                            "env": [
                                _field_env("NODE_NAME", "spec.nodeName"),
                                _field_env("NODE_IP", "status.hostIP"),
                            ],
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "securityContext": {
                                "runAsUser": 0,
                                "runAsNonRoot": False,
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
                            },
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "32Mi"},
                                "limits": {"memory": "128Mi"},
                            },
                        }
                    ],
                },
            },
        },
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
