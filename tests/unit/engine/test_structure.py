"""The engine's structure: the one gate, the bounded phase chain, the one matcher, the
preflight chain's documented codes, and the status the API change of decision 0010 gives."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import proxymode.engine.preflight as preflight_package
from proxymode.api.models import (
    Analysis,
    AnalysisStatus,
    CheckResult,
    LabelSelector,
    Phase,
    PolicyStatus,
    ProxyModePolicy,
    Verdict,
)
from proxymode.api.reasons import PauseReason, RollbackReason
from proxymode.engine import gate, machine
from proxymode.engine.gate import GateVerdict
from proxymode.engine.look import Look
from proxymode.engine.matching import requirement_holds, selector_matches
from proxymode.engine.observed import MODE_LABEL, CheckOutcome
from proxymode.engine.preflight import CHAIN, Code
from tests.unit.engine.sim import Sim

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
CANARY = [{"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 0}]


def policy(**spec: Any) -> ProxyModePolicy:
    body = {"targetMode": "nftables", "stages": CANARY, **spec}
    return ProxyModePolicy.model_validate(
        {"metadata": {"name": "to-nft", "uid": "uid-1", "generation": 1}, "spec": body}
    )


def analysis(**fields: Any) -> Analysis:
    body = {
        "prometheus": {"url": "http://prometheus:9090"},
        "checks": [{"name": "sync", "template": "SyncLatencyP99", "maxSeconds": 1}],
        **fields,
    }
    return Analysis.model_validate(body)


def outcome(verdict: str) -> CheckOutcome:
    return CheckOutcome(name="c", verdict=Verdict(verdict), canary=None, baseline=None, message="")


# -- the gate --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ((), Verdict.INCONCLUSIVE),
        (("Pass", "Pass"), Verdict.PASS),
        (("Pass", "Inconclusive"), Verdict.INCONCLUSIVE),
        (("Inconclusive", "Fail", "Pass"), Verdict.FAIL),
    ],
)
def test_a_round_is_as_bad_as_its_worst_check(verdicts: tuple[str, ...], expected: Verdict) -> None:
    assert gate.round_verdict([outcome(v) for v in verdicts]) is expected


def test_counted_rounds_reset_the_other_streaks() -> None:
    status = AnalysisStatus()
    for verdict in (Verdict.FAIL, Verdict.FAIL, Verdict.INCONCLUSIVE, Verdict.PASS):
        gate.count_round(status, verdict)
    assert (status.rounds, status.passing_rounds) == (4, 1)
    assert (status.consecutive_failures, status.consecutive_inconclusive) == (0, 0)
    gate.count_round(status, Verdict.INCONCLUSIVE)
    gate.count_round(status, Verdict.FAIL)
    assert (status.consecutive_failures, status.consecutive_inconclusive) == (1, 0)


def test_the_gate_verdict_puts_failure_before_no_data_before_passing() -> None:
    spec = analysis(failureLimit=2, inconclusiveLimit=2, minPassingRounds=1)
    passing = [CheckResult(name="sync", verdict=Verdict.PASS)]
    assert gate.gate_verdict(spec, AnalysisStatus()) is GateVerdict.WAIT
    opened = AnalysisStatus(passing_rounds=1, checks=passing)
    assert gate.gate_verdict(spec, opened) is GateVerdict.OPEN
    no_data = AnalysisStatus(passing_rounds=1, consecutive_inconclusive=2, checks=passing)
    assert gate.gate_verdict(spec, no_data) is GateVerdict.NO_DATA
    both = AnalysisStatus(consecutive_failures=2, consecutive_inconclusive=2)
    assert gate.gate_verdict(spec, both) is GateVerdict.FAILED


# -- the machine -----------------------------------------------------------------------------------


def test_phase_handlers_that_hand_on_forever_stop_at_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two phases that keep handing on to each other cost one look, never a RecursionError."""
    calls: list[Phase] = []

    def bounce(look: Look) -> Phase:
        calls.append(look.status.phase)
        nxt = Phase.ANALYZING if look.status.phase == Phase.PROGRESSING else Phase.PROGRESSING
        look.status.phase = nxt
        return nxt

    handlers = {**machine.HANDLERS, Phase.PROGRESSING: bounce, Phase.ANALYZING: bounce}
    monkeypatch.setattr(machine, "HANDLERS", handlers)
    stuck = policy().model_copy(update={"status": PolicyStatus(phase=Phase.PROGRESSING)})
    decision = machine.advance(stuck, Sim.cluster({"canary": 1}).observe())
    assert len(calls) == machine.MAX_PHASES_PER_LOOK
    assert decision.requeue_seconds <= 1


def test_only_the_machine_chains_phases() -> None:
    """No phase module imports another phase module (they hand on by returning a phase)."""
    phases = Path(machine.__file__).parent / "phases"
    for path in phases.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("proxymode.engine.phases"), path.name


