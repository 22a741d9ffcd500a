-- add_to_workflow: add one task to a stored workflow from a running task of it (threadmill.current_workflow),
-- all or nothing. The new task waits on the caller; each task named in `before` waits on the new task
-- as well as on its other parents. Exact because the caller is RUNNING when this runs (checked here):
-- its final outcome, which releases its children, cannot have been recorded yet, so each `before` task
-- still holds the caller in its pending set and cannot be released until the new task is final too.
-- Every check comes before the first write and no command after it can fail on a well-formed call. A
-- full server refuses the call before it runs (no allow-oom flag), as it refuses an enqueue.
-- The graph's new entry is appended as text: decoding a 10,000-task graph took this VM's Valkey 18 ms a
-- call, finding a name in it 0.8 ms. A node name is taken when the graph holds `[<name as JSON>, "`,
-- which every entry's start holds (`json.dumps`' fixed separators); a first parent of two or more
-- also holds it, and a parent is a node, so that match is a taken name too.
-- KEYS[1]      (hash)   the workflow's record: `graph`, `total`, `waiting`, `edges`, `added_parents:<id>`,
--                       `unnamed_added:<caller id>`
-- KEYS[2]      (set)    every queue name
-- KEYS[3]      (hash)   the new task's queue's totals: enqueued
-- KEYS[4]      (hash)   the new task (its `added_by` field: the caller's id)
-- KEYS[5]      (zset)   the new task's queue's waiting segment
-- KEYS[6]      (set)    the new task's pending set
-- KEYS[7]      (set)    the new task's children set
-- KEYS[8]      (hash)   the caller, the running task that adds
-- KEYS[9]      (set)    the caller's children set
-- KEYS[8+2i]   (hash)   `before` task i (1 <= i <= b)
-- KEYS[9+2i]   (set)    `before` task i's pending set
-- KEYS[#KEYS-1] (hash)  per-task limits: task path -> its limit (written only for a limited new task)
-- KEYS[#KEYS]  (hash)   queues that have held a task with a per-task limit: queue name -> "1" (the same)
-- ARGV[1]      (string) the workflow's id
-- ARGV[2]      (string) the caller's id
-- ARGV[3]      (string) the new task's id
-- ARGV[4]      (string) the new task's payload, stored exactly as given
-- ARGV[5]      (string) the new task's queue name
-- ARGV[6]      (number) the new task's ready score, kept in its hash for its release
-- ARGV[7]      (string) the new task's node name
-- ARGV[8]      (string) the new task's failure policy, "cancel" or "run"; for a task with a per-task limit,
--                       then "|", its task path, "|" and the path's limit (limits.encode), stored as
--                       enqueue.lua stores a limited task's
-- ARGV[9]      (string) the text the graph holds when the node name is taken: `[<name as JSON>, "`
-- ARGV[10]     (string) the new task's graph entry, JSON `[node, id, [caller's node]]`
-- ARGV[11]     (number) most tasks a workflow holds (threadmill.workflows.MAX_TASKS)
-- ARGV[12]     (string) the caller's lease token: a copy whose lease was taken back adds nothing
-- ARGV[13]     (number) most dependencies a workflow holds (threadmill.workflows.MAX_EDGES)
-- ARGV[14]     (number) the dependencies in the graph the caller read: the count for a record an older
--                       release stored, without `edges` (its runtime `before` edges then uncounted)
-- ARGV[15]     (string) for an add without a name, the record's field listing the caller's unnamed adds
--                       (`unnamed_added:<caller id>`), which the new id is appended to; "" for a named one
-- ARGV[15+i]   (string) `before` task i's id
-- Returns: {code, i}: code 1 stored; 0 no such workflow; -1 the workflow holds the most tasks; -2 the
--          caller is not a running task of this workflow under that lease; -3 the node name is taken; -4 the new id is
--          taken; -5 `before` task i is not a task of this workflow; -6 it has started (it is not
--          waiting); -7 it is not a child of the caller; -8 the new task's 1 + b dependencies would take
--          the workflow past the most it holds; i is 0 where no `before` task is meant
-- include: limited_task
local wid, caller, id = ARGV[1], ARGV[2], ARGV[3]
local b = (#KEYS - 11) / 2
local policy, limited = string.match(ARGV[8], '^(%a+)|?(.*)$')
local record = redis.call('HMGET', KEYS[1], 'total', 'graph', 'edges')
if not record[2] then
  return {0, 0}
end
if tonumber(record[1]) >= tonumber(ARGV[11]) then
  return {-1, 0}
end
local edges = (tonumber(record[3]) or tonumber(ARGV[14])) + 1 + b
if edges > tonumber(ARGV[13]) then
  return {-8, 0}
end
local lease = redis.call('HMGET', KEYS[8], 'workflow', 'segment', 'lease_token')
if lease[1] ~= wid or lease[2] ~= 'running' or lease[3] ~= ARGV[12] then
  return {-2, 0}
end
if string.find(record[2], ARGV[9], 1, true) then
  return {-3, 0}
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return {-4, 0}
end
for i = 1, b do
  local f = redis.call('HMGET', KEYS[8 + 2 * i], 'workflow', 'segment')
  if f[1] ~= wid then
    return {-5, i}
  end
  if f[2] ~= 'waiting' then
    return {-6, i}
  end
  if redis.call('SISMEMBER', KEYS[9 + 2 * i], caller) == 0 then
    return {-7, i}
  end
end
redis.call('HSET', KEYS[4], 'data', ARGV[4], 'queue', ARGV[5], 'segment', 'waiting', 'score', ARGV[6],
  'workflow', wid, 'node', ARGV[7], 'added_by', caller)
if policy == 'run' then
  redis.call('HSET', KEYS[4], 'on_parent_failure', 'run')
end
mark_limited(KEYS[4], ARGV[5], limited, KEYS[#KEYS - 1], KEYS[#KEYS])
redis.call('ZADD', KEYS[5], ARGV[6], id)
redis.call('SADD', KEYS[6], caller)
redis.call('SADD', KEYS[9], id)
for i = 1, b do
  local before = ARGV[15 + i]
  redis.call('SADD', KEYS[9 + 2 * i], id)
  redis.call('SADD', KEYS[7], before)
  local field = 'added_parents:' .. before
  local added = redis.call('HGET', KEYS[1], field)
  redis.call('HSET', KEYS[1], field, added and (added .. ',' .. id) or id)
end
redis.call('HSET', KEYS[1], 'graph', string.sub(record[2], 1, -2) .. ', ' .. ARGV[10] .. ']')
redis.call('HINCRBY', KEYS[1], 'total', 1)
redis.call('HINCRBY', KEYS[1], 'waiting', 1)
redis.call('HSET', KEYS[1], 'edges', edges)
if ARGV[15] ~= '' then
  local unnamed = redis.call('HGET', KEYS[1], ARGV[15])
  redis.call('HSET', KEYS[1], ARGV[15], unnamed and (unnamed .. ',' .. id) or id)
end
redis.call('SADD', KEYS[2], ARGV[5])
redis.call('HINCRBY', KEYS[3], 'enqueued', 1)
return {1, 0}
