#!lua flags=allow-oom
-- sweep_waiting: settle the final parents of some waiting tasks of one queue that no acknowledgement
-- or cancel settled (an older release's worker acknowledged them, or an older release cancelled
-- them), so their children are released or failed as the acknowledgement would have (lib/workflow).
-- It also finishes a cascade or a release an acknowledgement left at its budget (lib/workflow): a
-- parent still in a waiting task's pending set has children left to settle, and its outcome is
-- counted once whoever settles it (its `counted` field). A parent whose hash is gone (expired,
-- purged, deleted by an older release) or quarantined (unreadable) is settled as failed: its outcome
-- cannot be read any more; a gone one is counted once, by the `counted` hash it is left (which expires
-- with the results), or the one a delete or a purge left (lib/workflow's mark_counted). At most WORKFLOW_BUDGET
-- children are visited a call; the waiting tasks looked at are returned so the caller pages on.
-- KEYS[1] (zset)   the queue's waiting segment
-- KEYS[2] (string) the task hash prefix, `<prefix>:task:` (not a key: every key here shares its tag)
-- ARGV[1] (number) the rank of the first waiting task to look at, from 0
-- ARGV[2] (number) how many waiting tasks to look at
-- ARGV[3] (number) result time to live, seconds (what a failed child's hash expires after)
-- Returns: {parents settled, waiting tasks looked at}
-- include: workflow
local prefix = string.sub(KEYS[2], 1, #KEYS[2] - #':task:')
local first = tonumber(ARGV[1])
local ids = redis.call('ZRANGE', KEYS[1], first, first + tonumber(ARGV[2]) - 1)
if #ids == 0 then
  return {0, 0}  -- the common case, nothing waiting: one command
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local settled, budget, looked = 0, WORKFLOW_BUDGET, 0
for _, child in ipairs(ids) do
  if budget <= 0 then
    break
  end
  looked = looked + 1
  local workflow = redis.call('HGET', KEYS[2] .. child, 'workflow')
  for _, parent in ipairs(redis.call('SMEMBERS', prefix .. ':pending:' .. child)) do
    local task = KEYS[2] .. parent
    local f = redis.call('HMGET', task, 'segment', 'node')
    if workflow and budget > 0 and (f[1] == 'successful' or f[1] == 'failed' or f[1] == 'unreadable'
        or not f[1]) then
      budget = settle_workflow(task, parent, workflow, f[2] or parent, f[1] ~= 'successful', now,
        tonumber(ARGV[3]), budget, not f[1])
      settled = settled + 1
    end
  end
end
return {settled, looked}
