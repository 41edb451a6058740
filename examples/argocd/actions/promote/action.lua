-- Promote the current stage: skip the rest of its bake (and its wait for passing
-- analysis rounds) and go on to the next stage.
-- The operator reads the one-shot annotation proxymode.io/action, acts on it once and
-- removes it; other annotations are left as they are.
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["proxymode.io/action"] = "promote"
return obj
