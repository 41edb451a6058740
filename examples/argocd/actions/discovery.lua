-- Argo CD action discovery for ProxyModePolicy (proxymode.io/v1alpha1).
--
-- An action is enabled only where the operator acts on it, so a button never does
-- nothing (or worse). Read against operator/proxymode/engine/machine.py (run,
-- _consume_action, _paused):
--
--   pause    spec.paused = true. The engine pauses at its next look in Preflight,
--            Progressing, Analyzing and Finalizing, and holds a Pending policy before
--            preflight (nothing is changed). Disabled when spec.paused is already true, and
--            in Paused, RollingBack and the terminal phases, where the engine ignores
--            spec.paused (a rollback is never held; a pause is already a pause).
--   resume   spec.paused = false plus the resume annotation. The engine resumes only in
--            Paused; enabled there, and whenever spec.paused is true so that a pause set
--            early (in Pending) can be taken back.
--   promote  The engine's promote skips the rest of the current stage's bake: it acts in
--            Analyzing, and in Paused when the pause interrupted Analyzing (resumePhase).
--            Anywhere else, or while spec.paused is true, the engine refuses it with a
--            PromoteIgnored Warning Event; the button is disabled there.
--   abort    Roll back. Everywhere except RollingBack and the terminal phases Completed,
--            RolledBack and Failed (a Completed mixed-mode policy rolls back when deleted).
--   retry    Start a new run. Only in Failed and RolledBack. From a Failed run that changed
--            something the engine first rolls it back, then starts the new run by itself.
--
-- No string library is used: Argo CD's Lua VM does not load it.

local actions = {}
local spec = obj.spec or {}
local status = obj.status or {}
local phase = status.phase or "Pending"
local paused_by_spec = spec.paused == true

local PAUSABLE = {
  Pending = true, Preflight = true, Progressing = true, Analyzing = true, Finalizing = true,
}
local NOT_ABORTABLE = { RollingBack = true, Completed = true, RolledBack = true, Failed = true }

local promotable = phase == "Analyzing"
    or (phase == "Paused" and status.resumePhase == "Analyzing")

actions["pause"] = {
  ["disabled"] = paused_by_spec or not PAUSABLE[phase],
  ["iconClass"] = "fa fa-fw fa-pause-circle",
  ["displayName"] = "Pause",
}
actions["resume"] = {
  ["disabled"] = not (phase == "Paused" or paused_by_spec),
  ["iconClass"] = "fa fa-fw fa-play-circle",
  ["displayName"] = "Resume",
}
actions["promote"] = {
  ["disabled"] = paused_by_spec or not promotable,
  ["iconClass"] = "fa fa-fw fa-forward",
  ["displayName"] = "Promote stage",
}
actions["abort"] = {
  ["disabled"] = NOT_ABORTABLE[phase] == true,
  ["iconClass"] = "fa fa-fw fa-times-circle",
  ["displayName"] = "Abort (roll back)",
}
actions["retry"] = {
  ["disabled"] = not (phase == "Failed" or phase == "RolledBack"),
  ["iconClass"] = "fa fa-fw fa-redo-alt",
  ["displayName"] = "Retry",
}
return actions
