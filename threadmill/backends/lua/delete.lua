#!lua flags=allow-oom
-- delete: remove selected tasks of one segment of a queue, with their data and results.
-- A task that moved to another segment (or queue) since the caller saw it is left alone, so
-- a console acting on a stale page never deletes a task it did not show.
-- KEYS[1] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2] (prefix) result prefix of an older layout (1); today a result lives in its task hash
-- KEYS[3] (zset)   the segment the tasks must still be in
-- ARGV[1] (string) the queue's name
-- ARGV[2] (string) the segment's name
-- ARGV[3] (number) result time to live, seconds (a workflow's failed children and finished record
--                  expire after it)
-- ARGV[4..n] (string) task ids
-- Returns: {cut short, id1, id2, ...}: cut short is 1 when settling a deleted workflow task's
--          children ran out of budget (the ids left are on the settling list: continue_settling.lua),
--          else 0; then the ids deleted; an id left in the segment whose task data already expired
--          counts as deleted (its entry is removed)
-- A deleted unique task gives up its uniqueness key. A deleted workflow task settles as a cancelled
-- one does, before its hash goes (lib/workflow): a task that had not succeeded is counted failed in
-- its record, once (`counted`), and its children fail (UpstreamFailed, naming it) or are released by
-- their policy; a waiting one leaves its wait; a successful one was counted and released them already.
-- One whose children a call's budget left waiting leaves the mark that it was counted (lib/workflow).
-- include: unique
-- include: workflow
local deleted, budget, now = {0}, WORKFLOW_BUDGET, nil
for i = 4, #ARGV do
  local id = ARGV[i]
  local key = KEYS[1] .. id
  local fields = redis.call('HMGET', key, 'queue', 'segment', 'unique', 'workflow', 'node')
  local here = fields[1] == ARGV[1] and fields[2] == ARGV[2]
  if here or (not fields[1] and redis.call('ZSCORE', KEYS[3], id)) then
    if fields[3] then
      release_unique(key, id, fields[3], nil, nil, 0)
    end
    if here and fields[4] then
      if not now then
        local time = redis.call('TIME')
        now = tonumber(time[1]) + tonumber(time[2]) / 1000000
      end
      budget = settle_removed(key, id, fields[2], fields[4], fields[5], now, tonumber(ARGV[3]), budget)
    end
    redis.call('ZREM', KEYS[3], id)
    redis.call('DEL', key, KEYS[2] .. id)
    if here and fields[4] and budget <= 0 then
      mark_counted(key, tonumber(ARGV[3]))
    end
    deleted[#deleted + 1] = id
  end
end
if budget <= 0 then
  deleted[1] = 1
end
return deleted
