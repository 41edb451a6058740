"""The rollout state machine: ``advance(policy, observed) -> Decision``. Pure.

Every call reads the policy's status and a fresh snapshot of the world, takes the next
safe steps, and returns the new status and the actions to carry them out. Nothing is
kept in memory between calls: a restart between any two calls resumes where the
status and the node labels say the rollout is. Each phase handler re-checks the world
before acting, so a status written after an action failed is harmless: the next call
sees that the action did not happen and asks again.

Phases (DESIGN §4)::

    Pending -> Preflight -> Progressing(i) <-> Analyzing(i) -> ... -> Finalizing -> Completed
                  |              |                 |                        (or Completed,
                  v              +----> RollingBack -> RolledBack            mixed mode)
                Failed     any in flight <-> Paused

Invariants the unit tests check after every step:

- a node never runs two kube-proxies: a move takes it to ``switching`` (neither DaemonSet)
  and changes the label only once the old pod is gone;
- at most ``maxUnavailable`` nodes are without a Ready kube-proxy because of a move
  (nodes that were already broken do not block moving them back);
- rollback walks stages newest first and ends with the source DaemonSet spec and
  ConfigMap data equal to the snapshot taken before the first change;
- the operator labels only nodes it records in ``status.stages``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from proxymode.api.models import (
    Analysis,
    AnalysisStatus,
    BackupRef,
    CheckResult,
    Condition,
    HistoryEntry,
    Move,
    MoveDirection,
    OnNoData,
    Phase,
    PolicySpec,
    PolicyStatus,
    Preflight,
    ProxyModePolicy,
    StagePhase,
    StageStatus,
    Verdict,
)
from proxymode.engine import moves as mv
from proxymode.engine import naming, objects
from proxymode.engine.actions import (
    Action,
    ApplyObject,
    ClearAction,
    Decision,
    DeleteObject,
    EmitEvent,
    PatchObject,
    SaveBackup,
)
from proxymode.engine.observed import SWITCHING, CheckOutcome, Object, Observed
from proxymode.engine.planner import (
    PlanNode,
    max_unavailable_count,
    plan_hash,
    plan_stages,
    selector_matches,
)
from proxymode.engine.preflight import eligible_nodes, run_preflight
from proxymode.kubeproxy import (
    ConfigError,
    KubeVersion,
    cleanup_needed,
    parse_config,
    parse_version,
    render_target_config,
    with_mode,
)

MAX_HISTORY = 50
ACTIONS = ("promote", "abort", "retry", "resume")
TERMINAL = frozenset({Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED})
PLAN_GUARDED = frozenset({Phase.PROGRESSING, Phase.ANALYZING, Phase.PAUSED})


def advance(policy: ProxyModePolicy, observed: Observed) -> Decision:
    """Decide the next step of ``policy`` given the world as ``observed``."""
    machine = _Machine(policy, observed)
    machine.run()
    return machine.decision()


@dataclass
class _Machine:
    policy: ProxyModePolicy
    obs: Observed
    actions: list[Action] = field(default_factory=list)
    requeue: float = 30.0
    release: bool = False
    force_promote: bool = False

    def __post_init__(self) -> None:
        self.spec: PolicySpec = self.policy.spec
        self.status: PolicyStatus = self.policy.status.model_copy(deep=True)
        self.name: str = str(self.policy.metadata.get("name", ""))
        self.uid: str = str(self.policy.metadata.get("uid", ""))
        self.now: datetime = self.obs.now

    # -- entry --------------------------------------------------------------------------------

    def run(self) -> None:
        self._consume_action()
        if self.obs.deleting:
            self._on_delete()
            return
        if self.spec.paused and self.status.phase == Phase.PENDING:
            # Created paused: not even preflight runs (it writes the snapshot and the
            # target objects), so a paused policy has changed nothing at all.
            self.status.message = "spec.paused is true: waiting before preflight; nothing changed"
            self.requeue = 10
            return
        quiet = TERMINAL | {Phase.PAUSED, Phase.PENDING, Phase.ROLLING_BACK}
        if self.spec.paused and self.status.phase not in quiet:
            self._pause("Spec", "spec.paused is true")
        if (
            self.status.phase in PLAN_GUARDED
            and self.status.plan_hash
            and plan_hash(self.spec) != self.status.plan_hash
            and self.status.paused_reason != "PlanChanged"
        ):
            self._pause(
                "PlanChanged",
                "the stage plan changed mid-rollout; annotate proxymode.io/action=resume to go"
                " on with the new plan, or abort to roll back",
            )
        self._dispatch()

    def _dispatch(self) -> None:
        phase = self.status.phase
        if phase in (Phase.PENDING, Phase.PREFLIGHT):
            self._preflight()
        elif phase in (Phase.PROGRESSING, Phase.ANALYZING):
            self._rollout()
        elif phase == Phase.PAUSED:
            self._paused()
        elif phase == Phase.FINALIZING:
            self._finalizing()
        elif phase == Phase.ROLLING_BACK:
            self._rolling_back()
        elif phase == Phase.COMPLETED and not self.status.finalized:
            self._keep_mixed_mode()
        if self.status.phase in (Phase.ROLLED_BACK, Phase.COMPLETED) and phase == self.status.phase:
            self._drop_backup()
            if self.status.phase == Phase.ROLLED_BACK and (
                self.status.rollback_reason or ""
            ).startswith("Retry:"):
                # A retry of a failed run walked it back first; now the new run starts,
                # without asking a second time.
                self._retry()

    def decision(self) -> Decision:
        self._derive_summary()
        if any(not isinstance(a, EmitEvent) for a in self.actions):
            self.requeue = min(self.requeue, 2.0)  # look again soon to see what they did
        return Decision(
            status=self.status,
            actions=tuple(self.actions),
            requeue_seconds=self.requeue,
            release_finalizer=self.release,
        )

    # -- transitions and bookkeeping ------------------------------------------------------------

    def _transition(self, phase: Phase, reason: str, message: str, warning: bool = False) -> None:
        if self.status.phase != phase:
            self.status.phase = phase
            stage = self._stage_name()
            self.status.history.append(
                HistoryEntry(
                    time=self.now, phase=phase, stage=stage, reason=reason, message=message
                )
            )
            self.status.history = self.status.history[-MAX_HISTORY:]
            self._event(reason, message, warning)
        self.status.message = message

    def _event(self, reason: str, message: str, warning: bool = False) -> None:
        self.actions.append(EmitEvent(reason, message, "Warning" if warning else "Normal"))

    def _stage_name(self) -> str | None:
        i = self.status.current_stage
        if i is None or not (0 <= i < len(self.status.stages)):
            return None
        return self.status.stages[i].name

    def _pause(self, reason: str, message: str) -> None:
        if self.status.phase != Phase.PAUSED:
            self.status.resume_phase = self.status.phase
        self.status.paused_reason = reason
        self._transition(Phase.PAUSED, f"Paused{reason}", message, warning=reason != "Spec")

    def _fail(self, reason: str, message: str) -> None:
        self._transition(Phase.FAILED, reason, message, warning=True)
        self.requeue = 300

    # -- one-shot actions -----------------------------------------------------------------------

    def _consume_action(self) -> None:
        """Act on the one-shot annotation once, then remove it.

        Two looks: the first acts and stores ``handled_action``; the next (which sees that
        stored) removes the annotation. A lost status write makes the first look happen
        again, which is safe; the annotation is never removed before the action is stored.
        """
        action = self.obs.action
        if not action:
            self.status.handled_action = None
            return
        if self.status.handled_action == action:
            self.actions.append(ClearAction(action))
            return
        self.status.handled_action = action
        phase = self.status.phase
        if action == "abort" and phase not in TERMINAL | {Phase.ROLLING_BACK}:
            self._start_rollback("Aborted", "aborted by the proxymode.io/action annotation")
        elif action == "resume" and phase == Phase.PAUSED:
            self._resume()
        elif action == "promote":
            self._promote_by_hand()
        elif action == "retry" and phase in (Phase.FAILED, Phase.ROLLED_BACK):
            self._retry()
        elif action not in ACTIONS:
            self._event(
                "UnknownAction",
                f"ignored proxymode.io/action={action!r}; use {', '.join(ACTIONS)}",
                warning=True,
            )

    def _promote_by_hand(self) -> None:
        """Skip the rest of the current stage's bake and gate, only while it bakes.

        Anywhere else a promote would mean nothing (nodes are still moving, or nothing is
        in flight), so it is refused out loud rather than remembered for later.
        """
        st = self.status
        baking = st.phase == Phase.ANALYZING or (
            st.phase == Phase.PAUSED and st.resume_phase == Phase.ANALYZING
        )
        if not baking or self.spec.paused:
            why = "spec.paused is true" if self.spec.paused else f"the phase is {st.phase}"
            self._event(
                "PromoteIgnored",
                f"promote acts only while a stage bakes (Analyzing); ignored: {why}",
                warning=True,
            )
            return
        self.force_promote = True
        self._event("PromoteRequested", f"stage {self._stage_name()} promoted by hand")

    def _resume_and_go(self) -> None:
        """Resume, and carry on in the same look only if the resume took (``spec.paused``
        refuses it; dispatching again while still Paused would come straight back here)."""
        self._resume()
        if self.status.phase != Phase.PAUSED:
            self._dispatch()

    def _resume(self) -> None:
        if self.spec.paused:
            self.status.message = "cannot resume while spec.paused is true"
            return
        if self.status.paused_reason == "PlanChanged":
            self._adopt_new_plan()
        if self.status.paused_reason == "NoData" and self.status.analysis is not None:
            # A person chose to go on: the no-data count starts again, or the very next
            # inconclusive round would pause once more.
            self.status.analysis.consecutive_inconclusive = 0
        target = self.status.resume_phase or Phase.PROGRESSING
        self.status.paused_reason = None
        self.status.resume_phase = None
        self._transition(target, "Resumed", f"resumed in phase {target}")

    def _retry(self) -> None:
        if self.status.phase == Phase.FAILED and self._changed_anything():
            # Something was changed before the failure: walk it back first, then start over.
            self._start_rollback("Retry", "retry: rolling back what the failed run changed")
            return
        self.status = PolicyStatus(
            history=self.status.history,
            handled_action=self.status.handled_action,
            run=self.status.run + 1,
        )
        self.status.history.append(
            HistoryEntry(time=self.now, phase=Phase.PENDING, reason="Retry", message="retrying")
        )
        self._event("Retry", "retrying from preflight")
        self.status.message = "retrying from preflight"

    # -- preflight --------------------------------------------------------------------------

    def _preflight(self) -> None:
        stale = self.obs.backup is not None and self.obs.backup.get(objects.BACKUP_RUN) != str(
            self.status.run
        )
        if stale:
            # A snapshot from an earlier run of this policy (a retry): the world was put
            # back from it; take a fresh one, never reuse a stale one. (A snapshot of this
            # run means the first status write was lost: go on with it.)
            if self._changed_anything():
                self._fail(
                    "StaleChanges",
                    "a previous run's changes are still in place;"
                    " abort (roll back) before retrying",
                )
                return
            ns, name = self.spec.kube_proxy.namespace, naming.backup_config_map(self.name)
            self.actions.append(DeleteObject("v1", "ConfigMap", ns, name))
            self.requeue = 1
            return
        self.status.started_time = self.status.started_time or self.now
        self._transition(Phase.PREFLIGHT, "PreflightStarted", "checking the cluster")
        result = run_preflight(self.spec, self.obs)
        self.status.preflight = Preflight(
            passed=result.passed, checked_time=self.now, findings=list(result.findings)
        )
        self.status.baseline = result.baseline
        self.status.source_mode = result.source_mode
        self.status.target_mode = str(self.spec.target_mode)
        if not result.passed:
            errors = [f.message for f in result.findings if f.severity == "Error"]
            self._fail("PreflightFailed", "; ".join(errors))
            return
        eligible = self._eligible()
        plan = plan_stages(self.spec.stages, eligible)
        self.status.stages = [
            StageStatus(name=s.name, nodes=nodes)
            for s, nodes in zip(self.spec.stages, plan, strict=True)
        ]
        self.status.plan_hash = plan_hash(self.spec)
        self.status.current_stage = 0
        self._transition(
            Phase.PROGRESSING,
            "RolloutStarted",
            f"moving {sum(len(p) for p in plan)} of {len(eligible)} eligible nodes from"
            f" {result.source_mode} to {self.spec.target_mode} in {len(plan)} stages",
        )
        self._rollout()

    def _eligible(self) -> list[PlanNode]:
        source = self.obs.source_daemon_set
        if source is None:
            return []
        excluded = set()
        if self.status.preflight is not None:
            for finding in self.status.preflight.findings:
                if finding.code == "KernelTooOld" and finding.severity == "Warning":
                    excluded.update(finding.nodes)
        return [
            PlanNode(n.name, n.labels, n.zone)
            for n in eligible_nodes(self.spec, source, self.obs.nodes)
            if n.name not in excluded
        ]

    # -- setup ------------------------------------------------------------------------------

    def _backup(self) -> dict[str, str] | None:
        """The snapshot, saving it first when this run has none yet."""
        namespace = self.spec.kube_proxy.namespace
        name = naming.backup_config_map(self.name)
        if self.obs.backup is not None:
            self.status.backup = BackupRef(namespace=namespace, name=name)
            return dict(self.obs.backup)
        if self.status.backup is not None and self._changed_anything():
            self._fail(
                "BackupLost",
                f"the backup ConfigMap {self.status.backup.namespace}/{self.status.backup.name}"
                " was deleted; restore it or roll back by hand",
            )
            return None
        src_ds, src_cm = self.obs.source_daemon_set, self.obs.source_config_map
        if src_ds is None or src_cm is None:
            return None
        labels = {n.name: n.mode_label for n in self.obs.nodes}
        data = objects.backup_data(src_ds, src_cm, labels, self.status.run)
        self.actions.append(SaveBackup(objects.backup_object(self.name, self.uid, namespace, data)))
        self.status.backup = BackupRef(namespace=namespace, name=name)
        return data

    def _changed_anything(self) -> bool:
        """Evidence in the world that this run already changed something."""
        src = self.obs.source_daemon_set
        mode = str(self.spec.target_mode)
        return (
            (src is not None and objects.source_is_patched(src, mode))
            or self.obs.target_daemon_set is not None
            or any(n.mode_label is not None for n in self.obs.nodes)
        )

    def _target_text(self, backup: dict[str, str]) -> str | None:
        original = objects.original_config_data(backup)
        key = self.spec.kube_proxy.config_key
        try:
            rendered = render_target_config(
                parse_config(original[key]),
                str(self.spec.target_mode),
                version=self._kube_proxy_version(),
                overrides=self.spec.config_overrides,
            )
        except (ConfigError, KeyError) as e:
            self._fail("TargetConfigInvalid", f"cannot render the target configuration: {e}")
            return None
        return rendered.text

    def _kube_proxy_version(self) -> KubeVersion | None:
        baseline = self.status.baseline
        text = baseline.kube_proxy_version if baseline else None
        try:
            return parse_version(text) if text else None
        except ValueError:
            return None

    def _ensure_setup(self) -> bool:
        """Backup, target ConfigMap and DaemonSet, source patch. True once all are in place."""
        src_ds = self.obs.source_daemon_set
        if src_ds is None or self.obs.source_config_map is None:
            self._fail(
                "SourceMissing",
                f"the source kube-proxy DaemonSet or ConfigMap in {self.spec.kube_proxy.namespace}"
                " disappeared mid-rollout",
            )
            return False
        backup = self._backup()
        if backup is None:
            return False
        text = self._target_text(backup)
        if text is None:
            return False
        mode = str(self.spec.target_mode)
        original = {"metadata": src_ds["metadata"], "spec": objects.original_spec(backup)}
        desired_cm = objects.target_config_map(
            self.name,
            self.uid,
            self.obs.source_config_map,
            config_key=self.spec.kube_proxy.config_key,
            target_text=text,
            mode=mode,
        )
        desired_cm["data"] = {
            **objects.original_config_data(backup),
            self.spec.kube_proxy.config_key: text,
        }
        desired_ds = objects.target_daemon_set(
            self.name,
            self.uid,
            original,
            source_config_map=self.spec.kube_proxy.config_map,
            mode=mode,
            target_config_text=text,
        )
        ready = True
        if (self.obs.target_config_map or {}).get("data") != desired_cm["data"]:
            self.actions.append(ApplyObject(desired_cm))
            ready = False
        if _template_hash(self.obs.target_daemon_set) != _template_hash(desired_ds):
            self.actions.append(ApplyObject(desired_ds))
            ready = False
        if not objects.source_is_patched(src_ds, mode):
            self.actions.append(
                PatchObject(
                    "apps/v1",
                    "DaemonSet",
                    src_ds["metadata"]["namespace"],
                    src_ds["metadata"]["name"],
                    objects.spec_patch(src_ds, objects.source_patched_spec(src_ds["spec"], mode)),
                    why="keep the source kube-proxy off target and switching nodes; OnDelete",
                )
            )
            ready = False
        elif not _observed(src_ds):
            ready = False
        return ready

    # -- forward ------------------------------------------------------------------------------

    def _move_context(self) -> mv.MoveContext:
        source_mode = self.status.source_mode or "iptables"
        return mv.MoveContext(
            policy=self.name,
            uid=self.uid,
            target_mode=str(self.spec.target_mode),
            needs_cleanup=cleanup_needed(source_mode, str(self.spec.target_mode)),
            source_daemon_set=self.obs.source_daemon_set or {},
            ready_timeout_seconds=self.spec.ready_timeout_seconds,
        )

    def _budget(self) -> int:
        total = sum(len(s.nodes) for s in self.status.stages)
        return max_unavailable_count(self.spec.max_unavailable, max(total, 1))

    def _adopt_orphans(self, direction: MoveDirection) -> None:
        """Nodes left at ``switching`` without a recorded move (a lost status write)."""
        moving = {m.node for m in self.status.moves}
        for stage in self.status.stages:
            for name in stage.nodes:
                node = self.obs.node(name)
                if node is not None and node.mode_label == SWITCHING and name not in moving:
                    self.status.moves.append(mv.start(name, direction, self.now))
                    moving.add(name)

    def _drive_moves(self, direction: MoveDirection = MoveDirection.FORWARD) -> str | None:
        """Step every move; returns the first failure, if any."""
        self._adopt_orphans(direction)
        ctx = self._move_context()
        keep: list[Move] = []
        failure = None
        for move in self.status.moves:
            result = mv.step(move, self.obs, ctx)
            self.actions.extend(result.actions)
            if result.failure and failure is None:
                failure = result.failure
            if not result.done:
                keep.append(move)
        self.status.moves = keep
        if keep:
            self.requeue = min(self.requeue, 2)
        return failure

    def _start_moves(self, candidates: list[str], direction: MoveDirection) -> None:
        """Start moves for ``candidates`` in order while the budget allows.

        The budget is counted from the world, not from ``status.moves`` alone, so a lost
        status write never lets more nodes go down than ``maxUnavailable``:

        - forward, every planned node without a Ready kube-proxy counts (a rollout never
          adds outages to a cluster that already has some);
        - back (rollback, handback), only nodes this policy is moving count: a broken canary
          that is not moving yet has no working proxy to lose, and counting it would block
          the very move that mends it.
        """
        moving = {m.node for m in self.status.moves}
        mode = str(self.spec.target_mode)
        planned = [n for s in self.status.stages for n in s.nodes]
        if direction == MoveDirection.FORWARD:
            down = {n for n in planned if not mv.healthy_proxy(self.obs, n, mode)} | moving
        else:
            switching = {
                n for n in planned if (v := self.obs.node(n)) and v.mode_label == SWITCHING
            }
            down = switching | moving
        budget = self._budget()
        for node in candidates:
            if node in moving or self.obs.node(node) is None:
                continue
            if len(down) >= budget:
                break
            self.status.moves.append(mv.start(node, direction, self.now))
            down.add(node)
            step = mv.step(self.status.moves[-1], self.obs, self._move_context())
            self.actions.extend(step.actions)
            self.requeue = min(self.requeue, 2)

    def _refresh_plan(self) -> None:
        """Drop deleted nodes; let started selector (or 100%) stages take newcomers."""
        present = {n.name for n in self.obs.nodes}
        for stage in self.status.stages:
            stage.nodes = [n for n in stage.nodes if n in present]
        eligible = self._eligible()
        planned = {n for s in self.status.stages for n in s.nodes}
        for node in eligible:
            if node.name in planned:
                continue
            for spec_stage, stage in zip(self.spec.stages, self.status.stages, strict=False):
                if stage.phase == StagePhase.PENDING:
                    break
                takes = spec_stage.node_selector is not None or spec_stage.percent == 100
                if takes and selector_matches(spec_stage.node_selector, node.labels):
                    stage.nodes.append(node.name)
                    planned.add(node.name)
                    self._event("NodeJoined", f"node {node.name} joined stage {stage.name}")
                    break

    def _start_stage(self, index: int) -> None:
        eligible = self._eligible()
        fixed = {
            i: s.nodes for i, s in enumerate(self.status.stages) if s.phase != StagePhase.PENDING
        }
        plan = plan_stages(self.spec.stages, eligible, fixed)
        stage = self.status.stages[index]
        stage.nodes = plan[index]
        stage.phase = StagePhase.PROGRESSING
        stage.started_time = self.now
        stage.nodes_done = 0
        self.status.current_stage = index
        self.status.analysis = AnalysisStatus() if self.spec.analysis else None
        self._event("StageStarted", f"stage {stage.name}: moving {_nodes(len(stage.nodes))}")

    def _health_failure(self) -> str | None:
        """A moved node whose target kube-proxy restarts or stays not Ready."""
        mode = str(self.spec.target_mode)
        timeout = self.spec.ready_timeout_seconds
        moving = {m.node for m in self.status.moves}
        for stage in self.status.stages:
            for name in stage.nodes:
                node = self.obs.node(name)
                if node is None or node.mode_label != mode or name in moving:
                    continue
                for pod in self.obs.pods_on(name):
                    where = f"kube-proxy pod {pod.name} on node {name}"
                    if pod.restarts > 0:
                        return f"{where} restarted {pod.restarts} times"
                    age = (self.now - pod.created).total_seconds() if pod.created else 0.0
                    if not pod.ready and not pod.terminating and age > timeout:
                        return f"{where} is not Ready {age:.0f}s after it started"
        return None

    def _rollout(self) -> None:
        if not self._ensure_setup():
            self.requeue = min(self.requeue, 1)
            return
        self._refresh_plan()
        index = self.status.current_stage or 0
        stage = self.status.stages[index]
        if stage.phase == StagePhase.PENDING:
            self._start_stage(index)
        failure = self._drive_moves() or self._health_failure()
        if failure:
            self._breach("KubeProxyUnhealthy", failure)
            return
        mode = str(self.spec.target_mode)
        started = [s for s in self.status.stages if s.phase != StagePhase.PENDING]
        todo = [
            n
            for s in started
            for n in s.nodes
            if (node := self.obs.node(n)) is not None and node.mode_label != mode
        ]
        self._start_moves(todo, MoveDirection.FORWARD)
        done = [
            n for n in stage.nodes if mv.healthy_proxy(self.obs, n, mode) and self._at_target(n)
        ]
        stage.nodes_done = len(done)
        if len(done) < len(stage.nodes) or self.status.moves:
            self._transition(
                Phase.PROGRESSING,
                "StageProgressing",
                f"stage {stage.name}: {len(done)}/{len(stage.nodes)} nodes moved",
            )
            self.requeue = min(self.requeue, 2)
            return
        if stage.phase == StagePhase.PROGRESSING:
            stage.phase = StagePhase.BAKING
            stage.baked_since = self.now
        self._transition(
            Phase.ANALYZING,
            "StageBaking",
            f"stage {stage.name}: all {len(done)} nodes moved; baking",
        )
        self._bake(index)

    def _at_target(self, node: str) -> bool:
        view = self.obs.node(node)
        return view is not None and view.mode_label == str(self.spec.target_mode)

    def _bake(self, index: int) -> None:
        stage = self.status.stages[index]
        spec_stage = self.spec.stages[index]
        baked = (self.now - (stage.baked_since or self.now)).total_seconds()
        gate = self._gate(stage)
        if gate == "breach":
            return
        remaining = spec_stage.bake_seconds - baked
        if not self.force_promote and (remaining > 0 or gate == "wait"):
            self.requeue = min(self.requeue, max(1.0, remaining) if remaining > 0 else 5.0)
            self.status.message = (
                f"stage {stage.name}: baking, {max(0, int(remaining))}s left"
                if remaining > 0
                else f"stage {stage.name}: baked; waiting for passing analysis rounds"
            )
            return
        stage.phase = StagePhase.COMPLETED
        stage.completed_time = self.now
        self._event("StageCompleted", f"stage {stage.name} completed")
        if index + 1 < len(self.status.stages):
            self.status.current_stage = index + 1
            self._transition(
                Phase.PROGRESSING,
                "StagePromoted",
                f"stage {stage.name} promoted; next: {self.status.stages[index + 1].name}",
            )
            self.requeue = 1
            return
        self._end_of_stages()

    def _gate(self, stage: StageStatus) -> str:
        """The metric gate: ``ok``, ``wait`` or ``breach`` (already acted on)."""
        analysis = self.spec.analysis
        if analysis is None:
            return "ok"
        self.requeue = min(self.requeue, float(analysis.interval_seconds))
        status = self.status.analysis or AnalysisStatus()
        self.status.analysis = status
        round_ = self.obs.analysis
        warm_from = stage.baked_since
        fresh = round_ is not None and (
            status.last_round_time is None or round_.time > status.last_round_time
        )
        if round_ is not None and fresh and warm_from is not None:
            status.last_round_time = round_.time
            status.checks = [
                CheckResult(
                    name=c.name,
                    canary=c.canary,
                    baseline=c.baseline,
                    verdict=Verdict(c.verdict),
                    message=c.message,
                )
                for c in round_.checks
            ]
            if (round_.time - warm_from).total_seconds() >= analysis.warmup_seconds:
                self._count_round(status, [c.verdict for c in round_.checks])
                self._report_round(status, round_.checks, analysis)
                # Kept from the first counted round (past warm-up), for the last stage,
                # when no node is left on the source mode to compare with.
                baseline = self.status.baseline
                if baseline is not None and round_.baseline_values and not baseline.metrics:
                    baseline.metrics = dict(round_.baseline_values)
        if status.consecutive_failures >= analysis.failure_limit:
            failing = [c.name for c in status.checks if c.verdict == Verdict.FAIL]
            self._breach(
                "AnalysisFailed",
                f"checks failing {status.consecutive_failures} rounds"
                f" in a row: {', '.join(failing)}",
            )
            return "breach"
        if status.consecutive_inconclusive >= analysis.inconclusive_limit:
            if analysis.on_no_data == OnNoData.ROLLBACK:
                self._start_rollback(
                    "NoData",
                    "no metric data for"
                    f" {status.consecutive_inconclusive} rounds (onNoData: Rollback)",
                )
                return "breach"
            if analysis.on_no_data == OnNoData.PAUSE:
                self._pause(
                    "NoData",
                    f"no metric data for {status.consecutive_inconclusive} rounds"
                    " (onNoData: Pause); resume when Prometheus answers",
                )
                return "breach"
            return "ok"  # Continue: said loudly in the condition, never silently
        passed = (
            status.passing_rounds >= analysis.min_passing_rounds
            and bool(status.checks)
            and all(c.verdict == Verdict.PASS for c in status.checks)
        )
        return "ok" if passed else "wait"

    def _report_round(
        self, status: AnalysisStatus, checks: Sequence[CheckOutcome], analysis: Analysis
    ) -> None:
        """One Warning Event per counted round that did not pass, naming what and how far.

        Passing rounds stay quiet (status shows them); a failing or inconclusive round is
        what an operator watching ``kubectl get events`` needs to see before the limit hits.
        """
        failing = [c for c in checks if c.verdict == Verdict.FAIL]
        unknown = [c for c in checks if c.verdict == Verdict.INCONCLUSIVE]
        stage = self._stage_name() or "-"
        if failing:
            count, limit, kind = status.consecutive_failures, analysis.failure_limit, "failing"
            shown = failing
            reason = "AnalysisRoundFailed"
        elif unknown or not checks:
            count, limit = status.consecutive_inconclusive, analysis.inconclusive_limit
            kind, shown, reason = "inconclusive", unknown, "AnalysisRoundInconclusive"
        else:
            return
        detail = "; ".join(f"{c.name}: {c.message}" for c in shown) or "no checks answered"
        self._event(
            reason,
            f"stage {stage} round {status.rounds}: {detail} ({count} of {limit} {kind}"
            " rounds in a row)",
            warning=True,
        )

    @staticmethod
    def _count_round(status: AnalysisStatus, verdicts: list[str]) -> None:
        status.rounds += 1
        if Verdict.FAIL in verdicts:
            status.consecutive_failures += 1
            status.consecutive_inconclusive = 0
        elif Verdict.INCONCLUSIVE in verdicts or not verdicts:
            status.consecutive_inconclusive += 1
        else:
            status.passing_rounds += 1
            status.consecutive_failures = 0
            status.consecutive_inconclusive = 0

    def _breach(self, reason: str, message: str) -> None:
        if self.spec.rollback.automatic:
            self._start_rollback(reason, message)
        else:
            self._pause(reason, f"{message} (rollback.automatic is false)")

    def _covers_every_node(self) -> bool:
        """Finalize only when no node the source DaemonSet runs on stays on the source mode."""
        source = self.obs.source_daemon_set
        if source is None:
            return False
        every = {
            n.name
            for n in eligible_nodes(
                self.spec.model_copy(update={"node_selector": None}), source, self.obs.nodes
            )
        }
        planned = {n for s in self.status.stages for n in s.nodes}
        return every <= planned

    def _end_of_stages(self) -> None:
        if self.spec.finalize and self._covers_every_node():
            self._transition(
                Phase.FINALIZING,
                "Finalizing",
                "every node runs the target mode; folding it into the source objects",
            )
            self._finalizing()
            return
        planned = sum(len(s.nodes) for s in self.status.stages)
        self.status.finalized = False
        self.status.completed_time = self.now
        self._transition(
            Phase.COMPLETED,
            "Completed",
            f"{planned} nodes run {self.spec.target_mode}; the others stay on"
            f" {self.status.source_mode}, both DaemonSets kept (mixed mode)",
        )
        self.requeue = 60

    def _keep_mixed_mode(self) -> None:
        """A finished mixed-mode policy still moves newcomers that join its pools."""
        self._refresh_plan()
        failure = self._drive_moves()
        if failure:
            self.status.message = failure
        mode = str(self.spec.target_mode)
        todo = [
            n
            for s in self.status.stages
            for n in s.nodes
            if (node := self.obs.node(n)) is not None and node.mode_label != mode
        ]
        self._start_moves(todo, MoveDirection.FORWARD)
        self.requeue = 2 if self.status.moves else 60

    # -- pause --------------------------------------------------------------------------------

    def _paused(self) -> None:
        if self.status.paused_reason == "Spec" and not self.spec.paused:
            self._resume_and_go()
            return
        # In-flight moves finish (a node is never left between proxies); no new ones start.
        failure = self._drive_moves() or self._health_failure()
        if failure and self.spec.rollback.automatic:
            self._start_rollback("KubeProxyUnhealthy", failure)
            return
        if self.force_promote and self.status.resume_phase == Phase.ANALYZING:
            self._resume_and_go()
            return
        if self.status.paused_reason == "NoData" and self._data_returned():
            self._event("DataReturned", "the metric checks answer again; resuming")
            self._resume_and_go()
            return
        self.requeue = 2 if self.status.moves else 30
        if self.status.paused_reason == "NoData" and self.spec.analysis is not None:
            self.requeue = min(self.requeue, float(self.spec.analysis.interval_seconds))

    def _data_returned(self) -> bool:
        """A fresh round in which every check measured something (pass or fail)."""
        round_ = self.obs.analysis
        status = self.status.analysis
        if round_ is None or status is None or not round_.checks:
            return False
        if status.last_round_time is not None and round_.time <= status.last_round_time:
            return False
        if any(c.verdict == Verdict.INCONCLUSIVE for c in round_.checks):
            status.last_round_time = round_.time
            return False
        status.consecutive_inconclusive = 0
        return True

    def _adopt_new_plan(self) -> None:
        """Resume after a plan change: started stages keep their nodes, the rest re-plan."""
        old = {s.name: s for s in self.status.stages if s.phase != StagePhase.PENDING}
        stages = []
        for spec_stage in self.spec.stages:
            kept = old.pop(spec_stage.name, None)
            stages.append(kept or StageStatus(name=spec_stage.name))
        orphans = [n for s in old.values() for n in s.nodes]
        self.status.stages = stages
        fixed = {i: s.nodes for i, s in enumerate(stages) if s.phase != StagePhase.PENDING}
        plan = plan_stages(self.spec.stages, self._eligible(), fixed)
        for i, stage in enumerate(stages):
            if stage.phase == StagePhase.PENDING:
                stage.nodes = plan[i]
        current = next(
            (i for i, s in enumerate(stages) if s.phase != StagePhase.COMPLETED), len(stages) - 1
        )
        # Nodes moved by a stage the new plan dropped stay recorded, so rollback finds them.
        stages[current].nodes = [
            *stages[current].nodes,
            *[n for n in orphans if n not in stages[current].nodes],
        ]
        self.status.current_stage = current
        self.status.plan_hash = plan_hash(self.spec)
        self.status.resume_phase = Phase.PROGRESSING
        self._event("PlanAdopted", f"resumed with the new plan at stage {stages[current].name}")

    # -- rollback -----------------------------------------------------------------------------

    def _start_rollback(self, reason: str, message: str) -> None:
        if self.status.phase == Phase.ROLLING_BACK:
            return
        self.status.rollback_reason = f"{reason}: {message}"
        self.status.moves = [
            m
            if m.direction != MoveDirection.FORWARD
            else Move(node=m.node, direction=MoveDirection.BACK, since=self.now)
            for m in self.status.moves
        ]
        self.status.paused_reason = None
        self.status.resume_phase = None
        self._transition(
            Phase.ROLLING_BACK, "RollbackStarted", f"rolling back: {message}", warning=True
        )
        self.requeue = 1

    def _labelled(self, names: list[str]) -> list[str]:
        """Of ``names``, the nodes that still carry a ``proxymode.io/mode`` label."""
        return [
            n for n in names if (v := self.obs.node(n)) is not None and v.mode_label is not None
        ]

    def _rolling_back(self) -> None:
        failure = self._drive_moves(MoveDirection.BACK)
        if failure:
            self._fail("RollbackStuck", f"rollback cannot finish: {failure}")
            return
        for stage in reversed(self.status.stages):
            pending = self._labelled(stage.nodes)
            if pending:
                if stage.phase != StagePhase.ROLLING_BACK:
                    stage.phase = StagePhase.ROLLING_BACK
                    self._event(
                        "StageRollingBack", f"stage {stage.name}: moving {len(pending)} nodes back"
                    )
                self._start_moves(pending, MoveDirection.BACK)
                self.requeue = min(self.requeue, 2)
                return
            if stage.phase not in (StagePhase.PENDING, StagePhase.ROLLED_BACK):
                stage.phase = StagePhase.ROLLED_BACK
        if self.status.moves:
            return
        if self._restore():
            self._finish_rollback()

    def _delete_target_pair(self) -> bool:
        """Ask for the target DaemonSet and ConfigMap to go. True when neither exists."""
        gone = True
        for obj, kind, api in (
            (self.obs.target_daemon_set, "DaemonSet", "apps/v1"),
            (self.obs.target_config_map, "ConfigMap", "v1"),
        ):
            if obj is not None:
                meta = obj["metadata"]
                self.actions.append(DeleteObject(api, kind, meta["namespace"], meta["name"]))
                gone = False
        return gone

    def _restore_source_spec(self, src_ds: Object, backup: Mapping[str, str], why: str) -> bool:
        """Patch the source DaemonSet back to the snapshot. True when it already matches."""
        original = objects.original_spec(backup)
        if src_ds["spec"] == original:
            return True
        meta = src_ds["metadata"]
        self.actions.append(
            PatchObject(
                "apps/v1",
                "DaemonSet",
                meta["namespace"],
                meta["name"],
                objects.spec_patch(src_ds, original),
                why=why,
            )
        )
        return False

    def _patch_config_data(self, cm: Object, desired: Mapping[str, str], why: str) -> bool:
        """Patch a ConfigMap's data to ``desired``. True when it already matches."""
        if (cm.get("data") or {}) == dict(desired):
            return True
        meta = cm["metadata"]
        self.actions.append(
            PatchObject(
                "v1",
                "ConfigMap",
                meta["namespace"],
                meta["name"],
                objects.data_patch(cm, desired),
                why=why,
            )
        )
        return False

    def _restore(self) -> bool:
        """Delete the target objects, put the source back exactly. True when all is back."""
        backup = self.obs.backup
        done = self._delete_target_pair()
        for job in self.obs.jobs:
            ns = self.spec.kube_proxy.namespace
            self.actions.append(DeleteObject("batch/v1", "Job", ns, job.name))
        if backup is None:
            return done
        src_ds, src_cm = self.obs.source_daemon_set, self.obs.source_config_map
        if src_ds is not None and not self._restore_source_spec(
            src_ds, backup, "restore the source DaemonSet from the snapshot"
        ):
            return False
        original_data = objects.original_config_data(backup)
        if src_cm is not None and not self._patch_config_data(
            src_cm, original_data, "restore the source ConfigMap from the snapshot"
        ):
            return False
        if src_ds is not None and not _rolled_out(src_ds):
            self.status.message = "waiting for the source DaemonSet to settle"
            self.requeue = 2
            return False
        return done

    def _finish_rollback(self) -> None:
        # The backup is deleted on the next look, once this phase is stored: if this
        # status write is lost, the snapshot must still be there to decide from.
        self.status.completed_time = self.now
        reason = self.status.rollback_reason or "rolled back"
        self._transition(
            Phase.ROLLED_BACK,
            "RolledBack",
            f"every node runs {self.status.source_mode} again ({reason})",
        )
        if self.obs.deleting:
            self.release = True
        self.requeue = 1  # the next look tidies up the snapshot

    # -- finalize -------------------------------------------------------------------------------

    def _finalizing(self) -> None:
        backup = self.obs.backup
        src_ds, src_cm = self.obs.source_daemon_set, self.obs.source_config_map
        if backup is None or src_ds is None or src_cm is None:
            self._fail("FinalizeBlocked", "the backup or the source objects are missing")
            return
        key = self.spec.kube_proxy.config_key
        original = objects.original_config_data(backup)
        try:
            final = with_mode(
                parse_config(original[key]),
                str(self.spec.target_mode),
                version=self._kube_proxy_version(),
                overrides=self.spec.config_overrides,
            ).to_yaml()
        except (ConfigError, KeyError) as e:
            self._fail("FinalizeBlocked", f"cannot render the final configuration: {e}")
            return
        desired = {**original, key: final}
        if not self._patch_config_data(
            src_cm, desired, f"write mode {self.spec.target_mode} into the source ConfigMap"
        ):
            self.requeue = 1
            return
        failure = self._drive_moves(MoveDirection.HANDBACK)
        if failure:
            self._pause("FinalizeStuck", failure)
            return
        labelled = self._labelled([n for s in self.status.stages for n in s.nodes])
        if labelled or self.status.moves:
            self._start_moves(labelled, MoveDirection.HANDBACK)
            self.status.message = f"handing {len(labelled)} nodes back to the source DaemonSet"
            self.requeue = 2
            return
        if self._restore_for_finalize(backup, src_ds):
            self.status.finalized = True
            self.status.completed_time = self.now
            self._transition(
                Phase.COMPLETED,
                "Completed",
                f"every node runs {self.spec.target_mode} from the source DaemonSet",
            )
            self.requeue = 1  # the next look tidies up the snapshot

    def _restore_for_finalize(self, backup: Mapping[str, str], src_ds: Object) -> bool:
        if not self._delete_target_pair():
            return False
        if not self._restore_source_spec(
            src_ds, backup, "restore the source DaemonSet's own affinity and update strategy"
        ):
            self.status.message = "restoring the source DaemonSet: one rolling restart follows"
            return False
        if not _rolled_out(src_ds):
            self.status.message = "waiting for the source DaemonSet's rolling restart"
            self.requeue = 2
            return False
        return True

    def _drop_backup(self) -> None:
        """Delete the snapshot once a stored terminal phase says nothing needs it any more."""
        if self.status.phase == Phase.COMPLETED and not self.status.finalized:
            return  # mixed mode: deleting the policy later rolls back from it
        if self.obs.backup is not None:
            ns, name = self.spec.kube_proxy.namespace, naming.backup_config_map(self.name)
            self.actions.append(DeleteObject("v1", "ConfigMap", ns, name))
        else:
            self.status.backup = None

    # -- deletion -------------------------------------------------------------------------------

    def _on_delete(self) -> None:
        changed = self.status.backup is not None or self.obs.backup is not None
        if self.status.finalized or self.status.phase == Phase.ROLLED_BACK or not changed:
            # Nothing of this policy's is left to undo; what it owns goes with it (GC).
            self.release = True
            return
        if self.status.phase != Phase.ROLLING_BACK:
            self._start_rollback("PolicyDeleted", "the policy is being deleted")
        self._rolling_back()

    # -- summary --------------------------------------------------------------------------------

    def _derive_summary(self) -> None:
        st = self.status
        st.observed_generation = self.obs.generation
        st.current_stage_name = self._stage_name()
        planned = [n for s in st.stages for n in s.nodes]
        moved = [n for n in planned if self._at_target(n)]
        if st.phase == Phase.FINALIZING or (st.phase == Phase.COMPLETED and st.finalized):
            # Finalizing hands nodes back to the source DaemonSet, now in the target mode:
            # count those, so the figure keeps rising to n/n.
            moved = [n for n in planned if (v := self.obs.node(n)) and v.mode_label is None]
        st.node_progress = f"{len(moved)}/{len(planned)}" if planned else None
        self._set_conditions()

    def _set_conditions(self) -> None:
        st = self.status
        phase = Phase(st.phase)
        message = st.message or ""
        in_flight = phase in (
            Phase.PREFLIGHT,
            Phase.PROGRESSING,
            Phase.ANALYZING,
            Phase.FINALIZING,
            Phase.ROLLING_BACK,
        )
        degraded = phase in (Phase.FAILED, Phase.ROLLING_BACK, Phase.ROLLED_BACK) and bool(
            st.rollback_reason or phase == Phase.FAILED
        )
        wanted = {
            "Ready": (
                phase == Phase.COMPLETED,
                "Completed" if phase == Phase.COMPLETED else str(phase),
            ),
            "Progressing": (in_flight, str(phase)),
            "Paused": (
                phase == Phase.PAUSED,
                st.paused_reason or ("Paused" if phase == Phase.PAUSED else "NotPaused"),
            ),
            "Degraded": (degraded, "RollbackOrFailure" if degraded else "Healthy"),
            "RolledBack": (
                phase == Phase.ROLLED_BACK,
                "RolledBack" if phase == Phase.ROLLED_BACK else "NotRolledBack",
            ),
        }
        current = {c.type: c for c in st.conditions}
        result = []
        for kind, (true, reason) in wanted.items():
            value = "True" if true else "False"
            old = current.get(kind)
            since = (
                old.last_transition_time if old is not None and old.status == value else self.now
            )
            result.append(
                Condition(
                    type=kind,
                    status=value,
                    reason=reason,
                    message=message,
                    last_transition_time=since,
                    observed_generation=self.obs.generation,
                )
            )
        st.conditions = result


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def _template_hash(ds: Object | None) -> str | None:
    if ds is None:
        return None
    annotations = ds["spec"]["template"].get("metadata", {}).get("annotations", {})
    return str(annotations.get("proxymode.io/config-hash"))


def _observed(ds: Object) -> bool:
    status = ds.get("status") or {}
    return int(status.get("observedGeneration", 0)) >= int(ds["metadata"].get("generation", 0))


def _rolled_out(ds: Object) -> bool:
    st = ds.get("status") or {}
    desired = st.get("desiredNumberScheduled", 0)
    return (
        _observed(ds)
        and st.get("updatedNumberScheduled", 0) == desired
        and st.get("numberReady", 0) == desired
        and st.get("numberUnavailable", 0) in (0, None)
    )
