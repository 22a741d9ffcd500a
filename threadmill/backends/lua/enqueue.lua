-- enqueue: store a new task and add it to its queue's ready or deferred segment.
-- KEYS[1] (hash)   the task
-- KEYS[2] (zset)   the target segment: ready (score: priority, then FIFO) or deferred (run_after)
-- KEYS[3] (set)    every queue name
-- KEYS[4] (string) this minute's ingress counter of the queue
-- ARGV[1] (string) task id
-- ARGV[2] (string) the payload, stored exactly as given
-- ARGV[3] (string) queue name
-- ARGV[4] (string) target segment name, "ready" or "deferred"
-- ARGV[5] (number) ready score, kept in the hash so a deferred task can be promoted
-- ARGV[6] (number) score in the target segment
-- ARGV[7] (string) telemetry channel
-- ARGV[8] (number) seconds the ingress counter lives
-- Returns: 1
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'queue', ARGV[3], 'segment', ARGV[4], 'score', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[6], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[3])
if redis.call('INCR', KEYS[4]) == 1 then
  redis.call('EXPIRE', KEYS[4], ARGV[8])
end
redis.call('PUBLISH', ARGV[7], '{"type":"ingress","queue":' .. cjson.encode(ARGV[3]) .. ',"count":1}')
return 1
