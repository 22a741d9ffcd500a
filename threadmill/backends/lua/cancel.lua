#!lua flags=allow-oom
-- cancel: finish a waiting, ready or deferred task as failed (TaskCancelled) before it runs, or ask a running one to abort.
-- The caller read the task and built its failed document from what it read; the move is fenced
-- by the segment it read, so a task leased in between is never finished under a live lease:
-- it gets the abort request instead, in this same call (never a lost update). The request is
-- stored with the task (field abort_requested, the first one kept), where the worker running
-- it looks; an older worker never looks, and runs the task to its end.
-- KEYS[1] (hash)   the task
-- KEYS[2] (zset)   the segment the caller read the task in (waiting, ready or deferred; unused otherwise)
-- KEYS[3] (zset)   the queue's failed segment (score: finish time)
-- KEYS[4] (hash)   the queue's totals: enqueued, finished, failed, cancelled, abort_requested
-- KEYS[5] (string) this minute's egress counter of the queue
-- KEYS[6] (string) this minute's failed counter of the queue
-- ARGV[1] (string) task id
-- ARGV[2] (string) the segment the caller read the task in
-- ARGV[3] (string) the task's failed document (TaskCancelled recorded), or "" when read running
-- ARGV[4] (number) result time to live, seconds
-- ARGV[5] (string) the abort request, JSON {"by": ..., "at": ...}
-- ARGV[6] (number) seconds a per-minute counter lives
-- Returns: 1 cancelled; 2 abort requested (running); 0 already finished; -1 it left the segment
--          read (read it again); -2 no such task; -3 unreadable (quarantined, not cancellable)
-- A cancelled unique task gives up its uniqueness key (a running one when its worker acknowledges).
-- A cancelled workflow task is counted in its workflow's record and fails or releases its children by
-- their policy, as an acknowledged failure does (lib/workflow); a waiting one leaves its wait too. Its
-- `workflow` field is read in the HMGET that reads the segment, so a plain task runs no command more.
-- include: unique
-- include: workflow
-- include: cancel_task
local code = cancel_task(KEYS[1], ARGV[1], KEYS[2], ARGV[2], KEYS[3], ARGV[3], ARGV[4], ARGV[5], nil, WORKFLOW_BUDGET)
if code == 2 then
  -- Counted once a task, as the first request is the one kept.
  redis.call('HINCRBY', KEYS[4], 'abort_requested', 1)
end
if code ~= 1 then
  return code == 3 and 2 or code
end
redis.call('HINCRBY', KEYS[4], 'finished', 1)
redis.call('HINCRBY', KEYS[4], 'failed', 1)
redis.call('HINCRBY', KEYS[4], 'cancelled', 1)
for _, counter in ipairs({KEYS[5], KEYS[6]}) do
  if redis.call('INCR', counter) == 1 then
    redis.call('EXPIRE', counter, ARGV[6])
  end
end
return 1
