"""Run one accepted spec through the controller model (``sim``, ``seq``) to an end state.

"No accepted spec crashes or wedges the engine" (issue 15 item 2): every look of the run
checks the invariants (``seq.Run.check``: never two proxies on a node, the budget kept),
and the run must reach Completed, RolledBack or Failed within a bounded number of looks.

Two passes per spec. The spec exactly as accepted runs for a few looks (a crash on any
value shows here). Then a copy with its clocks shortened runs to the end: a week's bake at
a 5 s interval is 120,000 looks in the model, and bake, interval, warm-up and the number of
passing rounds only scale how many looks the same path takes. The model's cluster has a
canary node and a general one; its analysis rounds pass.
"""

from __future__ import annotations

import copy
from typing import Any

from proxymode.api.models import Phase, ProxyModePolicy
from tests.unit.engine.seq import Run, with_spec
from tests.unit.engine.sim import Sim

END = frozenset({Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED})
EXACT_LOOKS = 2
MAX_LOOKS = 1500
LONGEST_TICK = 60.0
SHORT = {
    "bakeSeconds": 5,
    "intervalSeconds": 5,
    "warmupSeconds": 0,
    "windowSeconds": 10,
    "minPassingRounds": 1,
    "readyTimeoutSeconds": 60,
}


def shortened(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with every clock and round count capped, defaults included (a stage without
    bakeSeconds bakes 300 s; see the module docstring)."""
    out = copy.deepcopy(spec)
    for stage in out.get("stages") or []:
        stage["bakeSeconds"] = min(stage.get("bakeSeconds", 300), SHORT["bakeSeconds"])
    out["readyTimeoutSeconds"] = min(
        out.get("readyTimeoutSeconds", 300), SHORT["readyTimeoutSeconds"]
    )
    analysis = out.get("analysis")
    if isinstance(analysis, dict):
        defaults = {"intervalSeconds": 60, "warmupSeconds": 120, "windowSeconds": 300}
        defaults["minPassingRounds"] = 3
        for key, default in defaults.items():
            analysis[key] = min(analysis.get(key, default), SHORT[key])
    return out


def _sim(spec: dict[str, Any]) -> Sim:
    sim = Sim.cluster({"canary": 1, "general": 1})
    analysis = spec.get("analysis")
    if isinstance(analysis, dict):
        sim.verdict = "Pass"
        sim.checks = tuple(c["name"] for c in analysis.get("checks") or [])
        sim.round_every = float(analysis.get("intervalSeconds", 60))
    return sim


def _policy(spec: dict[str, Any]) -> ProxyModePolicy:
    return ProxyModePolicy.model_validate(
        {"metadata": {"name": "gen", "uid": "uid-gen", "generation": 1}, "spec": spec}
    )


def _drive(run: Run, looks: int) -> bool:
    """Up to ``looks`` looks, each followed by the time the engine asked to wait; True at
    an end state. A paused spec is resumed the way a person would (spec.paused: false)."""
    for _ in range(looks):
        decision = run.step(tick=False)
        if run.policy.status.phase in END:
            return True
        if run.policy.spec.paused:
            run.policy = with_spec(run.policy, paused=False)
        run.sim.tick(max(1.0, min(decision.requeue_seconds, LONGEST_TICK)))
    return False


def run_to_end(spec: dict[str, Any]) -> tuple[str, int]:
    """(end phase, looks) of the shortened run; AssertionError when it wedges."""
    exact = Run(_sim(spec), _policy(spec))
    _drive(exact, EXACT_LOOKS)
    short = shortened(spec)
    run = Run(_sim(short), _policy(short))
    if not _drive(run, MAX_LOOKS):
        raise AssertionError(
            f"not at an end state after {MAX_LOOKS} looks: {run.policy.status.phase}:"
            f" {run.policy.status.message}"
        )
    return str(run.policy.status.phase), len(run.decisions)
