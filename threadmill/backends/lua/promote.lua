#!lua flags=allow-oom
-- promote (the mover): move deferred tasks whose run_after has passed to ready.
-- A promotion pushes one wake token (unless one waits already), so an idle worker starts it.
-- KEYS[1] (zset)   deferred segment (score: run_after)
-- KEYS[2] (zset)   ready segment
-- KEYS[3] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[4] (list)   the queue's wake list
-- ARGV[1] (number) the most tasks to promote in this call
-- Returns: {the number promoted, seconds until the next deferred task is due (by the server's
--           clock, at least 0), or -1 when none is deferred}
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local promoted = 0
for _, id in ipairs(due) do
  local key = KEYS[3] .. id
  local score = redis.call('HGET', key, 'score')
  redis.call('ZREM', KEYS[1], id)
  if score then
    redis.call('ZADD', KEYS[2], score, id)
    redis.call('HSET', key, 'segment', 'ready')
    promoted = promoted + 1
  end
end
if promoted > 0 and redis.call('LLEN', KEYS[4]) == 0 then
  redis.call('LPUSH', KEYS[4], '1')
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = -1
if #next_due > 0 then
  wait = math.max(0, tonumber(next_due[2]) - now)
end
return {#due, string.format('%.6f', wait)}
