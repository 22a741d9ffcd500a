#!lua flags=allow-oom
-- pass_wake: wake one idle worker for tasks that wait with no wake token: the token a worker
-- process took while it turned quiet or stopping, and will not act on, is passed on.
-- KEYS[1..n]    (zset) ready segments
-- KEYS[n+1..2n] (list) the matching wake lists (at most one token each)
-- KEYS[2n+1]    (hash) paused queues: a paused queue wakes nobody
-- ARGV[1..n]    (string) the queue names, in KEYS order
-- Returns: 1 a token was pushed, 0 none was needed
local n = #ARGV
local paused = redis.call('HMGET', KEYS[2 * n + 1], unpack(ARGV))
for q = 1, n do
  local wake = KEYS[n + q]
  if not paused[q] and redis.call('LLEN', wake) == 0 and redis.call('ZCARD', KEYS[q]) > 0 then
    redis.call('LPUSH', wake, '1')
    return 1
  end
end
return 0
