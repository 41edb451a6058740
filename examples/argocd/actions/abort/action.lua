-- Abort: roll every moved node back to the source mode and restore the source
-- DaemonSet and ConfigMap from the operator's snapshot.
-- The operator reads the one-shot annotation proxymode.io/action, acts on it once and
-- removes it; other annotations are left as they are.
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["proxymode.io/action"] = "abort"
return obj
