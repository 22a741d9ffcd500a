-- workflow (included): a workflow task's final outcome releases its children (threadmill.workflows).
-- `settle_workflow` runs in the script that records the outcome, after its fence accepted it, so a
-- retry (requeue, not this script), a refused acknowledgement or a second run never reaches it.
-- The keys it touches are built from the task hash's own (declared) key `<prefix>:task:<id>`, the
-- same hash tag and so the same slot: the workflow's record `<prefix>:workflow:<wid>`, each task's
-- `<prefix>:children:<id>` and `<prefix>:pending:<id>` sets, a queue's `<prefix>:<queue>:waiting`,
-- `:ready`, `:failed` segments, `:wake` list and `:totals` hash. A child whose pending set empties
-- goes to its queue's ready segment (the wake token pushed as a plain enqueue pushes it); a child
-- of a failed parent whose policy is "cancel" is recorded failed at once, field `upstream_failed`
-- naming the parent, and settles its own children in the same call (breadth first). The work is
-- bounded by the workflow's size (`threadmill.workflows.MAX_TASKS` tasks and `MAX_EDGES` edges).

-- The prefix of the task hash `task_key` of task `id` (`<prefix>:task:<id>`).
local function prefix_of(task_key, id)
  return string.sub(task_key, 1, #task_key - #id - #':task:')
end

-- Count task `id`'s outcome (`failed` true for a failure) in workflow `wid`'s record and release or fail its
-- children, theirs after them; then push one wake token per queue that got a ready task.
local function settle_workflow(task_key, id, wid, node, failed, now, ttl)
  local prefix = prefix_of(task_key, id)
  local record = prefix .. ':workflow:' .. wid
  redis.call('HINCRBY', record, failed and 'failed' or 'successful', 1)
  local settling, head, woken = {{id, failed, node}}, 1, {}
  while settling[head] do
    local parent, parent_failed, parent_node = settling[head][1], settling[head][2], settling[head][3]
    head = head + 1
    local children_key = prefix .. ':children:' .. parent
    local children = redis.call('SMEMBERS', children_key)
    redis.call('DEL', children_key)
    for _, child in ipairs(children) do
      local child_key = prefix .. ':task:' .. child
      local f = redis.call('HMGET', child_key, 'segment', 'queue', 'score', 'on_parent_failure', 'node')
      local queue = f[2]
      local pending = prefix .. ':pending:' .. child
      if f[1] == 'waiting' and parent_failed and f[4] ~= 'run' then
        redis.call('HSET', child_key, 'segment', 'failed', 'upstream_failed',
          cjson.encode({parent = parent_node, parent_id = parent, at = now}))
        redis.call('EXPIRE', child_key, ttl)
        redis.call('DEL', pending)
        redis.call('ZREM', prefix .. ':' .. queue .. ':waiting', child)
        redis.call('ZADD', prefix .. ':' .. queue .. ':failed', now, child)
        redis.call('HINCRBY', prefix .. ':' .. queue .. ':totals', 'finished', 1)
        redis.call('HINCRBY', prefix .. ':' .. queue .. ':totals', 'failed', 1)
        redis.call('HINCRBY', record, 'waiting', -1)
        redis.call('HINCRBY', record, 'failed', 1)
        table.insert(settling, {child, true, f[5]})
      elseif f[1] == 'waiting' and redis.call('SREM', pending, parent) == 1
          and redis.call('EXISTS', pending) == 0 then
        redis.call('HSET', child_key, 'segment', 'ready')
        redis.call('ZREM', prefix .. ':' .. queue .. ':waiting', child)
        redis.call('ZADD', prefix .. ':' .. queue .. ':ready', f[3], child)
        redis.call('HINCRBY', record, 'waiting', -1)
        woken[queue] = true
      end
    end
  end
  for queue in pairs(woken) do
    local wake = prefix .. ':' .. queue .. ':wake'
    if redis.call('LLEN', wake) == 0 then
      redis.call('LPUSH', wake, '1')
    end
  end
  local counts = redis.call('HMGET', record, 'total', 'successful', 'failed')
  if (tonumber(counts[2]) or 0) + (tonumber(counts[3]) or 0) >= (tonumber(counts[1]) or 0) then
    redis.call('HSET', record, 'finished_at', now)
    redis.call('EXPIRE', record, ttl)
  end
end
