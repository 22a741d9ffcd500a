#!lua flags=allow-oom
-- heartbeat: record that a worker process is alive (by the server's clock) and publish its snapshot.
-- A worker whose heartbeat grows older than worker_timeout is dead to the broker, which then
-- recovers its leases. A goodbye (empty document) removes the worker: it handed everything back.
-- KEYS[1] (zset)   workers by last heartbeat, server epoch seconds
-- KEYS[2] (string) this worker's last heartbeat document
-- ARGV[1] (string) the worker's name, host:pid:incarnation (an older release's: host:pid)
-- ARGV[2] (string) the heartbeat document (JSON), or "" to say goodbye
-- ARGV[3] (number) seconds the document outlives the heartbeat
-- ARGV[4] (string) telemetry channel the document is also published on, or "" for none
-- ARGV[5] (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- Returns: the server's time, epoch seconds, as a string
local time = redis.call('TIME')
local now = string.format('%d.%06d', time[1], time[2])
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
  return now
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', math.ceil(tonumber(ARGV[3])))
if ARGV[4] ~= '' then
  redis.call(ARGV[5] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[4], ARGV[2])
end
return now
