-- cancel_task (included, after `unique` and `workflow`): cancel one task, the step cancel.lua and
-- cancel_workflow.lua share. A waiting, ready or deferred task is finished as failed with the document
-- the caller built (TaskCancelled), fenced by the segment the caller read it in; a running one is asked to
-- abort (field abort_requested, the first request kept). A cancelled workflow task leaves the waiting
-- segment's count if it waited, is counted in its workflow's record and settles its children by policy
-- (lib/workflow), all in the caller's call. The queue's counters are the caller's to count. `now` (server
-- seconds) is read here when nil, only for a task it cancels.
-- Returns: 1 cancelled; 2 abort requested now; 3 abort requested before; 0 already finished; -1 it left
--          the segment read; -2 no such task; -3 unreadable; and the workflow budget left.
local function cancel_task(key, id, read_key, read_segment, failed_key, document, ttl, request, now, budget)
  local f = redis.call('HMGET', key, 'segment', 'workflow', 'node', 'unique')
  local current = f[1]
  if not current then
    return -2, budget
  end
  if current == 'running' then
    return redis.call('HSETNX', key, 'abort_requested', request) == 1 and 2 or 3, budget
  end
  if current == 'successful' or current == 'failed' then
    return 0, budget
  end
  if current == 'unreadable' then
    return -3, budget
  end
  if current ~= read_segment or document == '' then
    return -1, budget
  end
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) + tonumber(time[2]) / 1000000
  end
  redis.call('ZREM', read_key, id)
  redis.call('ZADD', failed_key, now, id)
  redis.call('HSET', key, 'segment', 'failed', 'result', document, 'abort_requested', request)
  redis.call('EXPIRE', key, ttl)
  if f[4] then
    release_unique(key, id, f[4], nil, nil, 0)
  end
  if f[2] then
    if current == 'waiting' then
      leave_waiting(key, id, f[2])
    end
    budget = settle_workflow(key, id, f[2], f[3], true, now, ttl, budget)
  end
  return 1, budget
end
