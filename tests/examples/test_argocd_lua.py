"""Argo CD's health check and actions for ProxyModePolicy, run the way Argo CD runs them.

Why the tests are built like this:

- The scripts are read from the rendered ``argocd-cm`` ConfigMap, i.e. what Argo CD would
  run, and that ConfigMap is checked against the ``.lua`` files and the generator.
- Each script runs in a fresh Lua VM with only the libraries Argo CD loads (base, table,
  a safe os; no string, no math), in Lua 5.1 (gopher-lua's dialect) and in Lua 5.4. A
  script that calls ``string.find`` passes a plain Lua VM and fails in Argo CD.
- The statuses are genuine engine output: ``World`` drives the pure engine
  (``proxymode.engine.machine.advance``) through the simulated cluster of the engine's
  own unit tests and stores the status the way the operator does (a merge patch of
  ``model_dump(by_alias=True, mode="json")``, so unset fields are absent). Hand-made
  objects are used only for states the engine never stores (see ``HAND_MADE``).
- The actions are judged by the engine itself: for every sample and every action, the
  engine runs a few steps with and without the action; the action must change what the
  engine does exactly where discovery enables it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from proxymode.api.models import GROUP, KIND, VERSION, Phase, PolicySpec, ProxyModePolicy
from proxymode.engine import summary
from proxymode.engine.actions import ClearAction, Decision, EmitEvent
from proxymode.engine.machine import NO_PAUSE, advance
from proxymode.engine.observed import ACTION_ANNOTATION, AnalysisRound, CheckOutcome, ClusterFacts
from proxymode.kube.observe import Observer
from tests.unit.engine.sim import T0, Sim

ARGOCD = Path(__file__).resolve().parents[2] / "examples" / "argocd"
ACTIONS = ("pause", "resume", "promote", "abort", "retry")
LUA_VERSIONS = ("lua51", "lua54")


def _load_renderer() -> ModuleType:
    """``examples/argocd/render_cm.py`` is a script, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location("render_cm", ARGOCD / "render_cm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RENDER = _load_renderer()


# -- the Lua VM, as Argo CD sets it up ------------------------------------------------------------

# Argo CD (util/lua/lua.go) opens only the package, base and table libraries and a safe
# os; string, math, io, debug and coroutine are absent, and so are string methods
# ("x"):find(...), since the string metatable comes with the string library.
ARGOCD_SANDBOX = """
local safe_os = { time = os.time, date = os.date, clock = os.clock, difftime = os.difftime }
getmetatable("").__index = nil
string, math, io, debug, coroutine, utf8, python, rawlen, warn =
    nil, nil, nil, nil, nil, nil, nil, nil, nil
os = safe_os
"""


@dataclass(frozen=True)
class Scripts:
    """The Lua Argo CD would run, taken from the rendered ConfigMap."""

    health: str
    discovery: str
    actions: Mapping[str, str]


def _config_map() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ARGOCD / "argocd-cm-patch.yaml").read_text())
    return data


def _scripts() -> Scripts:
    data = _config_map()["data"]
    actions = yaml.safe_load(data[RENDER.ACTIONS_KEY])
    return Scripts(
        health=data[RENDER.HEALTH_KEY],
        discovery=actions["discovery.lua"],
        actions={d["name"]: d["action.lua"] for d in actions["definitions"]},
    )


