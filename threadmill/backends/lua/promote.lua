-- promote (the mover): move deferred tasks whose run_after has passed to ready.
-- KEYS[1] (zset)   deferred segment (score: run_after)
-- KEYS[2] (zset)   ready segment
-- KEYS[3] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- ARGV[1] (number) the most tasks to promote in this call
-- Returns: the number promoted
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do
  local key = KEYS[3] .. id
  local score = redis.call('HGET', key, 'score')
  redis.call('ZREM', KEYS[1], id)
  if score then
    redis.call('ZADD', KEYS[2], score, id)
    redis.call('HSET', key, 'segment', 'ready')
  end
end
return #due
