-- enqueue: store new tasks of one queue and add each to its ready or deferred segment.
-- When a task becomes ready, one token is pushed onto the queue's wake list unless one is
-- there already: an idle worker blocked on that list wakes and acquires. One token wakes one
-- worker, so a burst does not wake every idle worker at once (acquire passes the token on).
-- A scheduled run (ARGV[4] names its schedule) is guarded in the same call, so each tick is
-- enqueued once however many brokers try: nothing is written when the schedule's last tick is
-- not older than this one; a schedule seen for the first time, or paused, only records the tick. A run-now (no tick) skips the guard and is recorded as the last run.
-- KEYS[1]     (set)    every queue name
-- KEYS[2]     (string) this minute's ingress counter of the queue
-- KEYS[3]     (list)   the queue's wake list
-- KEYS[4]     (hash)   schedule state: <name>:tick, <name>:task, <name>:enqueued_at, <name>:paused
-- KEYS[5]     (hash)   the queue's totals: enqueued, finished, failed
-- KEYS[2i+4]  (hash)   task i
-- KEYS[2i+5]  (zset)   task i's target segment: ready (score: priority, then FIFO) or deferred (run_after)
-- ARGV[1]     (string) queue name
-- ARGV[2]     (string) telemetry channel
-- ARGV[3]     (number) seconds the ingress counter lives
-- ARGV[4]     (string) the schedule this run belongs to, or "" for a plain enqueue
-- ARGV[5]     (number) the schedule's tick, epoch seconds, or "" for a run-now
-- ARGV[6]     (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- ARGV[5i+2]  (string) task i's id
-- ARGV[5i+3]  (string) task i's payload, stored exactly as given
-- ARGV[5i+4]  (string) task i's target segment name, "ready" or "deferred"
-- ARGV[5i+5]  (number) task i's ready score, kept in the hash so a deferred task can be promoted
-- ARGV[5i+6]  (number) task i's score in its target segment
-- Returns: the number of tasks stored (0 when a schedule's guard refused the run)
local n = (#ARGV - 6) / 5
local schedule, tick = ARGV[4], ARGV[5]
if schedule ~= '' then
  if tick ~= '' then
    local last = redis.call('HGET', KEYS[4], schedule .. ':tick')
    if last and tonumber(last) >= tonumber(tick) then
      return 0
    end
    -- The tick is taken even when nothing runs, so a paused schedule resumes at its next tick.
    redis.call('HSET', KEYS[4], schedule .. ':tick', tick)
    if not last or redis.call('HEXISTS', KEYS[4], schedule .. ':paused') == 1 then
      return 0
    end
  end
  local time = redis.call('TIME')
  redis.call('HSET', KEYS[4], schedule .. ':task', ARGV[7], schedule .. ':enqueued_at',
    string.format('%d.%06d', time[1], time[2]))
end
local ready = false
for i = 1, n do
  local a = 5 * i + 2
  redis.call('HSET', KEYS[2 * i + 4], 'data', ARGV[a + 1], 'queue', ARGV[1], 'segment', ARGV[a + 2],
    'score', ARGV[a + 3])
  redis.call('ZADD', KEYS[2 * i + 5], ARGV[a + 4], ARGV[a])
  ready = ready or ARGV[a + 2] == 'ready'
end
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('INCRBY', KEYS[2], n) == n then
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
redis.call('HINCRBY', KEYS[5], 'enqueued', n)
if ready and redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('LPUSH', KEYS[3], '1')
end
local publish = ARGV[6] == '1' and 'SPUBLISH' or 'PUBLISH'
redis.call(publish, ARGV[2], '{"type":"ingress","queue":' .. cjson.encode(ARGV[1]) .. ',"count":' .. n .. '}')
return n