# -- matching --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operator", "values", "labels", "holds"),
    [
        ("In", ["a"], {"k": "a"}, True),
        ("NotIn", ["a"], {}, True),
        ("Exists", [], {"k": ""}, True),
        ("DoesNotExist", [], {"k": "a"}, False),
        ("Gt", ["3"], {"k": "4"}, True),
        ("Lt", ["3"], {"k": "x"}, False),
        ("Gt", ["3", "4"], {"k": "9"}, False),
        ("Sideways", ["a"], {"k": "a"}, False),
    ],
)
def test_one_requirement_matcher_for_selectors_and_affinity(
    operator: str, values: list[str], labels: dict[str, str], holds: bool
) -> None:
    assert requirement_holds(operator, "k", values, labels) is holds


def test_a_label_selector_ands_labels_and_expressions() -> None:
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"pool": "canary"},
            "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}],
        }
    )
    assert selector_matches(selector, {"pool": "canary", "zone": "a"})
    assert not selector_matches(selector, {"pool": "canary", "zone": "b"})
    assert selector_matches(None, {})


# -- preflight -------------------------------------------------------------------------------------


def test_every_finding_code_is_documented_with_the_chain() -> None:
    doc = preflight_package.__doc__ or ""
    assert [c for c in Code if c.value not in doc] == []
    assert [name for name, _ in CHAIN if name not in doc] == []


def test_preflight_stores_the_nodes_it_excluded_and_the_plan_uses_them() -> None:
    sim = Sim.cluster({"canary": 2, "legacy": 1})
    first = policy(
        incompatibleNodes="Exclude",
        stages=[{"name": "all", "percent": 100, "bakeSeconds": 0}],
    )
    decision = machine.advance(first, sim.observe())
    assert decision.status.preflight is not None
    assert decision.status.preflight.excluded_nodes == ["legacy-1"]
    assert [n for s in decision.status.stages for n in s.nodes] == ["canary-1", "canary-2"]


# -- status ----------------------------------------------------------------------------------------


def test_an_old_combined_rollback_reason_is_read_as_code_and_message() -> None:
    status = PolicyStatus.model_validate(
        {"phase": "RollingBack", "rollbackReason": "Aborted: aborted by the annotation"}
    )
    assert status.rollback_reason is RollbackReason.ABORTED
    assert status.rollback_message == "aborted by the annotation"
    assert status.wire()["rollbackReason"] == "Aborted"


def test_enum_fields_are_enums_at_runtime() -> None:
    status = PolicyStatus.model_validate({"phase": "Paused", "pausedReason": "NoData"})
    assert status.phase is Phase.PAUSED
    assert status.paused_reason is PauseReason.NO_DATA


def drive(sim: Sim, current: ProxyModePolicy, done: Any, limit: int = 200) -> ProxyModePolicy:
    for _ in range(limit):
        decision = machine.advance(current, sim.observe())
        sim.execute(decision.actions)
        current = current.model_copy(update={"status": decision.status})
        sim.tick(min(decision.requeue_seconds, 5.0))
        if done(current):
            return current
    raise AssertionError(f"stuck in {current.status.phase}: {current.status.message}")


def test_degraded_says_so_when_a_moved_kube_proxy_fails_in_mixed_mode() -> None:
    """Completed in mixed mode looked Healthy whatever the moved nodes did; now the Degraded
    condition names the kube-proxy that restarts."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    done = drive(sim, policy(), lambda p: p.status.phase == Phase.COMPLETED)
    conditions = {c.type: c for c in done.status.conditions}
    assert conditions["Degraded"].status == "False"
    # Each condition says what it is about: the phase's message on Ready, nothing on the
    # False ones that have nothing to report (they used to repeat it five times).
    assert conditions["Ready"].status == "True" and conditions["Ready"].message
    assert [k for k, c in conditions.items() if c.status == "False" and c.message] == [
        "Progressing"
    ]
    assert sim.nodes["canary-1"].labels.get(MODE_LABEL) == "nftables"
    for pod in sim.proxies_on("canary-1"):
        pod.crashloop = True
    sim.tick()
    sim.now += timedelta(seconds=1)
    decision = machine.advance(done, sim.observe())
    conditions = {c.type: c for c in decision.status.conditions}
    assert decision.status.phase == Phase.COMPLETED
    assert conditions["Degraded"].status == "True"
    assert conditions["Degraded"].reason == "KubeProxyUnhealthy"
    assert "canary-1" in conditions["Degraded"].message


def test_degraded_says_so_when_a_mixed_mode_newcomer_cannot_finish_its_move() -> None:
    """A newcomer whose cleanup Job fails stays between proxies: Degraded names it."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    to_ipvs = policy(targetMode="ipvs")
    done = drive(sim, to_ipvs, lambda p: p.status.phase == Phase.COMPLETED)
    sim.fail_jobs = True
    sim.add_node("canary-2", "canary")

    def degraded(p: ProxyModePolicy) -> bool:
        return any(c.type == "Degraded" and c.status == "True" for c in p.status.conditions)

    stuck = drive(sim, done, degraded, limit=40)
    assert stuck.status.phase == Phase.COMPLETED
    condition = next(c for c in stuck.status.conditions if c.type == "Degraded")
    assert "canary-2" in condition.message and "cleanup Job" in condition.message
