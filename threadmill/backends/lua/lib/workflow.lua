-- workflow (included): a workflow task's final outcome releases its children (threadmill.workflows).
-- `settle_workflow` runs in the script that records the outcome, after its fence accepted it, so a
-- retry (requeue, not this script), a refused acknowledgement or a second run never reaches it.
-- The keys it touches are built from the task hash's own (declared) key `<prefix>:task:<id>`, the
-- same hash tag and so the same slot: the workflow's record `<prefix>:workflow:<wid>`, each task's
-- `<prefix>:children:<id>` and `<prefix>:pending:<id>` sets, a queue's `<prefix>:<queue>:waiting`,
-- `:ready`, `:failed` segments, `:wake` list and `:totals` hash. A child whose pending set empties
-- goes to its queue's ready segment (the wake token pushed as a plain enqueue pushes it); a child
-- of a failed parent whose policy is "cancel" is recorded failed at once, field `upstream_failed`
-- naming the parent, and settles its own children in the same call (breadth first).
-- Bounded: one script call visits at most WORKFLOW_BUDGET children; the rest keep their parent in
-- their pending sets, and a call that ran out of budget pushes the tasks it had not finished onto
-- the `<prefix>:settling` list, which the next calls (continue_settling.lua) pop and settle at once;
-- the broker's sweeper (sweep_waiting.lua) still finds whatever no call continued (the children sets
-- a call cut short expire with the results, as a final child left in one needs nothing). A task's
-- outcome is counted in the record once, marked by its `counted` field, however many calls settle its
-- children.

-- Most children one script call visits: a call that fails 1,000 took 42-46 ms of the server (about 12
-- commands a child), the longest a workflow makes one call; the sweeper settles the rest.
local WORKFLOW_BUDGET = 1000

