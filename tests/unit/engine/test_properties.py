"""Property tests: random sequences of faults, edits and actions through the controller model.

Hypothesis draws a sequence of events — node churn, pool-label edits, spec pauses, one-shot
actions (promote, abort, retry, resume), lost status writes, cut-short action batches, plan
edits and analysis verdicts — and the engine takes one look after each. The invariants of
DESIGN §3 are checked after every look:

- never two kube-proxies on a node;
- at most ``maxUnavailable`` nodes without a Ready kube-proxy, at most that many switching;
- only nodes the stored status records carry the mode label (checked after looks whose
  status write was kept: a lost write loses the record by definition);
- no stage completes under analysis without evidence (passing rounds, all checks passing)
  unless a person promoted it;
- after a rollback the world is exactly as before.

Derandomized with a bounded number of examples, so the module is deterministic and quick.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxymode.api.models import Phase, StagePhase, Verdict
from proxymode.engine.machine import advance
from proxymode.engine.observed import MODE_LABEL
from proxymode.engine.planner import max_unavailable_count
from tests.unit.engine.seq import ANALYSIS, THREE_STAGES, Run, check_world, make_policy, with_spec
from tests.unit.engine.sim import Sim

LOOKS = st.tuples(st.just("look"), st.integers(1, 10))
EVENTS = st.one_of(
    # Looks weigh most: a sequence of faults with no time between them tests little.
    *([LOOKS] * 8),
    st.tuples(st.just("lose"), st.just(0)),
    st.tuples(st.just("cut"), st.integers(0, 2)),
    st.tuples(st.just("add"), st.integers(0, 1)),
    st.tuples(st.just("remove"), st.integers(0, 7)),
    st.tuples(st.just("relabel"), st.integers(0, 7)),
    st.tuples(st.just("pause"), st.booleans()),
    st.tuples(st.sampled_from(["promote", "abort", "retry", "resume"]), st.just(0)),
    st.tuples(st.just("plan"), st.integers(0, 1)),
    st.tuples(st.just("verdict"), st.sampled_from(["Pass", "Fail", "Inconclusive", "none"])),
)
PLANS = [
    THREE_STAGES,
    [THREE_STAGES[0], {"name": "most", "percent": 75, "bakeSeconds": 10}, THREE_STAGES[2]],
]
PROPERTY_SETTINGS = settings(
    derandomize=True,
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)


@dataclass
class World:
    run: Run
    added: int = 0
    promoted_at: int = -10
    looks: int = 0


def _look(world: World, *, lose: bool = False, cut: int | None = None) -> None:
    run, sim = world.run, world.run.sim
    before = run.policy.status.model_copy(deep=True)
    if sim.action == "promote":
        world.promoted_at = world.looks
    obs = run.observe()
    decision = advance(run.policy, obs)
    sim.execute(decision.actions, stop_after=cut)
    if not lose:
        run.policy = run.policy.model_copy(update={"status": decision.status})
        run._publish()
    sim.tick(min(decision.requeue_seconds, 5.0))
    world.looks += 1
    status = run.policy.status if not lose else decision.status
    check_world(sim, status, run.budget, run.labels_before if not lose else _all_labels(sim))
    _no_promotion_without_evidence(world, before, decision.status)


def _all_labels(sim: Sim) -> dict[str, str | None]:
    """With a lost write the record is lost too: skip the recorded-labels check only."""
    return {n: v.labels.get(MODE_LABEL) for n, v in sim.nodes.items()}


def _no_promotion_without_evidence(world: World, before: Any, after: Any) -> None:
    spec = world.run.policy.spec
    if spec.analysis is None:
        return
    for old, new in zip(before.stages, after.stages, strict=False):
        if old.name != new.name or old.phase == new.phase or new.phase != StagePhase.COMPLETED:
            continue
        if not new.nodes or world.looks - world.promoted_at <= 2:
            continue
        analysis = after.analysis
        evidence = (
            analysis is not None
            and analysis.passing_rounds >= spec.analysis.min_passing_rounds
            and bool(analysis.checks)
            and all(c.verdict == Verdict.PASS for c in analysis.checks)
        )
        assert evidence, f"stage {new.name} completed without evidence: {analysis}"


def _apply(world: World, event: tuple[str, Any]) -> None:
    kind, arg = event
    run, sim = world.run, world.run.sim
    if kind == "look":
        for _ in range(arg):
            _look(world)
    elif kind == "lose":
        _look(world, lose=True)
    elif kind == "cut":
        _look(world, cut=arg)
    elif kind == "add" and world.added < 3:
        world.added += 1
        sim.add_node(f"{['canary', 'general'][arg]}-new{world.added}", ["canary", "general"][arg])
    elif kind == "remove":
        names = sorted(sim.nodes)
        if len(names) > 3:
            sim.remove_node(names[arg % len(names)])
    elif kind == "relabel":
        names = sorted(sim.nodes)
        node = sim.nodes[names[arg % len(names)]]
        node.labels["pool"] = "general" if node.labels.get("pool") == "canary" else "canary"
    elif kind == "pause":
        run.policy = with_spec(run.policy, paused=arg)
    elif kind in ("promote", "abort", "retry", "resume"):
        sim.action = kind
    elif kind == "plan":
        run.policy = with_spec(run.policy, stages=PLANS[arg])
    elif kind == "verdict":
        sim.verdict = None if arg == "none" else arg


def _world() -> World:
    sim = Sim.cluster({"canary": 2, "general": 4})
    stages = [{**s, "bakeSeconds": 10} for s in THREE_STAGES]
    analysis = {**ANALYSIS, "failureLimit": 2, "inconclusiveLimit": 3}
    return World(Run(sim, make_policy(stages=stages, analysis=analysis), check=False))


@PROPERTY_SETTINGS
@given(st.lists(EVENTS, min_size=10, max_size=40))
def test_invariants_hold_through_random_sequences(events: list[tuple[str, Any]]) -> None:
    world = _world()
    for event in events:
        _apply(world, event)
    # Then calm: faults stop, data passes, a person resumes; the run goes on a while, with
    # the invariants still checked. Then an abort: the world must come back exactly.
    run, sim = world.run, world.run.sim
    run.policy = with_spec(run.policy, paused=False)
    sim.verdict = "Pass"
    sim.action = "resume"
    for _ in range(40):
        _look(world)
    sim.action = "abort"
    for _ in range(200):
        _look(world)
        if run.policy.status.phase in (Phase.ROLLED_BACK, Phase.FAILED, Phase.COMPLETED):
            break
    if run.policy.status.phase == Phase.ROLLED_BACK:
        for _ in range(3):
            _look(world)
        ds = sim.get("DaemonSet", "kube-proxy")
        assert json.dumps(ds["spec"], sort_keys=True) == run.original_ds
        assert sim.get("ConfigMap", "kube-proxy")["data"] == run.original_cm
        assert all(MODE_LABEL not in n.labels for n in sim.nodes.values())
        assert sim.get("DaemonSet", "kube-proxy-nftables") is None
        for node in sim.nodes:
            pods = sim.proxies_on(node)
            assert [p.owner for p in pods] == ["kube-proxy"], node
            assert pods[0].mode == run.source_mode, node


def test_the_budget_the_properties_check_is_the_policys() -> None:
    """The harness: the budget is maxUnavailable of the policy (1 here), not a wider one."""
    world = _world()
    assert world.run.budget == max_unavailable_count(1, len(world.run.sim.nodes)) == 1
