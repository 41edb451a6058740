"""The status view (pure): the tree, the JSON shape, exit codes and the tolerant reads."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from proxymode.cli import tree
from proxymode.cli.common import duration

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def node(name: str, zone: str, mode: str | None = None) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": zone}
    if mode:
        labels["proxymode.io/mode"] = mode
    return {"metadata": {"name": name, "labels": labels}}


NODES = [
    node("canary-1", "zone-a", "nftables"),
    node("canary-2", "zone-b", "nftables"),
    node("general-1", "zone-c", "switching"),
    node("general-2", "zone-a"),
]


def policy(**status: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "phase": "Progressing",
        "sourceMode": "iptables",
        "targetMode": "nftables",
        "currentStageName": "half",
        "nodeProgress": "2/4",
        "startedTime": ts(120),
        "moves": [{"node": "general-1", "direction": "Forward", "since": ts(4)}],
        "stages": [
            {
                "name": "canary",
                "phase": "Completed",
                "nodes": ["canary-1", "canary-2"],
                "nodesDone": 2,
            },
            {"name": "half", "phase": "Progressing", "nodes": ["general-1"], "nodesDone": 0},
            {"name": "all", "phase": "Pending", "nodes": ["general-2"], "nodesDone": 0},
        ],
        "analysis": {
            "rounds": 4,
            "passingRounds": 3,
            "checks": [
                {"name": "sync-p99", "canary": 0.031, "baseline": 0.12, "verdict": "Pass"},
                {"name": "vs-iptables", "canary": 0.26, "verdict": "Fail", "message": "too slow"},
            ],
        },
        "preflight": {
            "passed": True,
            "findings": [
                {
                    "severity": "Warning",
                    "code": "KernelTooOld",
                    "message": "kernel 4.18 cannot run nftables",
                    "nodes": ["legacy-1"],
                }
            ],
        },
    }
    base.update(status)
    return {
        "metadata": {"name": "to-nft", "creationTimestamp": ts(130)},
        "spec": {
            "targetMode": "nftables",
            "stages": [],
            "analysis": {
                "minPassingRounds": 5,
                "checks": [
                    {"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1},
                    {"name": "vs-iptables", "template": "SyncLatencyP99", "maxRatioToBaseline": 2},
                ],
            },
        },
        "status": base,
    }


EVENTS = [
    {"type": "Normal", "reason": "StageStarted", "message": "stage half", "lastTimestamp": ts(5)},
    {"type": "Normal", "reason": "RolloutStarted", "message": "go", "lastTimestamp": ts(100)},
]


def test_tree_shows_stages_nodes_moves_checks_findings_and_events_in_order() -> None:
    text = tree.render(tree.view(policy(), NODES, EVENTS, NOW), NOW)
    lines = text.splitlines()
    assert lines[0] == "ProxyModePolicy to-nft   iptables -> nftables"
    assert "Phase:    Progressing   stage half, 2/4 nodes moved" in text
    canary = next(i for i, line in enumerate(lines) if "canary " in line and "Completed" in line)
    assert lines[canary].startswith("├── ✔ canary")
    assert "canary-1" in lines[canary + 1] and "nftables" in lines[canary + 1]
    assert "moved, verified" in lines[canary + 1]
    moving = next(line for line in lines if "general-1" in line)
    assert "switching" in moving and "forward: between proxies" in moving
    waiting = next(line for line in lines if "general-2" in line)
    assert "iptables" in waiting and "not moved" in waiting
    check = next(line for line in lines if line.strip().startswith("vs-iptables"))
    assert "<= 2x baseline" in check and "Fail" in check and "too slow" in check
    assert "<= 1s" in next(line for line in lines if line.strip().startswith("sync-p99"))
    assert "KernelTooOld" in text and "[legacy-1]" in text
    assert "Checks   round 4, 3 passing (of 5 needed)," in text
    # Events oldest first, the newest last, with kubectl-style ages.
    events = lines[lines.index("Events (last 2)") + 1 :]
    assert "RolloutStarted" in events[0] and "1m40s" in events[0]
    assert "StageStarted" in events[1] and "5s" in events[1]


def test_columns_widen_for_long_check_stage_and_node_names() -> None:
    """A check named longer than the column (``sync-latency-vs-iptables``) keeps its row's
    values under their headers, as do a long stage and node name."""
    p = policy()
    p["status"]["analysis"]["checks"][1]["name"] = "sync-latency-vs-iptables"
    p["spec"]["analysis"]["checks"][1]["name"] = "sync-latency-vs-iptables"
    p["status"]["stages"][2]["name"] = "everything-else-after"
    p["status"]["stages"][2]["nodes"] = ["ip-10-0-12-34.eu-west-1.compute.internal"]
    nodes = [*NODES, node("ip-10-0-12-34.eu-west-1.compute.internal", "zone-a")]
    lines = tree.render(tree.view(p, nodes, [], NOW), NOW).splitlines()
    header = next(line for line in lines if line.strip().startswith("NAME"))
    for name in ("sync-p99", "sync-latency-vs-iptables"):
        row = next(line for line in lines if line.strip().startswith(name))
        assert row.index("<=") == header.index("THRESHOLD"), (header, row)
    rows = [line for line in lines if line[4:6] in {f"{m} " for m in tree.STAGE_MARK.values()}]
    assert len(rows) == 3, lines
    assert len({line.index(line.split()[3]) for line in rows}) == 1, rows
    leaves = [line for line in lines if "zone-" in line]
    assert len({line.index("zone-") for line in leaves}) == 1, leaves


def test_view_is_plain_json() -> None:
    v = tree.view(policy(), NODES, EVENTS, NOW)
    again = json.loads(json.dumps(v))
    assert again["phase"] == "Progressing"
    assert [s["name"] for s in again["stages"]] == ["canary", "half", "all"]
    assert again["stages"][1]["nodes"][0] == {
        "name": "general-1",
        "zone": "zone-c",
        "mode": "switching",
        "step": "forward: between proxies",
    }
    assert again["analysis"]["checks"][1]["threshold"] == "<= 2x baseline"


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            {"rollbackReason": "CheckFailed: sync-p99 failed 2 rounds"},
            ("CheckFailed", "sync-p99 failed 2 rounds"),
        ),
        (
            {"rollbackReason": "CheckFailed", "rollbackMessage": "sync-p99 failed 2 rounds"},
            ("CheckFailed", "sync-p99 failed 2 rounds"),
        ),
        ({"rollbackReason": {"code": "Aborted", "message": "by hand"}}, ("Aborted", "by hand")),
        ({"rollbackReason": "rolled back by hand"}, ("rolled back by hand", None)),
        ({}, (None, None)),
    ],
)
def test_rollback_reason_reads_both_shapes(
    status: dict[str, Any], expected: tuple[str | None, str | None]
) -> None:
    assert tree.rollback_reason(status) == expected


def test_rolled_back_policy_shows_the_reason() -> None:
    p = policy(phase="RolledBack", rollbackReason="CheckFailed", rollbackMessage="p99 2.5s > 1s")
    text = tree.render(tree.view(p, NODES, [], NOW), NOW)
    assert "Rollback: CheckFailed: p99 2.5s > 1s" in text


def test_exit_codes_are_distinct_and_none_while_running() -> None:
    codes = {p: tree.exit_code(p) for p in ("Completed", "RolledBack", "Failed")}
    assert codes == {"Completed": 0, "RolledBack": 3, "Failed": 4}
    assert len({*codes.values(), tree.EXIT_TIMEOUT, tree.EXIT_ERROR}) == 5
    for running in ("Pending", "Preflight", "Progressing", "Analyzing", "Paused", "RollingBack"):
        assert tree.exit_code(running) is None


def test_a_finalized_run_shows_handed_back_nodes_on_the_target_mode() -> None:
    bare = [node(n["metadata"]["name"], "zone-a") for n in NODES]
    done = policy(phase="Completed", finalized=True, moves=[])
    v = tree.view(done, bare, [], NOW)
    assert {n["mode"] for s in v["stages"] for n in s["nodes"]} == {"nftables"}
    assert {n["step"] for s in v["stages"] for n in s["nodes"]} == {"moved, verified, handed back"}
    kept = tree.view(policy(phase="Completed", finalized=False, moves=[]), NODES, [], NOW)
    assert kept["stages"][2]["nodes"][0]["mode"] == "iptables"


def test_a_rollback_shows_unlabelled_nodes_of_started_stages_as_back() -> None:
    """A review: deleted while Finalizing, the nodes already handed back showed "iptables
    not moved" under a Completed stage. In a rollback, an unlabelled node of a started stage
    is back on the source DaemonSet; one of a stage not started was never moved."""
    bare = [node(n["metadata"]["name"], "zone-a") for n in NODES]
    rolling = policy(phase="RollingBack", moves=[])
    v = tree.view(rolling, bare, [], NOW)
    steps = {s["name"]: {n["step"] for n in s["nodes"]} for s in v["stages"]}
    assert steps == {
        "canary": {"back on the source DaemonSet"},
        "half": {"back on the source DaemonSet"},
        "all": {"not moved"},
    }


def test_a_new_policy_shows_the_spec_stages_empty() -> None:
    p = {"metadata": {"name": "x"}, "spec": {"targetMode": "nftables", "stages": [{"name": "a"}]}}
    v = tree.view(p, [], [], NOW)
    assert v["phase"] == "Pending" and v["stages"][0]["name"] == "a"
    assert "Pending" in tree.render(v, NOW)


def test_list_table() -> None:
    rows = tree.list_rows([policy()], NOW)
    text = tree.render_table(rows)
    header, row = text.splitlines()
    assert header.split() == ["NAME", "SOURCE", "TARGET", "PHASE", "STAGE", "NODES", "AGE"]
    assert row.split() == ["to-nft", "iptables", "nftables", "Progressing", "half", "2/4", "2m10s"]
    assert tree.render_table([]) == "No ProxyModePolicies found.\n"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("1h30m", 5400), ("500ms", 0.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m5", "1h 30m", "-3s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)
