"""``plan -f POLICY.yaml``: what a policy would do here, against the live cluster, changing nothing.

The file is validated with the API's own models (the rules the API server enforces), the
cluster is read through the operator's own observer (``proxymode.kube.observe``), and the
engine's pure preflight and planner decide; see ``planning``. Only reads are made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from proxymode.api import models
from proxymode.api.crd import NAME_TOO_LONG
from proxymode.api.models import ProxyModePolicy
from proxymode.cli import planning
from proxymode.cli.client import ClientError, Cluster
from proxymode.cli.common import common_flags, connection, emit

EXIT_REFUSED = 4
"""``plan``'s code when the run would not start: ``status``'s code for a policy whose preflight
refused it (Failed)."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        parents=[common_flags()],
        help="preflight and the stage plan of a policy file, changing nothing",
        description="kubectl proxymode plan: run the operator's preflight and planner for"
        " POLICY.yaml on the live cluster, read-only: which nodes each stage takes, in order"
        " and by zone, which nodes are left out and why, and the findings.",
    )
    p.add_argument("-f", "--filename", required=True, help="the ProxyModePolicy YAML ('-': stdin)")
    p.set_defaults(func=cmd_plan)


def load_policy(path: str) -> ProxyModePolicy:
    """The ProxyModePolicy in ``path``, validated; a clear error when there is none or it is bad."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except UnicodeDecodeError as e:
        raise ClientError(f"{path}: not a text file ({e.reason} at byte {e.start})") from e
    try:
        docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    except yaml.YAMLError as e:
        raise ClientError(f"{path}: not YAML: {_one_line(e)}") from e
    found = [d for d in docs if d.get("kind") == models.KIND]
    if not found:
        raise ClientError(f"{path}: no {models.KIND} in the file")
    if len(found) > 1:
        raise ClientError(f"{path}: {len(found)} {models.KIND}s in the file; plan takes one")
    doc = found[0]
    api_version = f"{models.GROUP}/{models.VERSION}"
    if "apiVersion" not in doc:
        raise ClientError(f"{path}: the {models.KIND} has no apiVersion; use {api_version}")
    if doc.get("apiVersion") != api_version:
        raise ClientError(
            f"{path}: apiVersion {doc.get('apiVersion')!r} is not served; use {api_version}"
        )
    doc.pop("status", None)  # plan as a new run, whatever the file carries
    name = str((doc.get("metadata") or {}).get("name") or "")
    if len(name) > models.MAX_POLICY_NAME:  # the CRD's CEL rule, as the API server says it
        raise ClientError(f"{path}: the policy is not valid:\n  metadata.name: {NAME_TOO_LONG}")
    try:
        return models.from_wire(doc)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ClientError(f"{path}: the policy is not valid:\n" + "\n".join(lines)) from e


def _one_line(e: yaml.YAMLError) -> str:
    """The parser's problem and where, on one line (its own text spans five, with a caret)."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{e.problem or e.context}{where}"
    return " ".join(str(e).split())


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.filename)
    except OSError as e:
        raise ClientError(f"cannot read {args.filename}: {e}") from e
    cluster = Cluster(connection(args))
    observed = cluster.observe(policy)
    v = planning.plan_view(policy.spec, observed, str(policy.metadata.get("name", "")))
    if args.output == "text":
        print(planning.render(v), end="")
    else:
        emit(v, args.output)
    # A refused preflight is the answer a pipeline gates on: the same code `status` gives a
    # policy that Failed its preflight (docs/plugin.md, exit codes), the plan printed either way.
    return 0 if v["wouldStart"] else EXIT_REFUSED
