#!lua flags=allow-oom
-- retry_workflow: make a chunk of one workflow's failed tasks run again, the record's counts corrected.
-- Each task still failed (a task in another segment is left alone) leaves its queue's failed segment:
-- one whose parents are all successful goes to its ready segment, one with a parent that is not waits
-- again in its waiting segment, those parents in its pending set and it in each one's children set, so
-- the parent's final outcome settles it as the first one did (lib/workflow). A task that ran keeps its
-- errors: its result document becomes its payload, as requeue_many does; one failed because its parent
-- failed (`upstream_failed`) never ran and keeps its payload. The record counts it failed no more and
-- waiting again if it waits, and is not finished (nor expiring) any more. The caller sends the tasks in
-- graph order (parents first) in chunks: a parent reset in an earlier chunk that has run and succeeded
-- since releases nothing, and its child, reset later, finds it successful and goes to ready; a crash
-- between chunks leaves the later chunks' tasks failed, and calling again resets them.
-- KEYS[1]       (hash) the workflow's record
-- KEYS[4j-2]    (zset) queue j's failed segment (1 <= j <= m)
-- KEYS[4j-1]    (zset) queue j's ready segment
-- KEYS[4j]      (zset) queue j's waiting segment
-- KEYS[4j+1]    (list) queue j's wake list: one token when a task of it went to ready
-- then for each task i, in order: (hash) task i, (set) its pending set, and for each of its p_i parents
--               (hash) the parent, (set) the parent's children set
-- ARGV[1] (number) m, the number of queues
-- ARGV[1+4i-3] (string) task i's id
-- ARGV[1+4i-2] (number) task i's queue, j
-- ARGV[1+4i-1] (number) task i's ready score (its priority band and now, as an enqueue scores it)
-- ARGV[1+4i]   (string) task i's parents' ids, comma-separated ("" for none; p_i of them)
-- Returns: {tasks made ready, tasks made waiting}
local m = tonumber(ARGV[1])
local record = KEYS[1]
local k = 1 + 4 * m
local ready, waiting, woken = 0, 0, {}
for a = 2, #ARGV, 4 do
  local id, j, score = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2]
  local task, pending = KEYS[k + 1], KEYS[k + 2]
  k = k + 2
  local f = redis.call('HMGET', task, 'segment', 'upstream_failed', 'result')
  local parents = {}
  for parent in string.gmatch(ARGV[a + 3], '[^,]+') do
    parents[#parents + 1] = {parent, KEYS[k + 1], KEYS[k + 2]}
    k = k + 2
  end
  if f[1] == 'failed' then
    local waits = false
    for _, p in ipairs(parents) do
      if redis.call('HGET', p[2], 'segment') ~= 'successful' then
        redis.call('SADD', pending, p[1])
        redis.call('SADD', p[3], id)
        -- A settle cut short by its budget let the parent's set expire with the results; it is needed again.
        redis.call('PERSIST', p[3])
        waits = true
      end
    end
    if not f[2] and f[3] then
      redis.call('HSET', task, 'data', f[3])
    end
    redis.call('HDEL', task, 'result', 'upstream_failed', 'abort_requested', 'lease_worker', 'lease_token',
      'lease_started_at', 'reported_progress', 'read_error')
    if redis.call('HDEL', task, 'counted') == 1 then
      redis.call('HINCRBY', record, 'failed', -1)
    end
    redis.call('PERSIST', task)
    redis.call('ZREM', KEYS[4 * j - 2], id)
    local segment = waits and 'waiting' or 'ready'
    redis.call('HSET', task, 'segment', segment, 'score', score)
    redis.call('ZADD', KEYS[4 * j + (waits and 0 or -1)], score, id)
    if waits then
      redis.call('HINCRBY', record, 'waiting', 1)
      waiting = waiting + 1
    else
      ready = ready + 1
      woken[j] = true
    end
  end
end
if ready + waiting > 0 then
  redis.call('HDEL', record, 'finished_at')
  redis.call('PERSIST', record)
end
for j in pairs(woken) do
  if redis.call('LLEN', KEYS[4 * j + 1]) == 0 then
    redis.call('LPUSH', KEYS[4 * j + 1], '1')
  end
end
return {ready, waiting}
