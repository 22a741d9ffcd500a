#!lua flags=allow-oom
-- acknowledge: store the outcome of leased tasks and release their leases, fenced per task.
-- A task whose lease_token no longer matches (its lease expired and it was leased again,
-- or it was requeued) is left untouched and reported as refused. The result document goes
-- into the task hash (field `result`), which expires with it. The segment moves are batched:
-- one ZREM and one ZADD per segment a call, not per task, since every command a script runs
-- costs the server about a microsecond of bridging on top of its own work. Per queue it
-- counts the tasks out this minute (and the failed ones), for the console's history, and
-- adds them to the queue's totals, for metrics (with the runs a time limit or an abort ended).
-- KEYS[3j-2] (string) this minute's egress counter of queue j (1 <= j <= m)
-- KEYS[3j-1] (string) this minute's failed counter of queue j
-- KEYS[3j]   (hash)   queue j's totals: enqueued, finished, failed, timed_out, aborted
-- KEYS[3m+3i-2] (hash) task i
-- KEYS[3m+3i-1] (zset) task i's running segment
-- KEYS[3m+3i]   (zset) task i's finished segment (successful or failed; score: finish time)
-- KEYS[3m+3n+1] (hash) queues whose ready tasks acquire held back at their concurrency limit
-- KEYS[3m+3n+1+j] (list) queue j's wake list: a released lease of a held-back queue wakes an idle worker
-- ARGV[1] (number) result time to live, seconds (also trims the finished segment)
-- ARGV[2] (number) seconds a per-minute counter lives
-- ARGV[3] (string) telemetry channel
-- ARGV[4] (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- ARGV[5] (number) m, the number of queues
-- ARGV[5+j] (string) queue j's name
-- ARGV[5+m+5i-4] (string) task i's id
-- ARGV[5+m+5i-3] (string) task i's lease token
-- ARGV[5+m+5i-2] (string) task i's finished document
-- ARGV[5+m+5i-1] (string) task i's finished segment name, "successful" or "failed"
-- ARGV[5+m+5i]   (number) task i's queue, j
-- ARGV[6+m+5n] (string) optional, one letter a task: "t" its run passed its time limit, "a" an
--                       abort ended it, "-" neither; absent (none of either, or an older caller):
--                       nothing counted
-- ARGV[7+m+5n] (string) optional, one letter a task: "u" a unique task (its hash may hold a uniqueness
--                       key, released here), "-" not; absent: none is (a task without unique reads
--                       nothing more than its fence)
-- ARGV[7+m+5n+i] (string) optional, task i's attempt record (threadmill.attempts), appended to its
--                       `attempts` field; "" or absent (an older caller): none
-- A workflow task (its hash has a `workflow` field, read in the fence's own HMGET with its `counted`
-- mark, so a plain task runs no command more; a failed one's `node` is read then) releases or fails its
-- children here, once its fence accepted it (lib/workflow). The call's tasks are settled together, so a
-- fan-in's parents in one call read their join once and leave its pending set in one SREM.
-- Returns: {accepted_1, ..., accepted_n}, 1 where stored, 0 where the fence refused it, 2 where stored
--          and its release ran out of the call's budget: the rest waits on the settling list for
--          continue_settling.lua, which the caller runs next (the sweep finds it otherwise)
-- include: unique
-- include: workflow
local ttl = tonumber(ARGV[1])
local m = tonumber(ARGV[5])
local publish = ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH'
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local accepted = {}
local leaving = {}   -- running segment key -> ids
local arriving = {}  -- finished segment key -> {score, id, score, id, ...}
local out = {}
local failed = {}
local ended = {t = {}, a = {}}  -- per queue: runs a time limit ("t") or an abort ("a") ended
for j = 1, m do
  out[j], failed[j], ended.t[j], ended.a[j] = 0, 0, 0, 0
end
-- From the keys: the optional trailing arguments (marks, attempt records) vary in number.
local n = (#KEYS - 4 * m - 1) / 3
local marks = ARGV[6 + m + 5 * n] or ''
local uniques = ARGV[7 + m + 5 * n] or ''
-- include: attempts
-- include: chunked
-- Paid once a task, so kept to what a task uses: a letter is looked at only when some task of the call
-- has one, and the finish score and the time to live go as text (a number argument is converted each
-- time: 1,600 of a plain task's 68,000 server instructions).
local any_unique = string.find(uniques, 'u', 1, true) ~= nil
local any_mark = string.find(marks, '[ta]') ~= nil
local records_at = ARGV[8 + m + 5 * n] and 7 + m + 5 * n
local score = string.format('%.17g', now)
local workflow_budget, settling = WORKFLOW_BUDGET, new_settling(now, ttl)
for i = 1, n do
  local k, a = 3 * m + 3 * i - 3, 5 + m + 5 * i - 5
  local task, id, segment = KEYS[k + 1], ARGV[a + 1], ARGV[a + 4]
  local record = records_at and ARGV[records_at + i] or ''
  -- `counted` (a workflow task's mark that its outcome is counted) rides in the fence's HMGET: a field more for
  -- a plain task, inside the same reply table of four, against a command more for every workflow task.
  local token, attempts, workflow, counted
  if record == '' then
    local fields = redis.call('HMGET', task, 'lease_token', 'workflow', 'counted')
    token, workflow, counted = fields[1], fields[2], fields[3]
  else
    local fields = redis.call('HMGET', task, 'lease_token', 'attempts', 'workflow', 'counted')
    token, attempts, workflow, counted = fields[1], with_attempt(fields[2], record), fields[3], fields[4]
  end
  if token == ARGV[a + 2] then
    if any_unique and string.sub(uniques, i, i) == 'u' then
      local held = redis.call('HMGET', task, 'unique', 'unique_segments')
      if held[1] then
        release_unique(task, id, held[1], held[2], segment, ttl)
      end
    end
    -- The counted mark goes in the HSET that stores the outcome, not a command of its own.
    local marking = workflow and not counted
    if attempts and marking then
      redis.call('HSET', task, 'segment', segment, 'result', ARGV[a + 3], 'attempts', attempts, 'counted', '1')
    elseif attempts then
      redis.call('HSET', task, 'segment', segment, 'result', ARGV[a + 3], 'attempts', attempts)
    elseif marking then
      redis.call('HSET', task, 'segment', segment, 'result', ARGV[a + 3], 'counted', '1')
    else
      redis.call('HSET', task, 'segment', segment, 'result', ARGV[a + 3])
    end
    redis.call('HDEL', task, 'lease_worker', 'lease_token', 'lease_started_at')
    redis.call('EXPIRE', task, ARGV[1])
    local stored = 1
    if workflow then
      -- Only a failure names its node (a cancelled child's `upstream_failed`): a success reads no more.
      local node = segment == 'failed' and redis.call('HGET', task, 'node') or nil
      workflow_budget = settle_workflow(task, id, workflow, node, segment == 'failed', now, ttl, workflow_budget,
        marking and 'set' or 'was', settling)
      if workflow_budget <= 0 then
        stored = 2
      end
    end
    local running, finished = KEYS[k + 2], KEYS[k + 3]
    local ids = leaving[running]
    if not ids then
      ids = {}
      leaving[running] = ids
    end
    ids[#ids + 1] = id
    local scored = arriving[finished]
    if not scored then
      scored = {}
      arriving[finished] = scored
    end
    local size = #scored
    scored[size + 1], scored[size + 2] = score, id
    local j = tonumber(ARGV[a + 5])
    out[j] = out[j] + 1
    if segment == 'failed' then
      failed[j] = failed[j] + 1
    end
    if any_mark then
      local mark = ended[string.sub(marks, i, i)]
      if mark then
        mark[j] = mark[j] + 1
      end
    end
    accepted[i] = stored
  else
    accepted[i] = 0
  end
end
finish_settling(settling)
for running, ids in pairs(leaving) do
  call_chunked('ZREM', running, ids)
end
for finished, pairs_ in pairs(arriving) do
  call_chunked('ZADD', finished, pairs_)
  redis.call('ZREMRANGEBYSCORE', finished, '-inf', '(' .. (now - ttl))
end
local function count(key, by)
  if redis.call('INCRBY', key, by) == by then
    redis.call('EXPIRE', key, ARGV[2])
  end
end
for j = 1, m do
  if out[j] > 0 then
    count(KEYS[3 * j - 2], out[j])
    redis.call('HINCRBY', KEYS[3 * j], 'finished', out[j])
    if failed[j] > 0 then
      count(KEYS[3 * j - 1], failed[j])
      redis.call('HINCRBY', KEYS[3 * j], 'failed', failed[j])
    end
    if ended.t[j] > 0 then
      redis.call('HINCRBY', KEYS[3 * j], 'timed_out', ended.t[j])
    end
    if ended.a[j] > 0 then
      redis.call('HINCRBY', KEYS[3 * j], 'aborted', ended.a[j])
    end
    redis.call(publish, ARGV[3], '{"type":"egress","queue":' .. cjson.encode(ARGV[5 + j]) .. ',"count":' .. out[j] .. '}')
    -- A slot freed: one token for a worker that waits on this queue because acquire held it back.
    local wake = KEYS[3 * m + 3 * n + 1 + j]
    if redis.call('HDEL', KEYS[3 * m + 3 * n + 1], ARGV[5 + j]) == 1 and redis.call('LLEN', wake) == 0 then
      redis.call('LPUSH', wake, '1')
    end
  end
end
return accepted
