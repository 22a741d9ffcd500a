#!lua flags=allow-oom
-- cancel_workflow: cancel a chunk of one workflow's tasks, each as cancel.lua cancels one (lib/cancel_task):
-- a waiting, ready or deferred task is finished as failed with the TaskCancelled document the caller
-- built, fenced by the segment the caller read it in, and settles its workflow (counted in the record,
-- its children failed or released by policy); a running one is asked to abort. The caller sends the
-- tasks children first (the graph reversed), so a cancel finds its waiting children cancelled already
-- and each task is recorded TaskCancelled, not UpstreamFailed. A crash between two chunks leaves the
-- tasks of the next chunks as they were: calling again (reading them again) finishes the job, and a
-- task cancelled already answers 0. Per queue it counts what cancel.lua counts.
-- KEYS[4j-3] (hash)   queue j's totals: finished, failed, cancelled, abort_requested (1 <= j <= m)
-- KEYS[4j-2] (string) this minute's egress counter of queue j
-- KEYS[4j-1] (string) this minute's failed counter of queue j
-- KEYS[4j]   (zset)   queue j's failed segment (score: finish time)
-- KEYS[4m+2i-1] (hash) task i
-- KEYS[4m+2i]   (zset) the segment the caller read task i in (waiting, ready or deferred; its queue's
--                      ready segment when read running)
-- ARGV[1] (number) result time to live, seconds
-- ARGV[2] (string) the abort request, JSON {"by": ..., "at": ...}
-- ARGV[3] (number) seconds a per-minute counter lives
-- ARGV[4] (number) m, the number of queues
-- ARGV[4i+1] (string) task i's id
-- ARGV[4i+2] (string) the segment the caller read task i in
-- ARGV[4i+3] (string) task i's failed document (TaskCancelled recorded), or "" when read running
-- ARGV[4i+4]   (number) task i's queue, j
-- Returns: {code_1, ..., code_n}: cancel.lua's codes a task (1 cancelled, 2 asked to abort, now or before,
--          0 already finished, -1 it left the segment read, -2 no such task, -3 unreadable)
-- include: unique
-- include: workflow
-- include: cancel_task
local m = tonumber(ARGV[4])
local n = (#KEYS - 4 * m) / 2
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local cancelled, asked, codes = {}, {}, {}
for j = 1, m do
  cancelled[j], asked[j] = 0, 0
end
local budget = WORKFLOW_BUDGET
for i = 1, n do
  local a = 4 * i
  local j = tonumber(ARGV[a + 4])
  local code
  code, budget = cancel_task(KEYS[4 * m + 2 * i - 1], ARGV[a + 1], KEYS[4 * m + 2 * i], ARGV[a + 2], KEYS[4 * j],
    ARGV[a + 3], ARGV[1], ARGV[2], now, budget)
  if code == 1 then
    cancelled[j] = cancelled[j] + 1
  elseif code == 2 then
    asked[j] = asked[j] + 1
  end
  codes[i] = code == 3 and 2 or code
end
for j = 1, m do
  if asked[j] > 0 then
    redis.call('HINCRBY', KEYS[4 * j - 3], 'abort_requested', asked[j])
  end
  if cancelled[j] > 0 then
    for _, field in ipairs({'finished', 'failed', 'cancelled'}) do
      redis.call('HINCRBY', KEYS[4 * j - 3], field, cancelled[j])
    end
    for _, counter in ipairs({KEYS[4 * j - 2], KEYS[4 * j - 1]}) do
      if redis.call('INCRBY', counter, cancelled[j]) == cancelled[j] then
        redis.call('EXPIRE', counter, ARGV[3])
      end
    end
  end
end
return codes