class ArgoLua:
    """Runs a script against ``obj`` in a fresh sandboxed VM, as Argo CD does per call."""

    def __init__(self, version: str, scripts: Scripts) -> None:
        self.lupa: Any = importlib.import_module(f"lupa.{version}")
        self.scripts = scripts

    def runtime(self) -> Any:
        rt = self.lupa.LuaRuntime(
            unpack_returned_tuples=True, register_eval=False, register_builtins=False
        )
        rt.execute(ARGOCD_SANDBOX)
        return rt

    def run(self, script: str, obj: Mapping[str, Any]) -> Any:
        rt = self.runtime()
        rt.globals()["obj"] = rt.table_from(obj, recursive=True)
        return rt.execute(script)

    def to_python(self, value: Any, like: Any = None) -> Any:
        """A Lua value as JSON-like Python. ``like`` (the input at the same place) decides
        whether an empty table is a list or a map, as Argo CD's cleanReturnedObj does."""
        if self.lupa.lua_type(value) != "table":
            return value
        keys = list(value.keys())
        if not keys:
            return [] if isinstance(like, list) else {}
        if all(isinstance(k, int) for k in keys) and sorted(keys) == list(range(1, len(keys) + 1)):
            items = like if isinstance(like, list) else []
            return [
                self.to_python(value[i], items[i - 1] if i <= len(items) else None)
                for i in range(1, len(keys) + 1)
            ]
        mapping = like if isinstance(like, dict) else {}
        return {k: self.to_python(v, mapping.get(k)) for k, v in value.items()}

    def health(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        result = self.to_python(self.run(self.scripts.health, obj))
        assert isinstance(result, dict)
        return result

    def discovery(self, obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        result = self.to_python(self.run(self.scripts.discovery, obj))
        assert isinstance(result, dict)
        return result

    def enabled(self, obj: Mapping[str, Any]) -> set[str]:
        return {name for name, a in self.discovery(obj).items() if not a["disabled"]}

    def action(self, name: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        result = self.to_python(self.run(self.scripts.actions[name], obj), like=obj)
        assert isinstance(result, dict)
        return result


@pytest.fixture(scope="module", params=LUA_VERSIONS)
def lua(request: pytest.FixtureRequest) -> ArgoLua:
    return ArgoLua(request.param, _scripts())


# -- the engine's statuses ------------------------------------------------------------------------

STAGES = [
    {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 20},
    {"name": "rest", "percent": 100, "bakeSeconds": 20},
]
ANALYSIS = {
    "prometheus": {"url": "http://prometheus.monitoring:9090"},
    "warmupSeconds": 0,
    "failureLimit": 1,
    "inconclusiveLimit": 1,
    "checks": [{"name": "sync-latency", "template": "SyncLatencyP99", "maxSeconds": 1}],
}
# What Argo CD leaves on an object it syncs with its default (label) tracking.
METADATA = {
    "name": "to-nft",
    "uid": "uid-1",
    "generation": 1,
    "resourceVersion": "4242",
    "creationTimestamp": "2026-11-01T11:59:00Z",
    "labels": {"app.kubernetes.io/instance": "proxymode"},
}


def _prune_nulls(value: Any) -> Any:
    """What the API server keeps of a merge patch: a null removes the field."""
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


@dataclass
class World:
    """A policy and the simulated cluster it runs in, stepped through the pure engine."""

    sim: Sim
    policy: ProxyModePolicy
    verdict: str | None = None
    """Each step's analysis round verdict for every check; None: no round at all."""
    deleting: bool = False
    tick: float | None = None
    """Seconds between looks; None: when the engine asks to look again, at most 5 s, so a
    sample is never taken across the whole of a bake."""

    @classmethod
    def start(cls, pools: dict[str, int], **spec: Any) -> World:
        body = {"targetMode": "nftables", "stages": STAGES, "maxUnavailable": "100%", **spec}
        policy = ProxyModePolicy.model_validate({"metadata": METADATA, "spec": body})
        return cls(Sim.cluster(pools), policy)

    def step(self) -> Decision:
        """One reconcile: observe, decide, carry out, store the status, let time pass."""
        observed = self.sim.observe(
            generation=int(self.policy.metadata["generation"]), deleting=self.deleting
        )
        if self.verdict is not None:
            round_ = AnalysisRound(
                time=self.sim.now, checks=(CheckOutcome("sync-latency", self.verdict),)
            )
            observed = dataclasses.replace(observed, analysis=round_)
        decision = advance(self.policy, observed)
        self.sim.execute(decision.actions)
        self.policy = self.policy.model_copy(update={"status": decision.status})
        self.sim.tick(self.tick or min(decision.requeue_seconds, 5.0))
        return decision

    def until(self, done: Callable[[ProxyModePolicy], bool], limit: int = 200) -> World:
        for _ in range(limit):
            self.step()
            if done(self.policy):
                return self
        raise AssertionError(f"not reached; phase {self.policy.status.phase}")

    def until_phase(self, phase: Phase) -> World:
        return self.until(lambda p: p.status.phase == phase)

    def fork(self) -> World:
        return copy.deepcopy(self)

    def edit(self, **spec: Any) -> World:
        """A spec change as the API server stores it: the generation goes up."""
        body = {**self.policy.spec.wire(), **spec}
        meta = {**self.policy.metadata, "generation": int(self.policy.metadata["generation"]) + 1}
        self.policy = self.policy.model_copy(
            update={"spec": PolicySpec.model_validate(body), "metadata": meta}
        )
        return self

    def stored(self) -> dict[str, Any]:
        """The object as Argo CD reads it from the API server."""
        status = self.policy.status.model_dump(by_alias=True, mode="json")
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": copy.deepcopy(self.policy.metadata),
            "spec": self.policy.spec.wire(),
            "status": _prune_nulls(status),
        }


@dataclass
class Sample:
    """One object Argo CD could read, and (when the engine made it) the cluster behind it."""

    obj: dict[str, Any]
    world: World | None = None


def _genuine(world: World) -> Sample:
    return Sample(world.stored(), world.fork())


def _status(sample: Sample) -> dict[str, Any]:
    status: dict[str, Any] = sample.obj["status"]
    return status


def _hand_made(base: Sample, **status: Any) -> Sample:
    obj = copy.deepcopy(base.obj)
    obj["status"].update(status)
    return Sample(obj)


# States the engine never stores, made by editing a genuine sample.
HAND_MADE = {
    "NoStatus": "a new object: the operator has not written a status yet",
    "StaleGeneration": "a spec edit the operator has not looked at yet",
    "Preflight": "the engine passes through Preflight within one call; a newer one may store it",
    "Paused/FinalizeStuck": "needs a move that fails during handback",
    "DegradedCondition": "a Degraded condition in a phase the engine never flags",
    "UnknownPhase": "a phase from a newer operator",
    "Forbidden": "the adapter's refused read (engine.summary.refused): RBAC refused a look",
    "Forbidden/SpecEdited": "a refused policy whose spec was edited since (no look yet)",
}


@functools.cache
def samples() -> dict[str, Sample]:
    """Every phase, with several pause and rollback reasons, as the engine stores them."""
    out: dict[str, Sample] = {}

    forward = World.start({"canary": 1, "general": 2})
    out["Progressing"] = _genuine(forward.until_phase(Phase.PROGRESSING))
    analyzing = forward.until_phase(Phase.ANALYZING).fork()
    out["Analyzing"] = _genuine(analyzing)
    plan = forward.until(lambda p: p.status.current_stage == 1).fork()
    out["Finalizing"] = _genuine(forward.until_phase(Phase.FINALIZING))
    out["Completed"] = _genuine(forward.until_phase(Phase.COMPLETED))

    wider = [STAGES[0], {"name": "half", "percent": 50, "bakeSeconds": 20}, STAGES[1]]
    out["Paused/PlanChanged"] = _genuine(plan.edit(stages=wider).until_phase(Phase.PAUSED))
    out["Paused/Spec"] = _genuine(analyzing.fork().edit(paused=True).until_phase(Phase.PAUSED))

    aborted = analyzing.fork()
    aborted.sim.action = "abort"
    out["RollingBack/Aborted"] = _genuine(aborted.until_phase(Phase.ROLLING_BACK))
    out["RolledBack/Aborted"] = _genuine(aborted.until_phase(Phase.ROLLED_BACK))
    aborted.sim.action = "retry"  # before the next look drops the snapshot: Pending waits
    out["Pending"] = _genuine(aborted.until_phase(Phase.PENDING))

    # The target kube-proxy crash-loops: a move waits readyTimeoutSeconds, then fails.
    crashing = World.start({"canary": 1, "general": 2}, readyTimeoutSeconds=10)
    crashing.sim.crashloop_target = True
    out["RollingBack/KubeProxyUnhealthy"] = _genuine(crashing.until_phase(Phase.ROLLING_BACK))
    out["RolledBack/KubeProxyUnhealthy"] = _genuine(crashing.until_phase(Phase.ROLLED_BACK))
    held = World.start(
        {"canary": 1, "general": 2}, readyTimeoutSeconds=10, rollback={"automatic": False}
    )
    held.sim.crashloop_target = True
    out["Paused/KubeProxyUnhealthy"] = _genuine(held.until_phase(Phase.PAUSED))

    measured = World.start({"canary": 1, "general": 2}, analysis=ANALYSIS)
    measured.until_phase(Phase.ANALYZING)  # rounds count from here (warmupSeconds: 0)
    no_data = measured.fork()
    no_data.verdict = "Inconclusive"
    out["Paused/NoData"] = _genuine(no_data.until_phase(Phase.PAUSED))
    failing = measured.fork()
    failing.verdict = "Fail"
    out["RollingBack/AnalysisFailed"] = _genuine(failing.until_phase(Phase.ROLLING_BACK))
    held_failing = measured.fork().edit(rollback={"automatic": False})
    held_failing.verdict = "Fail"
    out["Paused/AnalysisFailed"] = _genuine(held_failing.until_phase(Phase.PAUSED))

    stuck = World.start({"canary": 1, "general": 2}, targetMode="ipvs")
    stuck.sim.fail_jobs = True
    out["Failed/RollbackStuck"] = _genuine(stuck.until_phase(Phase.FAILED))
    # A person inspected the node and deleted the failed cleanup Job, then asked to retry.
    stuck.sim.fail_jobs = False
    stuck.sim.jobs.clear()
    stuck.sim.action = "retry"
    out["RollingBack/Retry"] = _genuine(stuck.until_phase(Phase.ROLLING_BACK))

    refused = World.start({"canary": 1, "legacy": 1})  # legacy: kernel 4.18, no nftables
    out["Failed/PreflightFailed"] = _genuine(refused.until_phase(Phase.FAILED))

    mixed = World.start({"canary": 1, "general": 1}, stages=[STAGES[0]])
    out["Completed/MixedMode"] = _genuine(mixed.until_phase(Phase.COMPLETED))
    mixed.deleting = True
    mixed.policy.metadata["deletionTimestamp"] = "2026-11-01T13:00:00Z"
    out["RollingBack/PolicyDeleted"] = _genuine(mixed.until_phase(Phase.ROLLING_BACK))

    no_status = copy.deepcopy(out["Progressing"].obj)
    del no_status["status"]
    out["NoStatus"] = Sample(no_status)
    stale = copy.deepcopy(out["Analyzing"].obj)
    stale["metadata"]["generation"] = 2
    out["StaleGeneration"] = Sample(stale)
    out["Preflight"] = _hand_made(out["Pending"], phase="Preflight")
    out["Paused/FinalizeStuck"] = _hand_made(
        out["Paused/KubeProxyUnhealthy"],
        pausedReason="FinalizeStuck",
        resumePhase="Finalizing",
        message="kube-proxy on node general-1 is not Ready 301s after the move started",
    )
    flagged = _hand_made(out["Completed"])
    for condition in _status(flagged)["conditions"]:
        if condition["type"] == "Degraded":
            condition.update(status="True", reason="RollbackOrFailure")
    out["DegradedCondition"] = flagged
    out["UnknownPhase"] = _hand_made(out["Completed"], phase="Hibernating")
    held_back = World.start({"canary": 1, "general": 2}, paused=True)
    out["Pending/Paused"] = _genuine(held_back.until(lambda p: p.status.observed_generation == 1))
    # A new policy whose kube-proxy namespace the chart did not grant: the adapter's status.
    said = "not allowed to read what this policy needs: daemonsets.apps is forbidden"
    denied = summary.refused(ProxyModePolicy.model_validate(no_status).status, said, 1, T0)
    out["Forbidden"] = Sample(
        {**no_status, "status": _prune_nulls(denied.model_dump(by_alias=True, mode="json"))}
    )
    edited = copy.deepcopy(out["Forbidden"].obj)
    edited["metadata"]["generation"] = 2
    out["Forbidden/SpecEdited"] = Sample(edited)
    assert set(HAND_MADE) <= set(out)
    return out


def test_the_samples_are_what_their_names_say() -> None:
    """A sample named Paused/NoData must be paused for NoData, or every expectation lies."""
    for name, sample in samples().items():
        if name in HAND_MADE:
            continue
        status = _status(sample)
        phase, _, reason = name.partition("/")
        assert status["phase"] == phase, name
        if phase == "Paused":
            assert status["pausedReason"] == reason, name
        if phase in ("RollingBack", "RolledBack"):
            assert status["rollbackReason"] == reason, name
            assert status["rollbackMessage"], name
        if phase == "Failed":
            assert status["history"][-1]["reason"] == reason, name
        assert status["observedGeneration"] == sample.obj["metadata"]["generation"], name
    assert _status(samples()["Paused/Spec"])["resumePhase"] == "Analyzing"
    assert _status(samples()["Paused/PlanChanged"])["resumePhase"] == "Progressing"
    assert _status(samples()["Paused/NoData"])["resumePhase"] == "Analyzing"
    assert _status(samples()["Paused/AnalysisFailed"])["resumePhase"] == "Analyzing"
    assert _status(samples()["Paused/KubeProxyUnhealthy"])["resumePhase"] == "Progressing"
    assert _status(samples()["Completed/MixedMode"])["finalized"] is False


def test_the_samples_cover_every_phase() -> None:
    stored = {_status(s)["phase"] for s in samples().values() if "status" in s.obj}
    assert {str(p) for p in Phase} <= stored


# -- health ---------------------------------------------------------------------------------------

HEALTH = {
    "NoStatus": "Progressing",
    "StaleGeneration": "Progressing",
    "Pending": "Progressing",
    "Preflight": "Progressing",
    "Progressing": "Progressing",
    "Analyzing": "Progressing",
    "Paused/Spec": "Suspended",
    "Paused/PlanChanged": "Suspended",
    "Paused/NoData": "Suspended",
    "Paused/KubeProxyUnhealthy": "Degraded",
    "Paused/AnalysisFailed": "Degraded",
    "Paused/FinalizeStuck": "Degraded",
    "Finalizing": "Progressing",
    "Completed": "Healthy",
    "Completed/MixedMode": "Healthy",
    "RollingBack/Aborted": "Progressing",
    "RollingBack/Retry": "Progressing",
    "RollingBack/PolicyDeleted": "Progressing",
    "RollingBack/KubeProxyUnhealthy": "Degraded",
    "RollingBack/AnalysisFailed": "Degraded",
    "RolledBack/Aborted": "Degraded",
    "RolledBack/KubeProxyUnhealthy": "Degraded",
    "Failed/RollbackStuck": "Degraded",
    "Failed/PreflightFailed": "Degraded",
    "DegradedCondition": "Degraded",
    "UnknownPhase": "Unknown",
    "Pending/Paused": "Suspended",
    "Forbidden": "Degraded",
    "Forbidden/SpecEdited": "Progressing",
}


def test_every_sample_has_an_expected_health() -> None:
    assert set(HEALTH) == set(samples())


@pytest.mark.parametrize("name", sorted(HEALTH))
def test_health(lua: ArgoLua, name: str) -> None:
    sample = samples()[name]
    hs = lua.health(sample.obj)
    assert hs["status"] == HEALTH[name], hs
    status = sample.obj.get("status")
    if status is None or name in ("StaleGeneration", "Forbidden/SpecEdited"):
        generation = sample.obj["metadata"]["generation"]
        assert hs["message"] == f"waiting for the operator to observe generation {generation}"
    elif status["phase"] == "Paused":
        assert hs["message"] == f"paused ({status['pausedReason']}): {status['message']}"
    elif name == "Pending/Paused":
        assert hs["message"] == f"paused (Spec): {status['message']}"
    elif name == "UnknownPhase":
        assert hs["message"] == f"unknown phase Hibernating: {status['message']}"
    else:
        assert hs["message"] == status["message"]


def test_health_without_a_message_or_a_generation_still_says_something(lua: ArgoLua) -> None:
    obj = copy.deepcopy(samples()["Completed"].obj)
    del obj["status"]["message"]
    assert lua.health(obj) == {"status": "Healthy", "message": "phase Completed"}
    del obj["metadata"]["generation"]
    del obj["status"]
    assert lua.health(obj) == {
        "status": "Progressing",
        "message": "waiting for the operator to write a status",
    }


@pytest.mark.parametrize(
    ("reason", "health"),
    [
        # Codes, as the operator writes them since decision 0010,
        ("Aborted", "Progressing"),
        ("Retry", "Progressing"),
        ("PolicyDeleted", "Progressing"),
        ("NoData", "Degraded"),
        # and "<Code>: <message>", as an older operator wrote them.
        ("Aborted: aborted by the proxymode.io/action annotation", "Progressing"),
        ("Retry: retry: rolling back what the failed run changed", "Progressing"),
        ("PolicyDeleted: the policy is being deleted", "Progressing"),
        ("AbortedLater: a reason that only starts like Aborted", "Degraded"),
        ("NoData: no metric data for 5 rounds (onNoData: Rollback)", "Degraded"),
        ("Abort", "Degraded"),
        ("", "Degraded"),
    ],
)
def test_the_rollback_reason_is_matched_by_its_code(lua: ArgoLua, reason: str, health: str) -> None:
    """The reason code is read without the string library (by ordering): check its edges."""
    obj = copy.deepcopy(samples()["RollingBack/Aborted"].obj)
    obj["status"]["rollbackReason"] = reason
    assert lua.health(obj)["status"] == health


# -- discovery ------------------------------------------------------------------------------------

ENABLED = {
    "NoStatus": {"pause", "abort"},
    "StaleGeneration": {"pause", "promote", "abort"},
    "Pending": {"pause", "abort"},
    "Preflight": {"pause", "abort"},
    "Progressing": {"pause", "abort"},
    "Analyzing": {"pause", "promote", "abort"},
    "Paused/Spec": {"resume", "abort"},
    "Paused/PlanChanged": {"resume", "abort"},
    "Paused/NoData": {"resume", "promote", "abort"},
    "Paused/KubeProxyUnhealthy": {"resume", "abort"},
    "Paused/AnalysisFailed": {"resume", "promote", "abort"},
    "Paused/FinalizeStuck": {"resume", "abort"},
    "Finalizing": {"pause", "abort"},
    "Completed": set(),
    "Completed/MixedMode": set(),
    "RollingBack/Aborted": set(),
    "RollingBack/Retry": set(),
    "RollingBack/PolicyDeleted": set(),
    "RollingBack/KubeProxyUnhealthy": set(),
    "RollingBack/AnalysisFailed": set(),
    "RolledBack/Aborted": {"retry"},
    "RolledBack/KubeProxyUnhealthy": {"retry"},
    "Failed/RollbackStuck": {"retry"},
    "Failed/PreflightFailed": {"retry"},
    "DegradedCondition": set(),
    "UnknownPhase": {"abort"},
    "Pending/Paused": {"resume", "abort"},
    "Forbidden": {"pause", "abort"},
    "Forbidden/SpecEdited": {"pause", "abort"},
}


def test_every_sample_has_expected_actions() -> None:
    assert set(ENABLED) == set(samples())


@pytest.mark.parametrize("name", sorted(ENABLED))
def test_discovery(lua: ArgoLua, name: str) -> None:
    found = lua.discovery(samples()[name].obj)
    assert set(found) == set(ACTIONS), "every action is listed, enabled or not"
    for action in found.values():
        assert isinstance(action["disabled"], bool)
        assert action["iconClass"].startswith("fa ")
    assert lua.enabled(samples()[name].obj) == ENABLED[name]


def test_resume_is_offered_whenever_spec_paused_is_set(lua: ArgoLua) -> None:
    """A pause asked for in Pending (the engine holds only once preflight has run) can be
    taken back at once; the engine itself ignores the annotation outside Paused."""
    obj = copy.deepcopy(samples()["Pending"].obj)
    obj["spec"]["paused"] = True
    assert lua.enabled(obj) == {"resume", "abort"}


# -- the actions ----------------------------------------------------------------------------------


def _expected_after(action: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with exactly the change ``action`` should make, and nothing else."""
    out = copy.deepcopy(dict(obj))
    if action == "pause":
        out["spec"]["paused"] = True
        return out
    if action == "resume" and out["spec"].get("paused"):
        out["spec"]["paused"] = False
    out["metadata"].setdefault("annotations", {})[ACTION_ANNOTATION] = action
    return out


class _NotFoundClient(ApiClient):
    """An API where nothing exists, so the Observer reads only the policy itself.

    Every request the typed clients build ends here, so a look's reads (its GETs of the
    DaemonSets and ConfigMaps, its lists of nodes, pods and Jobs) each find nothing,
    whichever helper the Observer reads them through.
    """

    def call_api(self, *_args: Any, **_kwargs: Any) -> Any:
        raise ApiException(status=404, reason="Not Found")


class _PolicyOnlyObserver(Observer):
    """The operator's real Observer over an API where nothing exists, and no watch cache."""

    def __init__(self) -> None:
        super().__init__(_NotFoundClient())

    def _facts(self, policy: ProxyModePolicy) -> ClusterFacts:
        """Pending and Preflight also gather cluster facts (the version API): none here."""
        return ClusterFacts()


def observed_action(policy: ProxyModePolicy) -> str | None:
    """The action the operator reads off the policy, through its own parsing."""
    return _PolicyOnlyObserver().observe(policy, now=T0).action


def _with_annotations(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Argo CD's annotation tracking, and a leftover action the new one must replace."""
    out = copy.deepcopy(dict(obj))
    out["metadata"]["annotations"] = {
        "argocd.argoproj.io/tracking-id": "proxymode:proxymode.io/ProxyModePolicy:/to-nft",
        ACTION_ANNOTATION: "promote",
    }
    return out


@pytest.mark.parametrize("name", ["NoStatus", "Analyzing", "Paused/Spec", "RolledBack/Aborted"])
@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("annotated", [False, True], ids=["no-annotations", "annotated"])
def test_an_action_changes_only_its_own_field(
    lua: ArgoLua, name: str, action: str, annotated: bool
) -> None:
    obj = samples()[name].obj
    if annotated:
        obj = _with_annotations(obj)
    result = lua.action(action, obj)
    assert result == _expected_after(action, obj)
    policy = ProxyModePolicy.model_validate(result)
    leftover = obj["metadata"].get("annotations", {}).get(ACTION_ANNOTATION)
    assert observed_action(policy) == (leftover if action == "pause" else action)
    if action == "pause":
        assert policy.spec.paused is True
    if action == "resume":
        assert policy.spec.paused is False


# -- the engine's view of the actions -------------------------------------------------------------

LOOKS = {"pause": 3, "resume": 1, "promote": 1, "abort": 1, "retry": 1}
"""Looks the engine needs to show that it acts on an action. An annotation is acted on
at the first look or never. A pause asked for in Pending holds at the third: the first
look drops the previous run's snapshot, the second runs preflight, the third pauses."""


def _trace(world: World, looks: int) -> list[Any]:
    """What the engine decides over ``looks`` looks, minus the bookkeeping of the action
    itself (its Event, the ``handledAction`` field, the annotation's removal, and the words
    that a pause does not hold a rollback: saying so is not acting on it)."""
    out: list[Any] = []
    for _ in range(looks):
        decision = world.step()
        status = decision.status.model_dump(mode="json", exclude={"handled_action"})
        for said in [status, *status.get("conditions", [])]:
            said["message"] = (said.get("message") or "").replace(NO_PAUSE, "")
        acts = [repr(a) for a in decision.actions if not isinstance(a, EmitEvent | ClearAction)]
        out.append((status, acts))
    return out


def _engine_trace(sample: Sample, obj: Mapping[str, Any], looks: int) -> list[Any] | str:
    assert sample.world is not None
    world = sample.world.fork()
    # A fixed clock: removing the annotation makes the engine requeue sooner, and that
    # alone must not count as acting on it.
    world.tick = 2.0
    world.policy = ProxyModePolicy.model_validate(obj)
    world.sim.action = observed_action(world.policy)
    try:
        return _trace(world, looks)
    except RecursionError:
        return "RecursionError"


@functools.cache
def _baseline(name: str) -> list[Any] | str:
    """What the engine does with the sample as it is (no action)."""
    sample = samples()[name]
    return _engine_trace(sample, sample.obj, max(LOOKS.values()))


GENUINE = sorted(n for n in ENABLED if n not in HAND_MADE)


@pytest.fixture(scope="module")
def argo51() -> ArgoLua:
    """The engine comparison runs in Lua 5.1 only: the engine, not the VM, is under test."""
    return ArgoLua("lua51", _scripts())


@pytest.mark.parametrize("name", GENUINE)
def test_discovery_enables_exactly_what_the_engine_acts_on(argo51: ArgoLua, name: str) -> None:
    sample = samples()[name]
    enabled = argo51.enabled(sample.obj)
    baseline = _baseline(name)
    assert isinstance(baseline, list)
    acts_on = set()
    for action in ACTIONS:
        looks = LOOKS[action]
        trace = _engine_trace(sample, argo51.action(action, sample.obj), looks)
        # A RecursionError would be an engine fault (see the regression tests below).
        if trace != "RecursionError" and trace != baseline[:looks]:
            acts_on.add(action)
    assert enabled == acts_on


# Two engine faults these tests found (a RecursionError each), kept as regressions.


def test_engine_refuses_promote_cleanly_while_spec_paused() -> None:
    """``_paused`` used to call ``_resume`` (which refuses while spec.paused), then
    ``_dispatch`` again, forever."""
    world = samples()["Paused/Spec"].world
    assert world is not None
    world = world.fork()
    world.sim.action = "promote"
    world.step()
    assert world.policy.status.phase == Phase.PAUSED


def test_engine_keeps_a_pinned_no_data_pause_when_the_data_returns() -> None:
    """spec.paused on a NoData pause, then a passing round, used to make ``_paused`` resume
    (refused), re-dispatch, and see the data again, forever."""
    world = samples()["Paused/NoData"].world
    assert world is not None
    world = world.fork().edit(paused=True)
    world.step()
    world.verdict = "Pass"
    world.step()
    assert world.policy.status.phase == Phase.PAUSED


# -- the ConfigMap --------------------------------------------------------------------------------


def test_the_committed_config_map_is_what_the_generator_renders() -> None:
    assert (ARGOCD / "argocd-cm-patch.yaml").read_text() == RENDER.render(), (
        "run: python examples/argocd/render_cm.py"
    )
    assert RENDER.main(["--check"]) == 0


def test_the_config_map_is_a_complete_manifest() -> None:
    cm = _config_map()
    assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("argocd-cm", "argocd")
    assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "argocd"
    assert set(cm["data"]) == {
        "resource.customizations.health.proxymode.io_ProxyModePolicy",
        "resource.customizations.actions.proxymode.io_ProxyModePolicy",
    }
    assert f"{GROUP}_{KIND}" == RENDER.GROUP_KIND


def _lua_files() -> Iterator[tuple[str, str]]:
    yield "health", (ARGOCD / "health.lua").read_text()
    yield "discovery", (ARGOCD / "actions" / "discovery.lua").read_text()
    for action in ACTIONS:
        yield action, (ARGOCD / "actions" / action / "action.lua").read_text()


def test_the_config_map_holds_each_lua_file_verbatim() -> None:
    scripts = _scripts()
    found = {"health": scripts.health, "discovery": scripts.discovery, **scripts.actions}
    assert list(scripts.actions) == list(ACTIONS), "definitions in a fixed order"
    for name, text in _lua_files():
        assert found[name] == text, name
    raw = (ARGOCD / "argocd-cm-patch.yaml").read_text()
    assert f"{RENDER.HEALTH_KEY}: |\n" in raw, "Lua kept as a readable literal block"
    assert f"{RENDER.ACTIONS_KEY}: |\n" in raw


def test_the_sandbox_is_as_bare_as_argo_cds(lua: ArgoLua) -> None:
    """Otherwise a script using the string library would pass here and fail in Argo CD."""
    rt = lua.runtime()
    assert rt.execute("return string") is None
    assert rt.execute("return math") is None
    assert rt.execute('return pcall(function() return ("x"):len() end)')[0] is False
    assert rt.execute("return table.insert ~= nil and ipairs ~= nil and tostring ~= nil")
