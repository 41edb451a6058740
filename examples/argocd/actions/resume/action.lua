-- Resume a paused ProxyModePolicy. Both halves are needed: spec.paused = false lifts a
-- pause the spec asked for (pausedReason Spec), and the one-shot annotation
-- proxymode.io/action=resume lifts the others (PlanChanged, NoData, a failed gate with
-- rollback.automatic false). The operator refuses the annotation while spec.paused is
-- true, so both go in one change. spec.paused is written only when it is true, so the
-- object gains no field it did not have.
if obj.spec ~= nil and obj.spec.paused == true then
  obj.spec.paused = false
end
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["proxymode.io/action"] = "resume"
return obj
