#!lua flags=allow-oom
-- purge: delete one batch of a segment and the task data it owns.
-- Called repeatedly until it returns 0, so a huge segment never blocks the server.
-- KEYS[1] (zset)   the segment
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (prefix) result prefix of an older layout (1); today a result lives in its task hash
-- ARGV[1] (number) batch size
-- ARGV[2] (string) the segment's name; a task hash naming another segment is not deleted
-- ARGV[3] (number) result time to live, seconds (a workflow's failed children and finished record
--                  expire after it); absent (an older caller): one day
-- Returns: the number of ids removed from the segment in this batch
-- A deleted unique task gives up its uniqueness key. A purged workflow task settles as a deleted one
-- does (delete.lua, lib/workflow): counted failed once unless it had succeeded, its children failed or
-- released by their policy. Its `workflow` field is read in the HMGET every task gets, so a purge of
-- plain tasks runs no command more. A batch ends early once settling has spent one call's budget, so
-- the next call starts the next workflow task with a whole one; the children the budget left wait for
-- the sweeper, and the purged task's mark that it was counted (lib/workflow's mark_counted).
-- include: unique
-- include: workflow
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local ttl, budget, now, removed = tonumber(ARGV[3]) or 86400, WORKFLOW_BUDGET, nil, 0
for _, id in ipairs(ids) do
  local key = KEYS[2] .. id
  local fields = redis.call('HMGET', key, 'segment', 'unique', 'workflow', 'node')
  local segment = fields[1]
  if segment == ARGV[2] or not segment then
    if fields[2] then
      release_unique(key, id, fields[2], nil, nil, 0)
    end
    if segment and fields[3] then
      if not now then
        local time = redis.call('TIME')
        now = tonumber(time[1]) + tonumber(time[2]) / 1000000
      end
      budget = settle_removed(key, id, segment, fields[3], fields[4], now, ttl, budget)
    end
    redis.call('DEL', key, KEYS[3] .. id)
    if segment and fields[3] and budget <= 0 then
      mark_counted(key, ttl)
    end
  end
  redis.call('ZREM', KEYS[1], id)
  removed = removed + 1
  if budget <= 0 then
    break
  end
end
return removed
