"""Issue 9 sequences about the one-shot actions (promote, abort, retry, resume).

Each test drives the public ``advance()`` through the controller model with the
invariants checked at every step; xfail(strict) marks what today's engine gets wrong.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from proxymode.api.models import Phase
from proxymode.engine.actions import EmitEvent
from tests.unit.engine.seq import (
    ANALYSIS,
    THREE_STAGES,
    Run,
    make_policy,
    paused_code,
    terminal,
)
from tests.unit.engine.sim import Sim


def _paused_after_failed_analysis() -> Run:
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Fail"
    stages = [{**s, "bakeSeconds": 20} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages, analysis=ANALYSIS, rollback={"automatic": False}))
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    assert paused_code(run.policy.status) == "AnalysisFailed"
    return run


def _warned_about(run: Run, since: int, action: str) -> list[EmitEvent]:
    return [
        a
        for d in run.decisions[since:]
        for a in d.actions
        if isinstance(a, EmitEvent) and a.type == "Warning" and action in a.message
    ]


def test_resume_after_a_failed_analysis_pause_waits_for_new_rounds() -> None:
    """issue 9 item 8 (rollback.automatic false): resume starts the failure count over;
    with passing rounds from then on, the stage promotes (decision 0020)."""
    run = _paused_after_failed_analysis()
    run.sim.verdict = "Pass"
    run.sim.action = "resume"
    run.step()
    run.step()
    assert run.policy.status.phase != Phase.PAUSED, run.policy.status.message
    run.until(lambda p: (p.status.current_stage or 0) >= 1 or p.status.phase == Phase.PAUSED)
    assert run.policy.status.current_stage == 1, run.policy.status.message


def test_promote_during_a_failed_analysis_pause_promotes_the_stage() -> None:
    """issue 9 item 8: a person's promote overrides the failing gate of the stage (decision
    0020): the next stage starts."""
    run = _paused_after_failed_analysis()
    run.sim.action = "promote"
    for _ in range(4):
        run.step()
    assert run.policy.status.current_stage == 1, run.policy.status.message


def _failed(sim: Sim) -> Run:
    sim.fail_jobs = True
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(terminal)
    assert run.policy.status.phase == Phase.FAILED
    return run


def _mixed_mode(sim: Sim) -> Run:
    run = Run(sim, make_policy(stages=[THREE_STAGES[0]]))
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED and not run.policy.status.finalized
    return run


def test_abort_in_failed_is_honoured_or_refused_out_loud() -> None:
    """issue 9 item 21: abort in Failed rolls back or posts a Warning saying why not."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    run = _failed(sim)
    since = len(run.decisions)
    sim.action = "abort"
    run.steps(3)
    rolled = run.policy.status.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK)
    assert rolled or _warned_about(run, since, "abort")


def test_abort_in_mixed_mode_completed_is_honoured_or_refused_out_loud() -> None:
    """issue 9 item 21: abort of a mixed-mode Completed policy rolls back or posts a
    Warning saying why not (preflight advises it)."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = _mixed_mode(sim)
    since = len(run.decisions)
    sim.action = "abort"
    run.steps(3)
    rolled = run.policy.status.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK)
    assert rolled or _warned_about(run, since, "abort")


def _analyzing(sim: Sim) -> Run:
    slow = [{**s, "bakeSeconds": 3600} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=slow))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    return run


def _progressing(sim: Sim) -> Run:
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.PROGRESSING and bool(p.status.moves))
    return run


def _completed(sim: Sim) -> Run:
    run = Run(sim, make_policy())
    run.until(terminal)
    return run


SETUPS: dict[str, Callable[[Sim], Run]] = {
    "analyzing": _analyzing,
    "progressing": _progressing,
    "completed": _completed,
}


@pytest.mark.parametrize(
    ("where", "action"),
    [
        ("analyzing", "resume"),
        ("progressing", "retry"),
        ("completed", "abort"),
        ("progressing", "promote"),
    ],
)
def test_an_action_the_phase_cannot_honour_posts_a_warning(where: str, action: str) -> None:
    """issue 9 item 21: every one-shot action the phase cannot honour posts a Warning
    saying why (like PromoteIgnored), and is then removed."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = SETUPS[where](sim)
    phase = run.policy.status.phase
    since = len(run.decisions)
    sim.action = action
    run.steps(3)
    assert _warned_about(run, since, action), f"{action} in {phase}: nothing said"
    assert sim.action is None, "consumed"


def test_a_promote_set_again_at_once_is_acted_on_not_swallowed() -> None:
    """A person promotes stage after stage (the examples in the sandbox, an Argo CD action):
    the look that removes the first annotation forgets it too, so a second ``promote`` that
    arrives before any look saw the annotation gone is a new request, not the old one. Here
    the second stage adds no node (25 % of four is the canaries), so it bakes at once.
    Found by tests/examples/test_as_a_user_*.py: the 25 % stage of the canary example sat out
    its two-hour bake."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    stages = [
        {
            "name": "canary",
            "nodeSelector": {"matchLabels": {"pool": "canary"}},
            "bakeSeconds": 86400,
        },
        {"name": "quarter", "percent": 25, "bakeSeconds": 86400},
        {"name": "all", "percent": 100, "bakeSeconds": 86400},
    ]
    run = Run(sim, make_policy(stages=stages))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "promote"
    run.step()
    assert run.policy.status.current_stage == 1
    run.step()
    assert sim.action is None, "removed once the promotion was stored"
    assert run.policy.status.phase == Phase.ANALYZING, "the quarter stage bakes at once"
    sim.action = "promote"  # before any look saw the first one gone
    run.step()
    assert run.policy.status.current_stage == 2, run.policy.status.message


@pytest.mark.parametrize("where", sorted(SETUPS))
def test_a_handled_action_is_removed_on_the_next_look_within_a_second(where: str) -> None:
    """The look that acts on (or refuses) an action stores it as handled; the next look
    removes the annotation. That next look comes within a second, not on an idle policy's
    requeue (a minute): a review saw `resume` on a RolledBack policy still annotated 11 s
    after the Warning, so a person or Argo CD would think it still pending."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = SETUPS[where](sim)
    sim.action = "resume"
    first = run.step(tick=False)
    assert run.policy.status.handled_action == "resume"
    assert first.requeue_seconds <= 1.0, (where, first.requeue_seconds)
    run.step(tick=False)
    assert sim.action is None, "removed by the next look"


def test_an_action_set_while_a_look_clears_another_is_acted_on_not_erased() -> None:
    """The look that removes a handled ``resume`` read the policy before a person set
    ``abort``: the removal is refused (it tests the value) and the next look aborts."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = _analyzing(sim)
    sim.action = "resume"
    run.step(tick=False)
    assert run.policy.status.handled_action == "resume"
    seen = run.observe()  # this look's read: still resume
    sim.action = "abort"  # set while the look runs (a slow analysis round)
    run.step(observed=seen, tick=False)
    assert sim.action == "abort", "not erased"
    run.steps(2)
    assert run.policy.status.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK)
    assert run.policy.status.rollback_reason == "Aborted"
