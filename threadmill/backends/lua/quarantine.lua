#!lua flags=allow-oom
-- quarantine: move a task whose payload this code cannot read to the unreadable segment.
-- The payload is kept exactly as stored; only the read error is recorded beside it.
-- KEYS[1] (hash) the task
-- KEYS[2] (zset) the segment it is in now
-- KEYS[3] (zset) the queue's unreadable segment (score: quarantine time)
-- ARGV[1] (string) task id
-- ARGV[2] (string) the read error
-- ARGV[3] (string) lease token the task must hold, or "" for no fence
-- Returns: 1 quarantined; 0 no such task; -1 the fence refused it (another lease, or the task is
--          no longer in KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[3] then
  return -1
end
-- Only from the segment it was read in: a ready task a peek found unreadable may have been
-- acquired since (or a deferred one promoted), and moving it then would leave its id in the
-- segment it is in now as well.
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return -1
end
local time = redis.call('TIME')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], time[1] .. '.' .. string.format('%06d', tonumber(time[2])), ARGV[1])
redis.call('HDEL', KEYS[1], 'lease_worker', 'lease_token', 'lease_started_at')
redis.call('HSET', KEYS[1], 'segment', 'unreadable', 'read_error', ARGV[2])
return 1
