-- enqueue: store new tasks of one queue and add each to its ready or deferred segment.
-- When a task becomes ready, one token is pushed onto the queue's wake list unless one is
-- there already: an idle worker blocked on that list wakes and acquires. One token wakes one
-- worker, so a burst does not wake every idle worker at once (acquire passes the token on).
-- A scheduled run (ARGV[4] names its schedule) is guarded in the same call, so each tick is
-- enqueued once however many brokers try: nothing is written when the schedule's last tick is
-- not older than this one; a schedule seen for the first time, or paused, only records the tick.
-- The cron and zone are recorded beside the tick: a broker's first offer under other ones than
-- recorded is an edit made while it was away, and an edited schedule starts at its next tick like
-- a new one (later offers do not compare them: in a rolling deploy both versions run side by side).
-- A run-now (no tick) skips the guard and is recorded as the last run.
-- KEYS[1]     (set)    every queue name
-- KEYS[2]     (string) this minute's ingress counter of the queue
-- KEYS[3]     (list)   the queue's wake list
-- KEYS[4]     (hash)   schedule state: <name>:tick, <name>:cron, <name>:task, <name>:enqueued_at, <name>:paused
-- KEYS[5]     (hash)   the queue's totals: enqueued, finished, failed
-- KEYS[2i+4]  (hash)   task i
-- KEYS[2i+5]  (zset)   task i's target segment: ready (score: priority, then FIFO) or deferred (run_after)
-- KEYS[5+2n+j] (string) unique entry j's uniqueness key: the id of the task holding it
-- ARGV[1]     (string) queue name
-- ARGV[2]     (string) telemetry channel
-- ARGV[3]     (number) seconds the ingress counter lives
-- ARGV[4]     (string) the schedule this run belongs to, or "" for a plain enqueue
-- ARGV[5]     (number) the schedule's tick, epoch seconds, or "" for a run-now
-- ARGV[6]     (string) the schedule's cron expression and zone, "" for a plain enqueue
-- ARGV[7]     (string) "1" when this is the calling broker's first offer of the schedule, else "0"
-- ARGV[8]     (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- ARGV[5i+4]  (string) task i's id
-- ARGV[5i+5]  (string) task i's payload, stored exactly as given
-- ARGV[5i+6]  (string) task i's target segment name, "ready" or "deferred"
-- ARGV[5i+7]  (number) task i's ready score, kept in the hash so a deferred task can be promoted
-- ARGV[5i+8]  (number) task i's score in its target segment
-- On a retried call (ARGV[#ARGV-3] "1") a task whose hash exists already is left as it is and not
-- counted: the first attempt, whose reply was lost, stored it then, and it may have moved on since
-- (leased, even finished). A first attempt skips that EXISTS: its ids were chosen for it, so none is stored.
-- ARGV[6+5n+3j] (number) unique entry j: its task's index i (a task has at most one entry)
-- ARGV[7+5n+3j] (number) unique entry j: milliseconds its key holds at most, 0 while its holder counts
-- ARGV[8+5n+3j] (string) unique entry j: the segments its holder counts in, comma-separated
-- ARGV[#ARGV-3] (string) "1" when this call is a retry of one whose reply was lost, else "0"
-- ARGV[#ARGV-2] (string) the task path of a task with a per-task limit (`@task(concurrency=, rate=)`),
--               "" for any other: each task stored gets it in field `limit_path`, and the path's limit and
--               the queue are recorded for acquire
-- ARGV[#ARGV-1] (string) that path's limit, "concurrency|rate count|rate period s"
-- ARGV[#ARGV]  (number) u, the number of unique entries (0 for a call without unique tasks)
-- KEYS[#KEYS-1] (hash)  per-task limits: task path -> its limit; given only with a task path
-- KEYS[#KEYS]   (hash)  queues that have held a task with a per-task limit: queue name -> "1"; the same
-- Returns: the number of tasks stored now (0 when a schedule's guard refused the run; fewer than
--          given means the rest were already stored or duplicates); with u > 0, {stored, i, holder
--          id, ...}: each task i not stored as a duplicate, and who holds its key (its own id when a
--          retried call's first attempt stored it)
local u = tonumber(ARGV[#ARGV])
local n = (#ARGV - 12 - 3 * u) / 5
local retried = ARGV[#ARGV - 3] == '1'
local limit_path = ARGV[#ARGV - 2]
local schedule, tick, timing = ARGV[4], ARGV[5], ARGV[6]
if schedule ~= '' then
  if tick ~= '' then
    local last = redis.call('HGET', KEYS[4], schedule .. ':tick')
    local recorded = redis.call('HGET', KEYS[4], schedule .. ':cron')
    -- State from a release that did not record the cron cannot tell an edit: it is trusted.
    local edited = ARGV[7] == '1' and recorded and recorded ~= timing
    if last and tonumber(last) >= tonumber(tick) then
      -- Recorded now, or this broker's restart after the new cron's next tick would skip it.
      if edited then
        redis.call('HSET', KEYS[4], schedule .. ':cron', timing)
      end
      return 0
    end
    -- The tick is taken even when nothing runs, so a paused schedule resumes at its next tick.
    redis.call('HSET', KEYS[4], schedule .. ':tick', tick, schedule .. ':cron', timing)
    if not last or edited or redis.call('HEXISTS', KEYS[4], schedule .. ':paused') == 1 then
      return 0
    end
  end
  local time = redis.call('TIME')
  redis.call('HSET', KEYS[4], schedule .. ':task', ARGV[9], schedule .. ':enqueued_at',
    string.format('%d.%06d', time[1], time[2]))
end
local unique, duplicate = nil, nil
if u > 0 then
  -- Included inside the branch: a call without unique tasks does not build its functions (about 3% of its cost).
-- include: unique
  unique = admit_unique(n, u)
  duplicate = unique.duplicate
end
local ready = false
local stored = 0
for i = 1, n do
  local a = 5 * i + 4
  -- A duplicate, or already stored by a first attempt (enqueue_retry): skipped whole.
  if not (duplicate and duplicate[i]) and not (retried and redis.call('EXISTS', KEYS[2 * i + 4]) == 1) then
    stored = stored + 1
    if limit_path == '' then
      redis.call('HSET', KEYS[2 * i + 4], 'data', ARGV[a + 1], 'queue', ARGV[1], 'segment', ARGV[a + 2],
        'score', ARGV[a + 3])
    else
      redis.call('HSET', KEYS[2 * i + 4], 'data', ARGV[a + 1], 'queue', ARGV[1], 'segment', ARGV[a + 2],
        'score', ARGV[a + 3], 'limit_path', limit_path)
    end
    redis.call('ZADD', KEYS[2 * i + 5], ARGV[a + 4], ARGV[a])
    ready = ready or ARGV[a + 2] == 'ready'
  end
end
if u > 0 then
  unique.store(stored)
end
redis.call('SADD', KEYS[1], ARGV[1])
if limit_path ~= '' and stored > 0 then
  redis.call('HSET', KEYS[#KEYS - 1], limit_path, ARGV[#ARGV - 1])
  redis.call('HSET', KEYS[#KEYS], ARGV[1], '1')
end
-- Written even when nothing was stored (INCRBY 0 is a write): WAITAOF and WAIT after a retry
-- then wait for an offset past the first attempt's write, on the retry's own connection.
if redis.call('INCRBY', KEYS[2], stored) == stored then
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
redis.call('HINCRBY', KEYS[5], 'enqueued', stored)
if ready and redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('LPUSH', KEYS[3], '1')
end
local publish = ARGV[8] == '1' and 'SPUBLISH' or 'PUBLISH'
redis.call(publish, ARGV[2], '{"type":"ingress","queue":' .. cjson.encode(ARGV[1]) .. ',"count":' .. stored .. '}')
if u > 0 then
  return unique.reply
end
return stored
