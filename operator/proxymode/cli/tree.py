"""The ``status`` view, pure: a policy, its nodes and its Events in; a tree and a summary out.

The tree reads top-down the way a person asks: where is the run (phase, stage, nodes), what
did each stage take and where is each node (mode, move step, verified), what do the gates say
(canary, baseline, threshold, verdict), what did preflight find, and what happened last
(Events). The same data is offered as a plain mapping for ``-o json|yaml``.

The status is read as JSON, tolerantly: fields a newer operator adds are ignored, and the
rollback reason is read both as one ``"Code: message"`` string and as a code with a separate
``rollbackMessage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from proxymode.engine.observed import MODE_LABEL, SWITCHING

Obj = Mapping[str, Any]
ZONE_LABEL = "topology.kubernetes.io/zone"
TERMINAL = ("Completed", "RolledBack", "Failed")

EXIT_COMPLETED = 0
EXIT_ERROR = 1
EXIT_ROLLED_BACK = 3
EXIT_FAILED = 4
EXIT_TIMEOUT = 5
EXIT_CODES = {"Completed": EXIT_COMPLETED, "RolledBack": EXIT_ROLLED_BACK, "Failed": EXIT_FAILED}

STAGE_MARK = {
    "Completed": "✔",
    "Baking": "◷",
    "Progressing": "►",
    "RollingBack": "◄",
    "RolledBack": "↺",
    "Pending": "·",
}


def exit_code(phase: str) -> int | None:
    """The exit code ``status --timeout`` ends with in a terminal phase; None while running."""
    return EXIT_CODES.get(phase)


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(then: datetime | None, now: datetime) -> str:
    """``42s``, ``3m10s``, ``2h5m``, ``4d3h``: kubectl's short ages."""
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds < 600 else f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600}h"


def rollback_reason(status: Obj) -> tuple[str | None, str | None]:
    """``(code, message)`` from either shape of the rollback reason."""
    raw = status.get("rollbackReason")
    message = status.get("rollbackMessage")
    if isinstance(raw, Mapping):
        return raw.get("code") or raw.get("reason"), raw.get("message") or message
    if not raw:
        return None, message
    text = str(raw)
    if message is None and ": " in text:
        code, _, rest = text.partition(": ")
        if code and " " not in code:
            return code, rest
    return text, message


def threshold(check: Obj) -> str:
    """A check's bounds as a person writes them: ``<= 1s``, ``<= 2x baseline``, ``>= 0.99``."""
    parts = []
    if check.get("maxSeconds") is not None:
        parts.append(f"<= {_num(check['maxSeconds'])}s")
    if check.get("maxRatio") is not None:
        parts.append(f"<= {_num(check['maxRatio'])}")
    if check.get("maxRatioToBaseline") is not None:
        parts.append(f"<= {_num(check['maxRatioToBaseline'])}x baseline")
    if check.get("min") is not None:
        parts.append(f">= {_num(check['min'])}")
    if check.get("max") is not None:
        parts.append(f"<= {_num(check['max'])}")
    if check.get("mannWhitney") is not None:
        alpha = (check.get("mannWhitney") or {}).get("alpha", 0.05)
        parts.append(f"U-test a={_num(alpha)}")
    return ", ".join(parts) or "-"


def _num(value: Any) -> str:
    if value is None:
        return "-"
    number = float(value)
    if number == int(number) and abs(number) < 1e6:
        return str(int(number))
    return f"{number:.3f}" if abs(number) < 100 else f"{number:.0f}"


@dataclass(frozen=True)
class NodeLine:
    name: str
    zone: str
    mode: str
    step: str


