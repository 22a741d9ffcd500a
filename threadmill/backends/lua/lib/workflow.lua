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

-- The settling of one script call: what its visits leave for the end of the call, done there once by
-- `finish_settling`, since each command a script runs costs about a microsecond of bridging on top of its own work
-- (a fan-in's parents, acknowledged in one call, paid a read of the join, an SREM, an EXISTS and an HINCRBY each).
-- `fields`: each child's fields, read once a call and its segment kept current by the call (only this call writes
-- it meanwhile); `pending`: per child (in `order`), the parents taken out of its pending set at the end, in one SREM,
-- the child released once that set empties; `counts`: per record (in `records`), the outcomes and waiting tasks to
-- add, one HINCRBY a field; `closed`: the records a task was settled in without a child left waiting, whose counts
-- are read at the end for the workflow's finish (a child left waiting proves it is not finished).
local function new_settling(now, ttl)
  return {now = now, ttl = ttl, fields = {}, pending = {}, order = {}, counts = {}, records = {}, closed = {}}
end

-- Add `by` to field `name` (successful, failed, waiting) of workflow record `record` at the end of the call.
local function add_count(s, record, name, by)
  local counts = s.counts[record]
  if not counts then
    counts = {successful = 0, failed = 0, waiting = 0}
    s.counts[record] = counts
    table.insert(s.records, record)
  end
  counts[name] = counts[name] + by
end

-- Count a final outcome in the workflow's record unless the task's `counted` field says it was. `mark` says how
-- that mark stands: nil, read and set here in one command; 'gone', the task's hash is gone (a hash of `counted`
-- alone is left, which expires after the call's `ttl` as its record does); 'set', its caller set it in this call,
-- having read it unset (the acknowledgement, in the HSET that stores the outcome); 'was', set before (count nothing).
-- The count is added at the end of the call (`s`, new_settling).
local function count_outcome(s, task_key, record, failed, mark)
  if mark == 'set' or (mark ~= 'was' and redis.call('HSETNX', task_key, 'counted', '1') == 1) then
    add_count(s, record, failed and 'failed' or 'successful', 1)
    if mark == 'gone' then
      redis.call('EXPIRE', task_key, s.ttl)
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

-- Fail waiting task `child` (hash `child_key`, of `queue`, fields `f`) because `parent` (node `parent_node`) failed.
local function fail_upstream(s, prefix, record, child, child_key, f, parent, parent_node)
  redis.call('HSET', child_key, 'segment', 'failed', 'counted', '1', 'upstream_failed',
    cjson.encode({parent = parent_node, parent_id = parent, at = s.now}))
  redis.call('EXPIRE', child_key, s.ttl)
  redis.call('DEL', prefix .. ':pending:' .. child)
  redis.call('ZREM', prefix .. ':' .. f[2] .. ':waiting', child)
  redis.call('ZADD', prefix .. ':' .. f[2] .. ':failed', s.now, child)
  redis.call('HINCRBY', prefix .. ':' .. f[2] .. ':totals', 'finished', 1)
  redis.call('HINCRBY', prefix .. ':' .. f[2] .. ':totals', 'failed', 1)
  add_count(s, record, 'waiting', -1)
  add_count(s, record, 'failed', 1)
  f[1] = 'failed'
  local left = s.pending[child]
  if left then
    left.parents = {}  -- its pending set is gone: nothing to take out of it
  end
end

-- Take `parent` out of waiting child `child`'s pending set at the end of the call (`finish_settling`).
local function leave_pending(s, prefix, record, child, child_key, f, parent)
  local left = s.pending[child]
  if not left then
    left = {key = prefix .. ':pending:' .. child, child_key = child_key, f = f, prefix = prefix, record = record,
      parents = {}}
    s.pending[child] = left
    table.insert(s.order, child)
  end
  table.insert(left.parents, parent)
end

