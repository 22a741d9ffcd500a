#!lua flags=allow-oom
-- quarantine: move a task whose payload this code cannot read to the unreadable segment.
-- The payload is kept exactly as stored; only the read error is recorded beside it.
-- A workflow task's quarantine is its final outcome for the workflow: it is counted failed in the
-- record (once, its `counted` field) and its children are failed (UpstreamFailed) or released by their
-- policy, as a cancel settles them (lib/workflow); a waiting one leaves its wait. A later requeue of it
-- from the unreadable segment runs it as a lone task: its outcome is stored, but it was counted already,
-- and its children were settled, so neither changes again. A plain task runs the commands it ran before.
-- KEYS[1] (hash) the task
-- KEYS[2] (zset) the segment it is in now
-- KEYS[3] (zset) the queue's unreadable segment (score: quarantine time)
-- ARGV[1] (string) task id
-- ARGV[2] (string) the read error
-- ARGV[3] (string) lease token the task must hold, or "" for no fence
-- ARGV[4] (number) result time to live, seconds (a workflow's failed children and finished record
--                  expire after it); absent from an older caller: 86400
-- Returns: 1 quarantined; 2 quarantined, and settling its children was cut short at the budget (the
--          ids left are on the settling list: continue_settling.lua); 0 no such task; -1 the fence
--          refused it (another lease, or the task is no longer in KEYS[2])
-- include: workflow
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local f = redis.call('HMGET', KEYS[1], 'segment', 'lease_token', 'workflow', 'node')
if ARGV[3] ~= '' and f[2] ~= ARGV[3] then
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
if not f[3] then
  return 1
end
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local budget = settle_removed(KEYS[1], ARGV[1], f[1], f[3], f[4], now, tonumber(ARGV[4]) or 86400, WORKFLOW_BUDGET)
return budget > 0 and 1 or 2
