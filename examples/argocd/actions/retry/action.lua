-- Retry a Failed or RolledBack policy: a new run from preflight. From a Failed run that
-- changed something, the operator first rolls that back; retry again once RolledBack.
-- The operator reads the one-shot annotation proxymode.io/action, acts on it once and
-- removes it; other annotations are left as they are.
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["proxymode.io/action"] = "retry"
return obj
