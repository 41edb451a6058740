-- Argo CD health check for ProxyModePolicy (proxymode.io/v1alpha1).
--
-- Argo CD sets the global `obj` to the live object and reads back {status, message}.
-- Its Lua VM (gopher-lua, Lua 5.1) loads only the package, base and table libraries and a
-- safe os: there is no string or math library, so this script uses neither, and the
-- resource.customizations.useOpenLibs setting is not needed.
--
-- The first rule that applies wins:
--
-- 0. A condition Degraded True with reason Forbidden for this generation: Degraded. The
--    API server refused a read the policy needs (RBAC: a kubeProxy.namespace the chart did
--    not grant); the operator acts on nothing until access is granted or the spec changes,
--    and no look sets observedGeneration meanwhile, so rule 1 alone would wait forever.
-- 1. No status, or status.observedGeneration below metadata.generation: Progressing.
--    The status then describes an older spec, so nothing else in it is evidence yet.
-- 2. RollingBack: Progressing when a person asked for it (rollbackReason Aborted, Retry or
--    PolicyDeleted): the operator is doing what it was told. Degraded when the operator
--    started it on its own (AnalysisFailed, KubeProxyUnhealthy, NoData with
--    onNoData: Rollback): the migration failed its gates. The engine's Degraded
--    condition is True for every rollback; this rule is the one place that reads finer.
-- 3. A condition of type Degraded with status True: Degraded. The engine sets it from
--    what it observed: Failed, a rollback, a pause on a failed gate, and a moved
--    kube-proxy that is unhealthy now (also in Completed, mixed mode).
-- 4. By phase:
--      Completed                                   Healthy (finalized or mixed mode)
--      Pending with spec.paused true               Suspended: held before preflight
--      Pending, Preflight, Progressing, Analyzing,
--      Finalizing                                  Progressing
--      Paused, pausedReason AnalysisFailed,
--        KubeProxyUnhealthy or FinalizeStuck       Degraded: a gate failed with
--                                                  rollback.automatic false; moved nodes
--                                                  may be failing now, a person decides
--      Paused, any other reason (Spec,
--        PlanChanged, NoData, ...)                 Suspended: held, nothing is broken
--      RolledBack (any reason), Failed             Degraded: like an aborted Argo Rollout,
--                                                  the target mode in the spec is not in
--                                                  effect until someone retries or edits
-- 5. Any other phase (from a newer operator): Unknown.
--
-- The message is status.message (the engine's own summary), with the pausedReason in
-- front when paused. status.rollbackMessage says what the rollback's reason saw.

local hs = {}
local status = obj.status
local generation = obj.metadata and obj.metadata.generation

-- Rollbacks a person asked for: abort, retry after a failure, deleting the policy.
local REQUESTED_ROLLBACK = { "Aborted", "Retry", "PolicyDeleted" }
-- Pauses on a failed gate with rollback.automatic false.
local BREACH_PAUSE = { AnalysisFailed = true, KubeProxyUnhealthy = true, FinalizeStuck = true }
local IN_FLIGHT = {
  Pending = true, Preflight = true, Progressing = true, Analyzing = true, Finalizing = true,
}

-- rollbackReason is a code (Aborted, NoData, ...). An operator before decision 0010 wrote
-- "<Reason>: <message>" in it; that form is still read. Without the string library a
-- prefix test uses ordering: text starts with "R:" exactly when "R:" <= text < "R;".
local function has_reason(text, reason)
  if type(text) ~= "string" then
    return false
  end
  return text == reason or (text >= reason .. ":" and text < reason .. ";")
end

local function requested(text)
  for _, reason in ipairs(REQUESTED_ROLLBACK) do
    if has_reason(text, reason) then
      return true
    end
  end
  return false
end

local function degraded_condition(conditions)
  if type(conditions) ~= "table" then
    return false
  end
  for _, c in ipairs(conditions) do
    if c.type == "Degraded" and c.status == "True" then
      return true
    end
  end
  return false
end

local function refused(conditions)
  if type(conditions) ~= "table" then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == "Degraded" and c.status == "True" and c.reason == "Forbidden"
        and (generation == nil or c.observedGeneration == generation) then
      return c
    end
  end
  return nil
end

local forbidden = status ~= nil and refused(status.conditions) or nil
if forbidden ~= nil then
  hs.status = "Degraded"
  hs.message = status.message or forbidden.message or "Forbidden"
  return hs
end

if status == nil or status.observedGeneration == nil
    or (generation ~= nil and status.observedGeneration < generation) then
  hs.status = "Progressing"
  if generation ~= nil then
    hs.message = "waiting for the operator to observe generation " .. tostring(generation)
  else
    hs.message = "waiting for the operator to write a status"
  end
  return hs
end

local phase = status.phase or "Pending"
local message = status.message
if message == nil or message == "" then
  message = "phase " .. phase
end
local reason = status.pausedReason or "Paused"
if phase == "Paused" then
  message = "paused (" .. reason .. "): " .. message
end

if phase == "RollingBack" then
  if requested(status.rollbackReason) then
    hs.status = "Progressing"
  else
    hs.status = "Degraded"
  end
  hs.message = message
  return hs
end

if degraded_condition(status.conditions) then
  hs.status = "Degraded"
  hs.message = message
  return hs
end

if phase == "Completed" then
  hs.status = "Healthy"
  hs.message = message
elseif phase == "Pending" and obj.spec ~= nil and obj.spec.paused == true then
  hs.status = "Suspended"
  hs.message = "paused (Spec): " .. message
elseif IN_FLIGHT[phase] then
  hs.status = "Progressing"
  hs.message = message
elseif phase == "Paused" then
  if BREACH_PAUSE[reason] then
    hs.status = "Degraded"
  else
    hs.status = "Suspended"
  end
  hs.message = message
elseif phase == "RolledBack" or phase == "Failed" then
  hs.status = "Degraded"
  hs.message = message
else
  hs.status = "Unknown"
  hs.message = "unknown phase " .. tostring(phase) .. ": " .. message
end
return hs