-- Finish call settling `s`: take each child's parents out of its pending set (one SREM; a call visits at most the
-- budget, so its arguments stay within Lua's stack) and release the child once that set empties, move the children
-- released to their ready segments (one ZREM and one ZADD a queue, one wake token), add the counts, and record the
-- finish of a workflow whose visits left no child waiting and whose every task is now counted.
local function finish_settling(s)
  local released, queues = {}, {}
  for _, child in ipairs(s.order) do
    local left = s.pending[child]
    if left.parents[1] and redis.call('SREM', left.key, unpack(left.parents)) > 0
        and redis.call('EXISTS', left.key) == 0 then
      redis.call('HSET', left.child_key, 'segment', 'ready')
      left.f[1] = 'ready'
      local queue = left.prefix .. ':' .. left.f[2]
      local batch = released[queue]
      if not batch then
        batch = {ids = {}, scored = {}}
        released[queue] = batch
        table.insert(queues, queue)
      end
      table.insert(batch.ids, child)
      table.insert(batch.scored, left.f[3])
      table.insert(batch.scored, child)
      add_count(s, left.record, 'waiting', -1)
    end
  end
  for _, queue in ipairs(queues) do
    local batch = released[queue]
    redis.call('ZREM', queue .. ':waiting', unpack(batch.ids))
    redis.call('ZADD', queue .. ':ready', unpack(batch.scored))
    if redis.call('LLEN', queue .. ':wake') == 0 then
      redis.call('LPUSH', queue .. ':wake', '1')
    end
  end
  for _, record in ipairs(s.records) do
    local counts = s.counts[record]
    for _, name in ipairs({'successful', 'failed', 'waiting'}) do
      if counts[name] ~= 0 then
        redis.call('HINCRBY', record, name, counts[name])
      end
    end
    if s.closed[record] then
      local stored = redis.call('HMGET', record, 'total', 'successful', 'failed')
      if (tonumber(stored[2]) or 0) + (tonumber(stored[3]) or 0) >= (tonumber(stored[1]) or 0) then
        redis.call('HSET', record, 'finished_at', s.now)
        redis.call('EXPIRE', record, s.ttl)
      end
    end
  end
end

-- Count final task `id`'s outcome (`failed` true for a failure) in workflow `wid`'s record and release or
-- fail its children, theirs after them, visiting at most `budget` children; `mark` says how its `counted` mark
-- stands (count_outcome). `s`: the call's settling (new_settling), finished by the caller once every task of the call
-- is settled; nil: this call's own, finished here. Returns the budget left: 0 when it may have stopped short,
-- the tasks it did not finish then on the settling list.
local function settle_workflow(task_key, id, wid, node, failed, now, ttl, budget, mark, s)
  local own = s == nil
  s = s or new_settling(now, ttl)
  local prefix = prefix_of(task_key, id)
  local record = prefix .. ':workflow:' .. wid
  add_count(s, record, 'successful', 0)  -- listed, counted or not: its counts and its finish come at the end
  count_outcome(s, task_key, record, failed, mark)
  -- `open`: a child visited was waiting (it still waits, or will be made ready), so the workflow is not finished
  -- and its counts need no read: a fan-in's parents skip it. A child in any other segment proves nothing (an
  -- unreadable one is final), so the counts are read then (once a call, at its end, when the call may have
  -- failed that child since).
  local settling, head, open = {{id, failed, node}}, 1, false
  while settling[head] and budget > 0 do
    local parent, parent_failed, parent_node = settling[head][1], settling[head][2], settling[head][3]
    head = head + 1
    -- Popped as visited: SPOP takes at most the budget, and each child it returns is visited below.
    for _, child in ipairs(redis.call('SPOP', prefix .. ':children:' .. parent, budget)) do
      budget = budget - 1
      local child_key = prefix .. ':task:' .. child
      local f = s.fields[child_key]
      if not f then
        f = redis.call('HMGET', child_key, 'segment', 'queue', 'score', 'on_parent_failure', 'node')
        s.fields[child_key] = f
      end
      if f[1] == 'waiting' and parent_failed and f[4] ~= 'run' then
        fail_upstream(s, prefix, record, child, child_key, f, parent, parent_node)
        table.insert(settling, {child, true, f[5]})
      elseif f[1] == 'waiting' then
        open = true
        leave_pending(s, prefix, record, child, child_key, f, parent)
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
  if not open then
    s.closed[record] = true
  end
  if own then
    finish_settling(s)
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