def node_lines(
    status: Obj, nodes: Sequence[Obj], names: Sequence[str], started: bool = True
) -> list[NodeLine]:
    """Each of ``names`` with its zone, the mode it runs and where it is in its move.
    ``started``: the stage has started (its unlabelled nodes in a rollback are back, not
    "not moved": a review saw handed-back nodes shown so under a Completed stage)."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    target = str(status.get("targetMode") or "")
    source = str(status.get("sourceMode") or "iptables")
    moves = {m.get("node"): m for m in status.get("moves") or []}
    # Finalizing writes the target mode into the source ConfigMap first, then hands each
    # node back to the source DaemonSet (its label goes): a planned node without a label
    # then runs the target mode. A run that keeps the pair (finalized false) keeps labels.
    handed_back = str(status.get("phase")) in ("Finalizing", "Completed") and (
        status.get("finalized") is not False
    )
    out = []
    for name in names:
        node = by_name.get(name)
        if node is None:
            out.append(NodeLine(name, "-", "-", "gone from the cluster"))
            continue
        labels = node["metadata"].get("labels") or {}
        label = labels.get(MODE_LABEL)
        mode = label or (target if handed_back else source)
        move = moves.get(name)
        if move is None and label is None and handed_back:
            step = "moved, verified, handed back"
        elif move is not None:
            direction = str(move.get("direction", "Forward")).lower()
            where = "between proxies" if label == SWITCHING else "verifying the new proxy"
            step = f"{direction}: {where}"
        elif label == target and target:
            step = "moved, verified"
        elif label == SWITCHING:
            step = "between proxies"
        elif started and str(status.get("phase")) in ("RollingBack", "RolledBack"):
            step = "back on the source DaemonSet"
        else:
            step = "not moved"
        out.append(NodeLine(name, labels.get(ZONE_LABEL, "-"), mode, step))
    return out


def view(policy: Obj, nodes: Sequence[Obj], events: Sequence[Obj], now: datetime) -> dict[str, Any]:
    """The status as plain data: what ``-o json|yaml`` prints and the tree draws."""
    meta = policy.get("metadata") or {}
    spec = policy.get("spec") or {}
    status = policy.get("status") or {}
    checks_spec = {c.get("name"): c for c in (spec.get("analysis") or {}).get("checks") or []}
    code, message = rollback_reason(status)
    analysis = status.get("analysis") or {}
    stages = []
    for st in status.get("stages") or []:
        lines = node_lines(
            status, nodes, st.get("nodes") or [], started=st.get("phase", "Pending") != "Pending"
        )
        stages.append(
            {
                "name": st.get("name"),
                "phase": st.get("phase", "Pending"),
                "nodesDone": st.get("nodesDone", 0),
                "startedTime": st.get("startedTime"),
                "bakedSince": st.get("bakedSince"),
                "completedTime": st.get("completedTime"),
                "nodes": [line.__dict__ for line in lines],
            }
        )
    if not stages:  # before preflight planned anything: the spec's stages, empty
        stages = [
            {"name": s.get("name"), "phase": "Pending", "nodesDone": 0, "nodes": []}
            for s in spec.get("stages") or []
        ]
    checks = [
        {
            "name": c.get("name"),
            "canary": c.get("canary"),
            "baseline": c.get("baseline"),
            "threshold": threshold(checks_spec.get(c.get("name")) or {}),
            "verdict": c.get("verdict"),
            "message": c.get("message", ""),
        }
        for c in analysis.get("checks") or []
    ]
    preflight = status.get("preflight") or {}
    recent = sorted(events, key=_event_time)[-10:]
    return {
        "name": meta.get("name"),
        "phase": status.get("phase", "Pending"),
        "sourceMode": status.get("sourceMode"),
        "targetMode": status.get("targetMode") or spec.get("targetMode"),
        "run": status.get("run", 1),
        "currentStage": status.get("currentStageName"),
        "nodeProgress": status.get("nodeProgress"),
        "paused": bool(spec.get("paused")),
        "pausedReason": status.get("pausedReason"),
        "message": status.get("message"),
        "rollbackReason": code,
        "rollbackMessage": message,
        "startedTime": status.get("startedTime"),
        "completedTime": status.get("completedTime"),
        "stages": stages,
        "analysis": {
            "lastRoundTime": analysis.get("lastRoundTime"),
            "rounds": analysis.get("rounds", 0),
            "passingRounds": analysis.get("passingRounds", 0),
            "minPassingRounds": (spec.get("analysis") or {}).get("minPassingRounds"),
            "consecutiveFailures": analysis.get("consecutiveFailures", 0),
            "consecutiveInconclusive": analysis.get("consecutiveInconclusive", 0),
            "checks": checks,
        },
        "preflight": {
            "passed": preflight.get("passed"),
            "checkedTime": preflight.get("checkedTime"),
            "findings": list(preflight.get("findings") or []),
        },
        "events": [
            {
                "age": age(_event_time(e), now),
                "type": e.get("type"),
                "reason": e.get("reason"),
                "message": e.get("message"),
            }
            for e in recent
        ],
    }


def _event_time(event: Obj) -> datetime:
    """When the event last happened, as finely as it says: ``lastTimestamp`` keeps whole
    seconds, ``eventTime`` microseconds, so the later of the two orders the Events of one
    second as they were posted (an aggregated Event's later ``lastTimestamp`` still wins)."""
    times = [
        when
        for when in (parse_time(event.get(k)) for k in ("lastTimestamp", "eventTime"))
        if when is not None
    ]
    if times:
        return max(times)
    first = parse_time(event.get("firstTimestamp"))
    if first is not None:
        return first
    return parse_time(
        (event.get("metadata") or {}).get("creationTimestamp")
    ) or datetime.min.replace(tzinfo=UTC)


def render(v: Mapping[str, Any], now: datetime) -> str:
    """The tree, as text."""
    out: list[str] = []
    run = f"   run {v['run']}" if v.get("run", 1) != 1 else ""
    out.append(
        f"ProxyModePolicy {v['name']}   {v.get('sourceMode') or '?'} -> {v.get('targetMode')}{run}"
    )
    where = ""
    if v.get("currentStage"):
        where = f"   stage {v['currentStage']}"
    if v.get("nodeProgress"):
        where += f", {v['nodeProgress']} nodes moved"
    out.append(f"  Phase:    {v['phase']}{where}")
    if v.get("message"):
        out.append(f"  Message:  {v['message']}")
    if v.get("paused") or v.get("pausedReason"):
        why = v.get("pausedReason") or "Spec"
        out.append(f"  Paused:   {why}{' (spec.paused is true)' if v.get('paused') else ''}")
    if v.get("rollbackReason"):
        tail = f": {v['rollbackMessage']}" if v.get("rollbackMessage") else ""
        out.append(f"  Rollback: {v['rollbackReason']}{tail}")
    started = parse_time(v.get("startedTime"))
    if started is not None:
        done = parse_time(v.get("completedTime"))
        took = f", took {age(started, done)}" if done else ""
        out.append(f"  Started:  {age(started, now)} ago{took}")
    out.append("")
    out.extend(_stages(v["stages"], now))
    out.extend(_checks(v["analysis"]))
    out.extend(_preflight(v["preflight"]))
    if v["events"]:
        out.append("")
        out.append(f"Events (last {len(v['events'])})")
        wide = max(20, *(len(str(e.get("reason", ""))) for e in v["events"]))
        for e in v["events"]:
            kind = "Warning" if e.get("type") == "Warning" else "Normal"
            out.append(
                f"  {e['age']:>6}  {kind:<7}  {e.get('reason', ''):<{wide}} {e.get('message', '')}"
            )
    return "\n".join(out) + "\n"


def _stages(stages: Sequence[Mapping[str, Any]], now: datetime) -> list[str]:
    out = ["Stages"]
    wide = max(12, *(len(st["name"]) for st in stages)) if stages else 12
    named = max([22, *(len(n["name"]) for st in stages for n in st["nodes"])])
    for i, st in enumerate(stages):
        last = i == len(stages) - 1
        branch, stem = ("└── ", "    ") if last else ("├── ", "│   ")
        mark = STAGE_MARK.get(str(st["phase"]), "?")
        count = f"{st.get('nodesDone', 0)}/{len(st['nodes'])}"
        note = ""
        baked = parse_time(st.get("bakedSince"))
        if st["phase"] == "Baking" and baked is not None:
            note = f"   baking for {age(baked, now)}"
        out.append(f"{branch}{mark} {st['name']:<{wide}} {st['phase']:<12} {count:>5}{note}")
        for j, n in enumerate(st["nodes"]):
            twig = "└── " if j == len(st["nodes"]) - 1 else "├── "
            row = f"{n['name']:<{named}} {n['zone']:<8} {n['mode']:<10} {n['step']}"
            out.append(f"{stem}{twig}{row}")
    return out


def _checks(analysis: Mapping[str, Any]) -> list[str]:
    if not analysis.get("checks"):
        return []
    # Padded to the longest name and threshold, so a long check name keeps its row aligned.
    wide = max(16, *(len(c["name"]) for c in analysis["checks"]))
    limit = max(24, *(len(c["threshold"]) for c in analysis["checks"]))
    out = [
        "",
        f"Checks   round {analysis['rounds']}, {analysis['passingRounds']} passing"
        f"{_of(analysis.get('minPassingRounds'))},"
        f" {analysis['consecutiveFailures']} failing and"
        f" {analysis['consecutiveInconclusive']} without data in a row",
        f"  {'NAME':<{wide}} {'CANARY':>9} {'BASELINE':>9}  {'THRESHOLD':<{limit}} VERDICT",
    ]
    for c in analysis["checks"]:
        out.append(
            f"  {c['name']:<{wide}} {_num(c['canary']):>9} {_num(c['baseline']):>9}"
            f"  {c['threshold']:<{limit}} {c['verdict']}"
            + (f"  ({c['message']})" if c.get("message") and c["verdict"] != "Pass" else "")
        )
    return out


def _preflight(preflight: Mapping[str, Any]) -> list[str]:
    if preflight.get("passed") is None:
        return []
    verdict = "passed" if preflight["passed"] else "REFUSED"
    out = [
        "",
        f"Preflight {verdict}, {len(preflight['findings'])}"
        f" finding{'' if len(preflight['findings']) == 1 else 's'}",
    ]
    for f in preflight["findings"]:
        nodes = f.get("nodes") or []
        on = f" [{', '.join(nodes[:5])}{', ...' if len(nodes) > 5 else ''}]" if nodes else ""
        out.append(
            f"  {f.get('severity', ''):<8} {f.get('code', ''):<24} {f.get('message', '')}{on}"
        )
    return out


def list_rows(policies: Sequence[Obj], now: datetime) -> list[dict[str, Any]]:
    """One row per policy for ``list``."""
    rows = []
    for p in policies:
        status = p.get("status") or {}
        spec = p.get("spec") or {}
        rows.append(
            {
                "name": p["metadata"]["name"],
                "source": status.get("sourceMode") or "-",
                "target": spec.get("targetMode"),
                "phase": status.get("phase", "Pending"),
                "stage": status.get("currentStageName") or "-",
                "nodes": status.get("nodeProgress") or "-",
                "age": age(parse_time(p["metadata"].get("creationTimestamp")), now),
            }
        )
    return rows


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """kubectl's plain table: upper-case headers, columns padded to the widest cell."""
    if not rows:
        return "No ProxyModePolicies found.\n"
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    lines = ["   ".join(k.upper().ljust(widths[k]) for k in keys).rstrip()]
    lines += ["   ".join(str(r[k]).ljust(widths[k]) for k in keys).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def _of(needed: Any) -> str:
    """ " of N needed" when the spec says how many passing rounds a stage needs."""
    return f" (of {needed} needed)" if isinstance(needed, int) else ""
