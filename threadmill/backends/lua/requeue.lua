#!lua flags=allow-oom
-- requeue: move one task from any segment but ready back to ready, or to deferred.
-- Keeps the id and the metadata; clears the lease, any stored result and the reported progress
-- (a new attempt reports its own). With a new document (the worker's
-- retry path) that document replaces the payload; without one, a finished task's result
-- document (which carries its errors and worker ids) becomes the payload, and any other
-- payload is kept exactly as stored, so an unreadable task is requeued without parsing it.
-- KEYS[1] (hash)   the task
-- KEYS[2] (string) the task's result document as an older layout stored it (layout 1); today
--                  the result is the task hash's `result` field
-- KEYS[3..8] (zset) the task's queue segments: ready, deferred, running, successful, failed, unreadable
-- KEYS[9]  (list)   the queue's wake list: one token wakes an idle worker for a task made ready
-- KEYS[10] (hash)   the queue's totals, or absent (an older caller): where ARGV[7] is counted
-- KEYS[11] (hash)   queues whose ready tasks acquire held back at their concurrency limit, or absent (an
--                   older caller): a running task requeued frees a slot, and wakes an idle worker for a
--                   held-back queue as acknowledge does
-- ARGV[1] (string) task id
-- ARGV[2] (string) target segment, "ready" or "deferred"
-- ARGV[3] (number) run_after as epoch seconds (deferred only)
-- ARGV[4] (string) lease token the task must hold, or "" for no fence
-- ARGV[5] (string) new payload, or "" to keep the stored one
-- ARGV[6] (string) the segment the caller read the task in, or "" (or absent: an older caller) for any
-- ARGV[7] (string) the totals field to add 1 to once requeued (the worker's retry of a run that
--                  passed its time limit: "timed_out"), or absent for none
-- ARGV[8] (string) the attempt record of the run that ends here (threadmill.attempts; the worker's retry
--                  or hand-back), or "" or absent: a task leased when requeued (a console requeue of a
--                  running task) gets a "requeued" record of its lease, written here
-- ARGV[9] (string) the queue's name (its field in KEYS[11]); absent with KEYS[11]
-- A unique task requeued from a segment its key does not count in (a finished task) takes its key back
-- when no other counted task holds it (lib/unique.lua); otherwise the key stays where it is.
-- Returns: 1 requeued; 0 no such task, or already ready; -1 the fence refused it (another lease,
--          or the task left the segment ARGV[6] names)
local segments = {ready = 3, deferred = 4, running = 5, successful = 6, failed = 7, unreadable = 8}
-- include: attempts
-- include: unique
local fields = redis.call('HMGET', KEYS[1], 'segment', 'score', 'lease_token', 'result', 'attempts', 'lease_worker',
  'lease_started_at', 'unique', 'unique_segments')
local current = fields[1]
if not current or current == 'ready' then
  return 0
end
if ARGV[4] ~= '' and fields[3] ~= ARGV[4] then
  return -1
end
-- A task read deferred (or finished) may be promoted and leased before this runs: moving it
-- then would take a live lease without the token that fences one.
if (ARGV[6] or '') ~= '' and current ~= ARGV[6] then
  return -1
end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'data', ARGV[5])
else
  local result = fields[4] or redis.call('GET', KEYS[2])
  if result then
    redis.call('HSET', KEYS[1], 'data', result)
  end
end
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- The ready score is (100 - priority) * 1e13 + enqueue milliseconds; a requeued task
-- keeps its priority band and joins the back of it.
local band = math.floor(tonumber(fields[2] or '1e15') / 1e13) * 1e13
local score = band + now_ms
redis.call('ZREM', KEYS[segments[current]], ARGV[1])
redis.call('DEL', KEYS[2])
redis.call('PERSIST', KEYS[1])
-- A new attempt reports its own progress; the metadata is the task's and stays.
redis.call('HDEL', KEYS[1], 'lease_worker', 'lease_token', 'lease_started_at', 'read_error', 'result',
  'reported_progress')
local record = ARGV[8] or ''
if record == '' and fields[6] then
  record = cjson.encode({fields[6], tonumber(fields[7] or ''), cjson.null,
    tonumber(time[1]) + tonumber(time[2]) / 1000000, 'requeued', ''})
end
if record ~= '' then
  redis.call('HSET', KEYS[1], 'segment', ARGV[2], 'score', string.format('%.0f', score), 'attempts',
    with_attempt(fields[5], record))
else
  redis.call('HSET', KEYS[1], 'segment', ARGV[2], 'score', string.format('%.0f', score))
end
if ARGV[2] == 'deferred' then
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
else
  redis.call('ZADD', KEYS[3], string.format('%.0f', score), ARGV[1])
  if redis.call('LLEN', KEYS[9]) == 0 then
    redis.call('LPUSH', KEYS[9], '1')
  end
end
if fields[8] then
  retake_unique(KEYS[1], ARGV[1], fields[8], fields[9], current, ARGV[2])
end
-- A freed slot (a retry to deferred included): one token for a worker acquire held back on this queue.
if current == 'running' and KEYS[11] and redis.call('HDEL', KEYS[11], ARGV[9]) == 1
    and redis.call('LLEN', KEYS[9]) == 0 then
  redis.call('LPUSH', KEYS[9], '1')
end
if KEYS[10] and (ARGV[7] or '') ~= '' then
  redis.call('HINCRBY', KEYS[10], ARGV[7], 1)
end
return 1
