-- acknowledge: store the outcome of leased tasks and release their leases, fenced per task.
-- A task whose lease_token no longer matches (its lease expired and it was leased again,
-- or it was requeued) is left untouched and reported as refused. Per queue it counts the
-- tasks out this minute (and the failed ones), for the console's history, and adds them to
-- the queue's totals, for metrics.
-- KEYS[3j-2] (string) this minute's egress counter of queue j (1 <= j <= m)
-- KEYS[3j-1] (string) this minute's failed counter of queue j
-- KEYS[3j]   (hash)   queue j's totals: enqueued, finished, failed
-- KEYS[3m+4i-3] (hash)   task i
-- KEYS[3m+4i-2] (string) task i's result document
-- KEYS[3m+4i-1] (zset)   task i's running segment
-- KEYS[3m+4i]   (zset)   task i's finished segment (successful or failed; score: finish time)
-- ARGV[1] (number) result time to live, seconds (also trims the finished segment)
-- ARGV[2] (number) seconds a per-minute counter lives
-- ARGV[3] (string) telemetry channel
-- ARGV[4] (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- ARGV[5] (number) m, the number of queues
-- ARGV[5+j] (string) queue j's name
-- ARGV[5+m+4i-3] (string) task i's lease token
-- ARGV[5+m+4i-2] (string) task i's finished document
-- ARGV[5+m+4i-1] (string) task i's finished segment name, "successful" or "failed"
-- ARGV[5+m+4i]   (number) task i's queue, j
-- Returns: {accepted_1, ..., accepted_n}, 1 where stored, 0 where the fence refused it
local ttl = tonumber(ARGV[1])
local m = tonumber(ARGV[5])
local publish = ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH'
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local accepted = {}
local trimmed = {}
local out = {}
local failed = {}
for j = 1, m do
  out[j], failed[j] = 0, 0
end
local n = (#KEYS - 3 * m) / 4
for i = 1, n do
  local k, a = 3 * m + 4 * i - 4, 5 + m + 4 * i - 4
  local task = KEYS[k + 1]
  if redis.call('HGET', task, 'lease_token') == ARGV[a + 1] then
    local id = string.match(task, ':task:(.+)$')
    redis.call('SET', KEYS[k + 2], ARGV[a + 2], 'EX', ttl)
    redis.call('HSET', task, 'segment', ARGV[a + 3])
    redis.call('HDEL', task, 'lease_worker', 'lease_token', 'lease_started_at')
    redis.call('EXPIRE', task, ttl)
    redis.call('ZREM', KEYS[k + 3], id)
    redis.call('ZADD', KEYS[k + 4], now, id)
    local j = tonumber(ARGV[a + 4])
    out[j] = out[j] + 1
    if ARGV[a + 3] == 'failed' then
      failed[j] = failed[j] + 1
    end
    trimmed[KEYS[k + 4]] = true
    accepted[i] = 1
  else
    accepted[i] = 0
  end
end
for finished in pairs(trimmed) do
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
    redis.call(publish, ARGV[3], '{"type":"egress","queue":' .. cjson.encode(ARGV[5 + j]) .. ',"count":' .. out[j] .. '}')
  end
end
return accepted
