#!lua flags=allow-oom
-- continue_settling: settle, at once, the workflow tasks an earlier call cut short at its budget.
-- An acknowledgement (or a sweep, cancel, quarantine or delete) whose release of children ran out of
-- WORKFLOW_BUDGET pushed the final (or quarantined) tasks it had not finished onto the settling list
-- (lib/workflow); this call pops them in order and settles each through the same `settle_workflow`,
-- visiting at most WORKFLOW_BUDGET children, so no call holds the server longer than one
-- acknowledgement may. A task it cannot
-- finish goes back on the list (by `settle_workflow`), so the caller calls again while ids are left.
-- An id whose hash is gone or not final is dropped: the sweep settles its children from their pending sets.
-- KEYS[1] (list)   the settling list, `<prefix>:settling`: ids of final workflow tasks, oldest first
-- KEYS[2] (string) the task hash prefix, `<prefix>:task:` (not a key: every key here shares its tag)
-- ARGV[1] (number) result time to live, seconds (what a failed child's hash expires after)
-- Returns: {tasks settled, ids left on the list}
-- include: workflow
if redis.call('LLEN', KEYS[1]) == 0 then
  return {0, 0}  -- the common case, nothing cut short: one command
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local budget, settled = WORKFLOW_BUDGET, 0
while budget > 0 do
  local id = redis.call('LPOP', KEYS[1])
  if not id then
    break
  end
  local task = KEYS[2] .. id
  local f = redis.call('HMGET', task, 'segment', 'workflow', 'node')
  if f[2] and (f[1] == 'successful' or f[1] == 'failed' or f[1] == 'unreadable') then
    budget = settle_workflow(task, id, f[2], f[3] or id, f[1] ~= 'successful', now, tonumber(ARGV[1]), budget)
    settled = settled + 1
  end
end
return {settled, redis.call('LLEN', KEYS[1])}
