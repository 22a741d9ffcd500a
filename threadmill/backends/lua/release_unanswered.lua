#!lua flags=allow-oom
-- release_unanswered: hand back the leases taken by acquire calls whose reply never reached the worker.
-- A call that timed out may still have run (a frozen server runs it when it wakes): its tasks
-- are leased to a live worker that does not know them. Such a lease carries the call's token
-- base; it goes back to ready as it was, with no attempt recorded, like release.
-- KEYS[1]    (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3i-1] (zset)   queue i's running segment
-- KEYS[3i]   (zset)   queue i's ready segment
-- KEYS[3i+1] (list)   queue i's wake list
-- ARGV[1]    (number) the most running entries to look through per queue
-- ARGV[2..]  (string) the token bases of the unanswered acquire calls
-- Returns: the number of tasks released
local prefixes = {}
for i = 2, #ARGV do
  prefixes[#prefixes + 1] = ARGV[i] .. ':'
end
local released = 0
for q = 1, (#KEYS - 1) / 3 do
  local running, ready, wake = KEYS[3 * q - 1], KEYS[3 * q], KEYS[3 * q + 1]
  local before = released
  for _, id in ipairs(redis.call('ZRANGE', running, 0, tonumber(ARGV[1]) - 1)) do
    local key = KEYS[1] .. id
    local fields = redis.call('HMGET', key, 'lease_token', 'score', 'started_at', 'lease_started_at')
    local token = fields[1]
    if token then
      for _, prefix in ipairs(prefixes) do
        if string.sub(token, 1, #prefix) == prefix then
          redis.call('ZREM', running, id)
          redis.call('HDEL', key, 'lease_worker', 'lease_token', 'lease_started_at')
          if fields[3] == fields[4] then
            redis.call('HDEL', key, 'started_at')
          end
          redis.call('HSET', key, 'segment', 'ready')
          redis.call('ZADD', ready, fields[2], id)
          released = released + 1
          break
        end
      end
    end
  end
  if released > before and redis.call('LLEN', wake) == 0 then
    redis.call('LPUSH', wake, '1')
  end
end
return released
