-- Pause a ProxyModePolicy: spec.paused = true. The operator holds at its next look; moves
-- already under way finish (a node is never left between two kube-proxies).
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.paused = true
return obj
