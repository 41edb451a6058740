"""Golden logs of the main runs (Cluster API style): one line per look, compared to testdata.

Each line is what a reviewer would want to see change: the phase and stage after the look,
the nodes by mode label, and the actions summarised (labels set, objects applied, patched
or deleted, Jobs, Event reasons). No timestamps, uids or message wording, so the lines are
stable across the engine v2 restructure unless behaviour changes. A deliberate change of
behaviour: regenerate with ``PROXYMODE_UPDATE_GOLDEN=1 pytest tests/unit/engine/test_golden.py``
and review the diff like code.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.actions import (
    Action,
    ApplyObject,
    ClearAction,
    CreateJob,
    CreateObject,
    Decision,
    DeleteObject,
    EmitEvent,
    PatchObject,
    SaveBackup,
    SetNodeMode,
)
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import (
    THREE_STAGES,
    Run,
    make_policy,
    paused_code,
    rollback_code,
    terminal,
    with_spec,
)
from tests.unit.engine.sim import Sim

TESTDATA = Path(__file__).parent / "testdata"
UPDATE = os.environ.get("PROXYMODE_UPDATE_GOLDEN") == "1"


def summarise(action: Action) -> str:
    """One action in a few stable words: what it touches, never its message."""
    match action:
        case SetNodeMode():
            text = f"label {action.node}={action.value or '-'}"
        case ApplyObject():
            text = f"apply {action.obj['kind']}/{action.obj['metadata']['name']}"
        case PatchObject():
            text = f"patch {action.kind}/{action.name}"
        case DeleteObject():
            text = f"delete {action.kind}/{action.name}"
        case CreateJob():
            text = f"job {action.job['spec']['template']['spec']['nodeName']}"
        case SaveBackup():
            text = "backup"
        case CreateObject():
            text = f"create {action.obj['kind']}/{action.obj['metadata']['name']}"
        case EmitEvent():
            text = f"event {action.reason}"
        case ClearAction():
            text = f"clear {action.value}"
        case _:  # a new action type shows up by name
            text = type(action).__name__
    return text


def line(sim: Sim, policy: ProxyModePolicy, decision: Decision) -> str:
    st = policy.status
    by_label: dict[str, list[str]] = {}
    for name, node in sorted(sim.nodes.items()):
        by_label.setdefault(node.labels.get(MODE_LABEL) or "source", []).append(name)
    nodes = " ".join(f"{k}={','.join(v)}" for k, v in sorted(by_label.items()))
    stage = st.stages[st.current_stage].name if st.current_stage is not None and st.stages else "-"
    code = rollback_code(st)
    extra = f" rollback={code}" if code else ""
    if paused_code(st):
        extra += f" paused={paused_code(st)}"
    actions = "; ".join(summarise(a) for a in decision.actions) or "-"
    return f"{st.phase} stage={stage}{extra} | {nodes} | {actions}"


class GoldenRun(Run):
    """A Run that writes one golden line per look."""

    def __init__(self, sim: Sim, policy: ProxyModePolicy) -> None:
        super().__init__(sim, policy)
        self.lines: list[str] = []

    def step(self, **kwargs: object) -> Decision:
        decision = super().step(**kwargs)  # type: ignore[arg-type]
        self.lines.append(f"{len(self.lines):03d} {line(self.sim, self.policy, decision)}")
        return decision


def _forward() -> GoldenRun:
    run = GoldenRun(Sim.cluster({"canary": 2, "general": 4}), make_policy())
    run.until(terminal)
    return run


def _abort_in(phase: Phase, stage: int = 0) -> Callable[[], GoldenRun]:
    """Abort at the first look in ``phase`` at stage ``stage`` with a node moving, if any."""

    def scenario() -> GoldenRun:
        run = GoldenRun(Sim.cluster({"canary": 2, "general": 4}), make_policy())
        run.until(
            lambda p: (
                p.status.phase == phase
                and (p.status.current_stage or 0) >= stage
                # Finalizing: with a hand-back in flight, the source ConfigMap written.
                and (phase not in (Phase.PROGRESSING, Phase.FINALIZING) or bool(p.status.moves))
            )
        )
        run.sim.action = "abort"
        run.until(lambda p: p.status.phase in (Phase.ROLLED_BACK, Phase.FAILED))
        run.steps(2)
        return run

    return scenario


def _delete_mid_run() -> GoldenRun:
    run = GoldenRun(Sim.cluster({"canary": 2, "general": 4}), make_policy())
    run.until(lambda p: p.status.current_stage == 1)
    run.deleting = True
    run.until(lambda p: False)
    return run


def _plan_change() -> GoldenRun:
    run = GoldenRun(Sim.cluster({"canary": 2, "general": 6}), make_policy())
    run.until(lambda p: p.status.current_stage == 1)
    wider = [THREE_STAGES[0], {"name": "most", "percent": 75, "bakeSeconds": 10}, THREE_STAGES[2]]
    run.policy = with_spec(run.policy, stages=wider)
    run.steps(2)
    run.sim.action = "resume"
    run.until(terminal)
    return run


def _mixed_mode() -> GoldenRun:
    run = GoldenRun(Sim.cluster({"canary": 2, "general": 3}), make_policy(stages=[THREE_STAGES[0]]))
    run.until(terminal)
    run.steps(2)
    return run


SCENARIOS: dict[str, Callable[[], GoldenRun]] = {
    "forward-three-stages": _forward,
    "rollback-from-progressing": _abort_in(Phase.PROGRESSING, stage=1),
    "rollback-from-analyzing": _abort_in(Phase.ANALYZING),
    "rollback-from-finalizing": _abort_in(Phase.FINALIZING),
    "delete-mid-run": _delete_mid_run,
    "plan-change": _plan_change,
    "mixed-mode": _mixed_mode,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_log(name: str) -> None:
    got = "\n".join(SCENARIOS[name]().lines) + "\n"
    path = TESTDATA / f"{name}.golden"
    if UPDATE:
        path.write_text(got)
        return
    assert path.exists(), f"no {path.name}; run with PROXYMODE_UPDATE_GOLDEN=1 to write it"
    want = path.read_text()
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True), got.splitlines(keepends=True), "want", "got", n=1
            )
        )
        pytest.fail(f"{name} changed (regenerate with PROXYMODE_UPDATE_GOLDEN=1 if meant):\n{diff}")
