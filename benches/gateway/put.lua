-- wrk script: PUT a body of SIZE bytes (arg 1) under PREFIX (arg 2).
-- Plain: a fresh path per request (nginx WebDAV). "fenced" (arg 3): one of
-- 64 keys per thread, Fence-Token 0.1 and a unique Idempotency-Key, so every
-- request is applied (allow-equal, guarded by its op-id); arg 4: the bearer
-- secret it authenticates with.
local counter = 0
function setup(thread)
  threads = (threads or 0) + 1
  thread:set("tid", threads)
end
function init(args)
  -- Idempotency-Keys unique across runs (a key repeated with another body
  -- is 422 idempotency-key-reused, and would be counted as non-2xx).
  math.randomseed(os.time() + tid)
  run = string.format("%d-%d", os.time(), math.random(1, 1000000000))
  body = string.rep("x", tonumber(args[1]) or 4096)
  prefix = args[2] or "/blobs/p"
  fenced = args[3] == "fenced"
  secret = args[4]
end
function request()
  counter = counter + 1
  local id = run .. "-" .. tid .. "-" .. counter
  if fenced then
    return wrk.format("PUT", prefix .. tid .. "-" .. (counter % 64),
      { ["Fence-Token"] = "0.1", ["Idempotency-Key"] = id,
        ["Authorization"] = "Bearer " .. secret }, body)
  end
  return wrk.format("PUT", prefix .. id, nil, body)
end
