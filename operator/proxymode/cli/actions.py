"""``promote | abort | retry | pause | resume NAME`` and ``version``.

The one-shot actions go the operator's way (DESIGN §2): the ``proxymode.io/action``
annotation, which the operator acts on once and removes, so the plugin, ``kubectl annotate``
and Argo CD resource actions are the same thing. Pause and resume are ``spec.paused``, the
declarative switch (a resume also sets the annotation when the run paused by itself, on a
breach, no data or a changed plan). Each action is checked against the phase first, so a
request the operator would ignore is refused here, out loud, with the reason.
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any

from proxymode import __version__
from proxymode.cli.client import ClientError, Cluster
from proxymode.cli.common import common_flags, connection, emit
from proxymode.engine.observed import ACTION_ANNOTATION

KIND = "proxymodepolicy.proxymode.io"
HELP = {
    "promote": "skip the rest of the current stage's bake and gate (only while it bakes)",
    "abort": "roll every moved node back to the source mode",
    "retry": "start a RolledBack or Failed policy again from preflight",
    "pause": "set spec.paused: moves in flight finish, no new ones start",
    "resume": "clear spec.paused and resume a paused run",
}


def register(sub: Any) -> None:
    for action, text in HELP.items():
        p = sub.add_parser(
            action,
            parents=[common_flags()],
            help=text,
            description=f"kubectl proxymode {action}: {text}.",
        )
        p.add_argument("name", help="the ProxyModePolicy")
        p.set_defaults(func=cmd_action, action=action)
    v = sub.add_parser(
        "version",
        parents=[common_flags()],
        help="the plugin's version and the operator it finds",
        description="kubectl proxymode version: the plugin, the cluster, the CRD and the"
        " operator Deployments it finds.",
    )
    v.set_defaults(func=cmd_version)


def refusal(action: str, spec: dict[str, Any], status: dict[str, Any]) -> str | None:
    """Why the operator would ignore ``action`` now, or None when it would act on it."""
    phase = str(status.get("phase", "Pending"))
    if action == "promote":
        return _promote_refusal(spec, status, phase)
    if action == "abort" and phase in ("Completed", "RolledBack", "Failed", "RollingBack"):
        return f"nothing to abort: the phase is {phase}"
    if action == "retry" and phase not in ("Failed", "RolledBack"):
        return f"retry starts a Failed or RolledBack run again; the phase is {phase}"
    if action == "pause" and spec.get("paused"):
        return "already paused (spec.paused is true)"
    if action == "resume" and not spec.get("paused") and phase != "Paused":
        return f"not paused: the phase is {phase}"
    return None


def _promote_refusal(spec: dict[str, Any], status: dict[str, Any], phase: str) -> str | None:
    baking = phase == "Analyzing" or (
        phase == "Paused" and status.get("resumePhase") == "Analyzing"
    )
    if spec.get("paused"):
        return "spec.paused is true; resume first"
    if not baking:
        return f"promote acts only while a stage bakes (Analyzing); the phase is {phase}"
    return None


def cmd_action(args: argparse.Namespace) -> int:
    cluster = Cluster(connection(args))
    policy = cluster.policy(args.name)
    spec = policy.get("spec") or {}
    status = policy.get("status") or {}
    why = refusal(args.action, spec, status)
    if why is not None:
        raise ClientError(f"{args.action} {args.name}: {why}")
    if args.action == "pause":
        changed = cluster.set_paused(args.name, True)
        said = f"{KIND}/{args.name} paused (spec.paused=true)"
    elif args.action == "resume":
        changed = policy
        if spec.get("paused"):
            changed = cluster.set_paused(args.name, False)
        # The operator resumes a Spec pause by itself once spec.paused is false; any other
        # pause (a breach, no data, a changed plan) needs the one-shot action as well.
        if status.get("phase") == "Paused" and status.get("pausedReason") not in (None, "Spec"):
            changed = cluster.request_action(args.name, "resume")
        said = f"{KIND}/{args.name} resumed"
    else:
        changed = cluster.request_action(args.name, args.action)
        said = f"{KIND}/{args.name} {args.action} requested ({ACTION_ANNOTATION}={args.action})"
    # As `kubectl annotate -o json` does: the object as the API server stored the change,
    # without managedFields (kubectl shows them only when asked). Its status is the last
    # look's: the operator acts on the change at its next one.
    if args.output == "text":
        print(said)
    else:
        (changed.get("metadata") or {}).pop("managedFields", None)
        emit(changed, args.output)
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    try:
        cluster = Cluster(connection(args))
        crd = cluster.crd()
    except ClientError:
        # Like `kubectl version`: the plugin's own version first, then why the server's is not.
        if args.output == "text":
            print(f"plugin:   kubectl-proxymode {__version__} (python {platform.python_version()})")
        raise
    versions = [v["name"] for v in ((crd or {}).get("spec") or {}).get("versions") or []]
    operators = []
    for d in cluster.operators():
        containers = d["spec"]["template"]["spec"].get("containers") or []
        operators.append(
            {
                "namespace": d["metadata"]["namespace"],
                "name": d["metadata"]["name"],
                "image": containers[0].get("image") if containers else None,
                "version": (d["metadata"].get("labels") or {}).get("app.kubernetes.io/version"),
                "ready": f"{(d.get('status') or {}).get('readyReplicas', 0)}"
                f"/{d['spec'].get('replicas', 1)}",
            }
        )
    policies = cluster.policies() if crd is not None else []
    observed = sum(
        1
        for p in policies
        if (p.get("status") or {}).get("observedGeneration") == p["metadata"].get("generation")
    )
    data: dict[str, Any] = {
        "plugin": {"version": __version__, "python": platform.python_version()},
        "server": cluster.server_version(),
        "crd": {"installed": crd is not None, "versions": versions},
        "operators": operators,
        "policiesObserved": f"{observed}/{len(policies)}",
    }
    if args.output != "text":
        emit(data, args.output)
        return 0
    print(f"plugin:   kubectl-proxymode {__version__} (python {data['plugin']['python']})")
    print(f"server:   {data['server']}")
    crd_text = f"proxymodepolicies.proxymode.io {', '.join(versions)}" if crd else "not installed"
    print(f"crd:      {crd_text}")
    if operators:
        for o in operators:
            print(f"operator: {o['namespace']}/{o['name']} {o['image']} ready {o['ready']}")
    else:
        print(
            "operator: no Deployment labelled app.kubernetes.io/name=proxymode-operator"
            " (it may run outside the cluster)"
        )
    print(f"policies: {data['policiesObserved']} observed at their current generation")
    if crd is None:
        print("the ProxyModePolicy CRD is not installed", file=sys.stderr)
    return 0
