-- enqueue: store new tasks of one queue and add each to its ready or deferred segment.
-- When a task becomes ready, one token is pushed onto the queue's wake list unless one is
-- there already: an idle worker blocked on that list wakes and acquires. One token wakes one
-- worker, so a burst does not wake every idle worker at once (acquire passes the token on).
-- KEYS[1]     (set)    every queue name
-- KEYS[2]     (string) this minute's ingress counter of the queue
-- KEYS[3]     (list)   the queue's wake list
-- KEYS[2i+2]  (hash)   task i
-- KEYS[2i+3]  (zset)   task i's target segment: ready (score: priority, then FIFO) or deferred (run_after)
-- ARGV[1]     (string) queue name
-- ARGV[2]     (string) telemetry channel
-- ARGV[3]     (number) seconds the ingress counter lives
-- ARGV[4]     (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- ARGV[5i]    (string) task i's id
-- ARGV[5i+1]  (string) task i's payload, stored exactly as given
-- ARGV[5i+2]  (string) task i's target segment name, "ready" or "deferred"
-- ARGV[5i+3]  (number) task i's ready score, kept in the hash so a deferred task can be promoted
-- ARGV[5i+4]  (number) task i's score in its target segment
-- Returns: the number of tasks stored
local n = (#ARGV - 4) / 5
local ready = false
for i = 1, n do
  local a = 5 * i
  redis.call('HSET', KEYS[2 * i + 2], 'data', ARGV[a + 1], 'queue', ARGV[1], 'segment', ARGV[a + 2],
    'score', ARGV[a + 3])
  redis.call('ZADD', KEYS[2 * i + 3], ARGV[a + 4], ARGV[a])
  ready = ready or ARGV[a + 2] == 'ready'
end
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('INCRBY', KEYS[2], n) == n then
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
if ready and redis.call('LLEN', KEYS[3]) == 0 then
  redis.call('LPUSH', KEYS[3], '1')
end
local publish = ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH'
redis.call(publish, ARGV[2], '{"type":"ingress","queue":' .. cjson.encode(ARGV[1]) .. ',"count":' .. n .. '}')
return n
