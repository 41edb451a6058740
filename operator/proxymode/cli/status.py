"""``list`` and ``status NAME [--watch] [--timeout D]``: where every rollout is.

``status`` draws the tree of ``tree.render``; with ``--watch`` it draws it again whenever
something changes, and with ``--timeout`` it waits for the run to end and says how it ended
in its exit code (0 Completed, 3 RolledBack, 4 Failed, 5 still running at the deadline), the
way ``kubectl argo rollouts status --timeout`` serves CI scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from proxymode.cli import tree
from proxymode.cli.client import Cluster
from proxymode.cli.common import common_flags, connection, duration, emit

REFRESH_SECONDS = 5.0
CLEAR = "\x1b[H\x1b[2J"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "list",
        parents=[common_flags()],
        help="the policies, their phase and progress",
        description="kubectl proxymode list: every ProxyModePolicy with its modes, phase,"
        " stage and nodes moved.",
    )
    p.set_defaults(func=cmd_list)
    s = sub.add_parser(
        "status",
        parents=[common_flags()],
        help="a policy's stages, nodes, checks, findings and Events",
        description="kubectl proxymode status: a policy as a tree (stages -> nodes with their"
        " mode and move step), its checks, preflight findings and last Events. With --timeout"
        " it waits for the end: exit 0 Completed, 3 RolledBack, 4 Failed, 5 timeout.",
    )
    s.add_argument("name", help="the ProxyModePolicy")
    s.add_argument("-w", "--watch", action="store_true", help="draw again on every change")
    s.add_argument(
        "-t",
        "--timeout",
        type=duration,
        default=None,
        help="wait at most this long (90s, 5m, 1h) for Completed/RolledBack/Failed",
    )
    s.set_defaults(func=cmd_status)


def cmd_list(args: argparse.Namespace) -> int:
    cluster = Cluster(connection(args))
    rows = tree.list_rows(cluster.policies(), datetime.now(UTC))
    if args.output == "text":
        print(tree.render_table(rows), end="")
    else:
        emit(rows, args.output)
    return 0


def _look(cluster: Cluster, name: str) -> dict[str, Any]:
    policy = cluster.policy(name)
    return tree.view(policy, cluster.nodes(), cluster.events(name), datetime.now(UTC))


def _show(v: dict[str, Any], fmt: str, redraw: bool) -> None:
    if fmt == "text":
        if redraw:
            sys.stdout.write(CLEAR)
        sys.stdout.write(tree.render(v, datetime.now(UTC)))
    elif fmt == "json":
        print(json.dumps(v, default=str))  # one document per line while watching
    else:
        emit(v, fmt)
        print("---")
    sys.stdout.flush()


def _key(v: dict[str, Any]) -> str:
    """What a redraw is for: everything but the ages."""
    stripped = dict(v, events=[{k: e[k] for k in e if k != "age"} for e in v["events"]])
    return json.dumps(stripped, sort_keys=True, default=str)


def cmd_status(args: argparse.Namespace) -> int:
    cluster = Cluster(connection(args))
    v = _look(cluster, args.name)
    if not args.watch and args.timeout is None:
        if args.output == "text":
            print(tree.render(v, datetime.now(UTC)), end="")
        else:
            emit(v, args.output)
        return 0
    redraw = args.output == "text" and args.watch and sys.stdout.isatty()
    deadline = None if not args.timeout else time.monotonic() + args.timeout
    _show(v, args.output, redraw)
    last = _key(v)
    while True:
        code = tree.exit_code(str(v["phase"]))
        if code is not None:
            return code
        left = REFRESH_SECONDS if deadline is None else deadline - time.monotonic()
        if left <= 0:
            print(
                f"timed out after {args.timeout:g}s: {args.name} is {v['phase']}", file=sys.stderr
            )
            return tree.EXIT_TIMEOUT
        # A watch wakes on the policy's changes; the refresh also catches node label changes.
        for _ in cluster.watch_policy(args.name, min(left, REFRESH_SECONDS)):
            v = _look(cluster, args.name)
            if _key(v) != last:
                _show(v, args.output, redraw)
                last = _key(v)
            if tree.exit_code(str(v["phase"])) is not None:
                break
        v = _look(cluster, args.name)
        if _key(v) != last:
            _show(v, args.output, redraw)
            last = _key(v)
