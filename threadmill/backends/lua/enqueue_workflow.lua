-- enqueue_workflow: store a whole workflow (threadmill.workflows) in one call, all or nothing.
-- Every existence check comes before the first write, and the script runs no command that can
-- fail once it writes, so no half workflow is left: when the record exists already (a retried
-- call whose first reply was lost stored it all) nothing is written and 0 is returned; when a
-- task hash exists but the record does not (an id reused), nothing is written and -1 is returned.
-- A full server refuses the call before it runs (no allow-oom flag). A task without parents goes
-- to its ready (or deferred) segment; one with parents to its queue's waiting segment, with its
-- parents' ids in its pending set and its own id in each parent's children set. The record counts the
-- dependencies in `edges`, which a task added at run time grows (add_to_workflow.lua). A task with a
-- per-task limit (`@task(concurrency=, rate=)`) is stored as enqueue.lua stores one: field `limit_path`,
-- its path's limit recorded and its queue marked, so acquire holds it to the limit once it is ready.
-- KEYS[1]         (set)    every queue name
-- KEYS[2]         (hash)   the workflow's record
-- KEYS[3]         (zset)   workflow ids by enqueue time
-- KEYS[3+2j-1]    (list)   queue j's wake list (1 <= j <= m)
-- KEYS[3+2j]      (hash)   queue j's totals: enqueued
-- KEYS[3+2m+4i-3] (hash)   task i
-- KEYS[3+2m+4i-2] (zset)   task i's target segment: waiting, ready or deferred
-- KEYS[3+2m+4i-1] (set)    task i's pending set: its parents' ids
-- KEYS[3+2m+4i]   (set)    task i's children set
-- KEYS[#KEYS-1]   (hash)   per-task limits: task path -> its limit (written only for a limited task)
-- KEYS[#KEYS]     (hash)   queues that have held a task with a per-task limit: queue name -> "1" (the same)
-- ARGV[1]         (string) the workflow's id
-- ARGV[2]         (string) the workflow's name
-- ARGV[3]         (string) the workflow's graph, JSON, stored as given
-- ARGV[4]         (number) m, the number of queues
-- ARGV[4+j]       (string) queue j's name
-- ARGV[4+m+8i-7]  (string) task i's id
-- ARGV[4+m+8i-6]  (string) task i's payload, stored exactly as given
-- ARGV[4+m+8i-5]  (number) task i's queue, j
-- ARGV[4+m+8i-4]  (string) task i's target segment name: "waiting", "ready" or "deferred"
-- ARGV[4+m+8i-3]  (number) task i's ready score, kept in the hash for its release
-- ARGV[4+m+8i-2]  (number) task i's score in its target segment
-- ARGV[4+m+8i-1]  (string) task i's node name
-- ARGV[4+m+8i]    (string) task i's parents: their indices i, comma-separated ("" for none; each earlier
--                          than i), then "|" and its failure policy, "cancel" or "run"; for a task with a
--                          per-task limit, then "|", its task path, "|" and the path's limit (limits.encode)
-- Returns: the number of tasks stored, 0 when the workflow was stored already, -1 when a task id is taken
-- include: limited_task
local m = tonumber(ARGV[4])
local n = (#KEYS - 5 - 2 * m) / 4
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[3 + 2 * m + 4 * i - 3]) == 1 then
    return -1
  end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local waiting, edges = 0, 0
local woken = {}
local per_queue = {}
for j = 1, m do
  per_queue[j] = 0
end
for i = 1, n do
  local k, a = 3 + 2 * m + 4 * i - 4, 4 + m + 8 * i - 8
  local j = tonumber(ARGV[a + 3])
  local parents, policy, limited = string.match(ARGV[a + 8], '^([^|]*)|(%a+)|?(.*)$')
  local segment = ARGV[a + 4]
  redis.call('HSET', KEYS[k + 1], 'data', ARGV[a + 2], 'queue', ARGV[4 + j], 'segment', segment,
    'score', ARGV[a + 5], 'workflow', ARGV[1], 'node', ARGV[a + 7])
  if policy == 'run' then
    redis.call('HSET', KEYS[k + 1], 'on_parent_failure', 'run')
  end
  mark_limited(KEYS[k + 1], ARGV[4 + j], limited, KEYS[#KEYS - 1], KEYS[#KEYS])
  redis.call('ZADD', KEYS[k + 2], ARGV[a + 6], ARGV[a + 1])
  for parent in string.gmatch(parents, '%d+') do
    local p = tonumber(parent)
    edges = edges + 1
    redis.call('SADD', KEYS[k + 3], ARGV[4 + m + 8 * p - 7])
    redis.call('SADD', KEYS[3 + 2 * m + 4 * p], ARGV[a + 1])
  end
  if segment == 'waiting' then
    waiting = waiting + 1
  elseif segment == 'ready' then
    woken[j] = true
  end
  per_queue[j] = per_queue[j] + 1
end
redis.call('HSET', KEYS[2], 'name', ARGV[2], 'graph', ARGV[3], 'created_at', now, 'total', n,
  'waiting', waiting, 'successful', 0, 'failed', 0, 'edges', edges)
redis.call('ZADD', KEYS[3], now, ARGV[1])
for j = 1, m do
  redis.call('SADD', KEYS[1], ARGV[4 + j])
  redis.call('HINCRBY', KEYS[3 + 2 * j], 'enqueued', per_queue[j])
  if woken[j] and redis.call('LLEN', KEYS[3 + 2 * j - 1]) == 0 then
    redis.call('LPUSH', KEYS[3 + 2 * j - 1], '1')
  end
end
return n