-- The prefix of the task hash `task_key` of task `id` (`<prefix>:task:<id>`).
local function prefix_of(task_key, id)
  return string.sub(task_key, 1, #task_key - #id - #':task:')
end

-- Count a final outcome in the workflow's record unless the task's `counted` field says it was. A task
-- whose hash is gone (`gone`) is left a hash of `counted` alone, which expires after `ttl` as its record does.
local function count_outcome(task_key, record, failed, ttl, gone)
  if redis.call('HSETNX', task_key, 'counted', '1') == 1 then
    redis.call('HINCRBY', record, failed and 'failed' or 'successful', 1)
    if gone then
      redis.call('EXPIRE', task_key, ttl)
    end
  end
end

-- Leave, in place of a removed (deleted or purged) task's hash, the mark that its outcome was counted, for
-- `ttl` seconds as its record: a call whose budget ran out left children waiting on it, and the sweeper,
-- which settles them from their pending sets, must not count it again.
local function mark_counted(task_key, ttl)
  redis.call('HSET', task_key, 'counted', '1')
  redis.call('EXPIRE', task_key, ttl)
end

-- Take waiting task `id` (hash `task_key`) of workflow `wid` out of the wait it is in (its pending set, the
-- record's waiting count); its caller moves it out of the waiting segment.
local function leave_waiting(task_key, id, wid)
  local prefix = prefix_of(task_key, id)
  redis.call('DEL', prefix .. ':pending:' .. id)
  redis.call('HINCRBY', prefix .. ':workflow:' .. wid, 'waiting', -1)
end

-- Fail waiting task `child` (hash `child_key`, of `queue`) because `parent` (node `parent_node`) failed.
local function fail_upstream(prefix, record, child, child_key, queue, parent, parent_node, now, ttl)
  redis.call('HSET', child_key, 'segment', 'failed', 'counted', '1', 'upstream_failed',
    cjson.encode({parent = parent_node, parent_id = parent, at = now}))
  redis.call('EXPIRE', child_key, ttl)
  redis.call('DEL', prefix .. ':pending:' .. child)
  redis.call('ZREM', prefix .. ':' .. queue .. ':waiting', child)
  redis.call('ZADD', prefix .. ':' .. queue .. ':failed', now, child)
  redis.call('HINCRBY', prefix .. ':' .. queue .. ':totals', 'finished', 1)
  redis.call('HINCRBY', prefix .. ':' .. queue .. ':totals', 'failed', 1)
  redis.call('HINCRBY', record, 'waiting', -1)
  redis.call('HINCRBY', record, 'failed', 1)
end

-- Count final task `id`'s outcome (`failed` true for a failure) in workflow `wid`'s record and release or
-- fail its children, theirs after them, visiting at most `budget` children; push one wake token per queue
-- that got a ready task; `gone` says its hash is gone (count_outcome). Returns the budget left: 0 when it
-- may have stopped short, the tasks it did not finish then on the settling list.
local function settle_workflow(task_key, id, wid, node, failed, now, ttl, budget, gone)
  local prefix = prefix_of(task_key, id)
  local record = prefix .. ':workflow:' .. wid
  count_outcome(task_key, record, failed, ttl, gone)
  -- `open`: a child visited was waiting (it still waits, or was made ready), so the workflow is not finished
  -- and its counts need no read: a fan-in's parents skip it, about a sixth of their release's commands. A child
  -- in any other segment proves nothing (an unreadable one is final), so the counts are read then.
  -- `released`: per queue, the children made ready, moved out of waiting in one ZREM and one ZADD at the end
  -- (the acknowledgement's own batching; a call releases at most the budget, 2,000 arguments).
  local settling, head, released, open = {{id, failed, node}}, 1, {}, false
  while settling[head] and budget > 0 do
    local parent, parent_failed, parent_node = settling[head][1], settling[head][2], settling[head][3]
    head = head + 1
    -- Popped as visited: SPOP takes at most the budget, and each child it returns is visited below.
    for _, child in ipairs(redis.call('SPOP', prefix .. ':children:' .. parent, budget)) do
      budget = budget - 1
      local child_key = prefix .. ':task:' .. child
      local f = redis.call('HMGET', child_key, 'segment', 'queue', 'score', 'on_parent_failure', 'node')
      local queue, pending = f[2], prefix .. ':pending:' .. child
      if f[1] == 'waiting' and parent_failed and f[4] ~= 'run' then
        fail_upstream(prefix, record, child, child_key, queue, parent, parent_node, now, ttl)
        table.insert(settling, {child, true, f[5]})
      elseif f[1] == 'waiting' then
        open = true
        if redis.call('SREM', pending, parent) == 1 and redis.call('EXISTS', pending) == 0 then
          redis.call('HSET', child_key, 'segment', 'ready')
          local batch = released[queue] or {ids = {}, scored = {}}
          released[queue] = batch
          table.insert(batch.ids, child)
          table.insert(batch.scored, f[3])
          table.insert(batch.scored, child)
        end
      end
    end
  end
  if budget <= 0 then
    -- The task the budget ran out in (it may have children left) and the cascade's queue after it are
    -- continued at once from the settling list; should nothing continue them, a waiting child left is
    -- reached through its pending set (the sweeper), and the sets left go with the results.
    for i = math.max(head - 1, 1), #settling do
      redis.call('RPUSH', prefix .. ':settling', settling[i][1])
      redis.call('EXPIRE', prefix .. ':children:' .. settling[i][1], ttl)
    end
  end
  for queue, batch in pairs(released) do
    redis.call('ZREM', prefix .. ':' .. queue .. ':waiting', unpack(batch.ids))
    redis.call('ZADD', prefix .. ':' .. queue .. ':ready', unpack(batch.scored))
    redis.call('HINCRBY', record, 'waiting', -#batch.ids)
    local wake = prefix .. ':' .. queue .. ':wake'
    if redis.call('LLEN', wake) == 0 then
      redis.call('LPUSH', wake, '1')
    end
  end
  if not open then
    local counts = redis.call('HMGET', record, 'total', 'successful', 'failed')
    if (tonumber(counts[2]) or 0) + (tonumber(counts[3]) or 0) >= (tonumber(counts[1]) or 0) then
      redis.call('HSET', record, 'finished_at', now)
      redis.call('EXPIRE', record, ttl)
    end
  end
  return budget
end

-- Settle workflow task `id` (hash `task_key`, read in `segment`) that a quarantine, a delete or a purge takes out of
-- its workflow: a final outcome, failed unless it had succeeded, counted once (`counted`) and settling its
-- children by policy as a cancel does; a waiting one leaves its wait. A task counted already with no
-- children left to settle is left alone (its finished record keeps its `finished_at` and expiry).
-- Returns the budget left, as settle_workflow.
local function settle_removed(task_key, id, segment, wid, node, now, ttl, budget)
  if redis.call('HEXISTS', task_key, 'counted') == 1
      and redis.call('EXISTS', prefix_of(task_key, id) .. ':children:' .. id) == 0 then
    return budget
  end
  if segment == 'waiting' then
    leave_waiting(task_key, id, wid)
  end
  return settle_workflow(task_key, id, wid, node or id, segment ~= 'successful', now, ttl, budget)
end
