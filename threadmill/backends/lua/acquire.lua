#!lua flags=allow-oom
-- acquire: pop up to `count` ready tasks round-robin across queues and lease them.
-- The payload is read, never decoded or rewritten: the lease is stored beside it.
-- KEYS[1..n]    (zset) ready segments, in this call's rotation order
-- KEYS[n+1..2n] (zset) the matching running segments (score: lease deadline)
-- KEYS[2n+1]    (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2n+2..3n+1] (list) the matching wake lists: when a full batch leaves tasks behind, a
--               token is passed on so one more idle worker wakes (a chain, not a herd)
-- KEYS[3n+2]    (hash)   paused queues: a paused queue is skipped in this same call
-- KEYS[3n+3]    (hash)   runtime limits: queue name -> "concurrency|rate count|rate period s", an empty
--               part taking the setting's (ARGV)
-- KEYS[3n+4]    (hash)   queues held back at their concurrency limit with tasks ready (acknowledge wakes
--               an idle worker for them when it frees a slot, and clears the flag)
-- KEYS[3n+4+q]  (list)   queue q's last lease times, newest first: its rate's tokens (limits.py)
-- KEYS[4n+5]    (hash)   queues that have held a task with a per-task limit (enqueue marks them)
-- KEYS[4n+6]    (hash)   per-task limits: task path -> "concurrency|rate count|rate period s"
-- KEYS[4n+7]    (prefix) a limited path's keys: prefix .. path .. ':running' (set of the ids leased under its
--               concurrency; a member whose hash is no longer running is dropped when the limit binds) and
--               prefix .. path .. ':lease-times' (its rate's tokens, as a queue's)
-- ARGV[1] (number) n, the number of queues
-- ARGV[2] (number) count, the most tasks to lease
-- ARGV[3] (string) worker holding the lease
-- ARGV[4] (number) lease time to live, seconds
-- ARGV[5] (string) fencing token base; each lease's token is base .. ':' .. i, unique per lease
-- ARGV[6..5+n] (string) the queue names, in KEYS order
-- ARGV[6+n..5+2n] (string) each queue's limits from the settings, "concurrency|rate count|rate period s"
-- ARGV[6+2n] (number) this partition's index p; ARGV[7+2n] (number) the partition count P: a limit N
--               allows this partition N // P, plus 1 when p < N % P
-- ARGV[8+2n] (number) how many ready tasks to look at past the head of a marked queue (TASK_LIMIT_LOOK)
-- A queue's limits: lib/queue_limits.lua; a marked queue's look past held heads: lib/look.lua and
-- lib/task_limits.lua; the turns between queues: lib/round_robin.lua; the leases: lib/lease.lua.
-- Returns: {server_seconds, server_microseconds, id1, data1, started_at1, token1, queue_index1,
--           worker_losses1 (false unless a suspect), id2, ..., held}; held is "" when no queue has ready tasks
--           a limit held back, "-1" when only concurrency did (a freed slot wakes a waiter), else the
--           seconds until the first of their rate tokens comes back
-- include: chunked
-- include: limits
-- include: rate_tokens
-- include: lease
-- include: queue_limits
-- include: task_limits
-- include: look
-- include: round_robin
local n, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local task_prefix, held_key = KEYS[2 * n + 1], KEYS[3 * n + 4]
local partition, partitions = tonumber(ARGV[6 + 2 * n]), tonumber(ARGV[7 + 2 * n])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local now_text = string.format('%.6f', now)
local out = {time[1], time[2]}
local leases = new_leases(task_prefix, ARGV[3], ARGV[5], now_text, string.format('%.6f', now + tonumber(ARGV[4])), out)

-- 1. Each queue's keys and settings; whether it is paused (then it is skipped in this same call), and
--    whether it is marked as holding tasks with a per-task limit (then it is read with a look).
local paused = redis.call('HMGET', KEYS[3 * n + 2], unpack(ARGV, 6, 5 + n))
local runtime = redis.call('HMGET', KEYS[3 * n + 3], unpack(ARGV, 6, 5 + n))
local marked = redis.call('HMGET', KEYS[4 * n + 5], unpack(ARGV, 6, 5 + n))
local queues, any_marked = {}, false
for q = 1, n do
  queues[q] = {ready = KEYS[q], running = KEYS[n + q], wake = KEYS[2 * n + 1 + q], lease_times = KEYS[3 * n + 4 + q],
    name = ARGV[5 + q], setting = ARGV[5 + n + q], paused = paused[q], marked = marked[q]}
  any_marked = any_marked or marked[q]
end

-- 2. The queues' limits: how many each may lease now.
local limits = queue_limits(queues, runtime, partition, partitions, now)

-- 3. Per-task limits and the looks, built only when a queue is marked: an unmarked queue pays the HMGET
--    above, nothing else (built every call, they cost an empty acquire about 4 us more: 23.6 against 18.7).
local paths, look
if any_marked then
  paths = task_limits(KEYS[4 * n + 6], KEYS[4 * n + 7], task_prefix, partition, partitions, now)
  look = looks(queues, count, tonumber(ARGV[8 + 2 * n]), task_prefix, leases, paths)
end

-- 4. Lease, the queues taking turns.
local tasks_left = lease_round_robin(queues, count, leases, limits, look)

-- 5. Store the leases, spend the limits' tokens and note what they held back.
leases.record(queues)
local wait = record_queue_limits(limits, queues, leases.taken, held_key, now_text, now)
local path_wait, path_held = nil, false
if paths then
  look.record(held_key)
  path_wait, path_held = paths.record(now_text), next(paths.held) ~= nil
end
local held = held_reply(wait, path_wait, path_held)

-- 6. A full batch that leaves tasks behind wakes one more idle worker.
if tasks_left then
  pass_the_token_on(queues, limits, leases.taken)
end
out[#out + 1] = held
return out
