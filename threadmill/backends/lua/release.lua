#!lua flags=allow-oom
-- release: hand leased tasks that never started back to ready, where they were, fenced per task.
-- No attempt is recorded: the payload stays as stored and the task keeps its ready score, so it
-- runs next in its priority band. A task whose lease_token no longer matches is left untouched.
-- KEYS[1] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3i-1] (zset) task i's running segment
-- KEYS[3i]   (zset) task i's ready segment
-- KEYS[3i+1] (list) task i's queue's wake list: one token wakes an idle worker for it
-- ARGV[2i-1] (string) task i's id
-- ARGV[2i]   (string) task i's lease token
-- Returns: the number of tasks released
local released = 0
local woken = {}
for i = 1, #ARGV / 2 do
  local id = ARGV[2 * i - 1]
  local key = KEYS[1] .. id
  local fields = redis.call('HMGET', key, 'lease_token', 'score', 'started_at', 'lease_started_at')
  if fields[1] and fields[1] == ARGV[2 * i] then
    redis.call('ZREM', KEYS[3 * i - 1], id)
    redis.call('HDEL', key, 'lease_worker', 'lease_token', 'lease_started_at')
    if fields[3] == fields[4] then
      -- This lease was the task's first: it has still never started.
      redis.call('HDEL', key, 'started_at')
    end
    redis.call('HSET', key, 'segment', 'ready')
    redis.call('ZADD', KEYS[3 * i], fields[2], id)
    released = released + 1
    local wake = KEYS[3 * i + 1]
    if not woken[wake] then
      woken[wake] = true
      if redis.call('LLEN', wake) == 0 then
        redis.call('LPUSH', wake, '1')
      end
    end
  end
end
return released
