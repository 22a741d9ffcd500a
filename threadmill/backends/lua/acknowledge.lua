-- acknowledge: store the outcome of leased tasks and release their leases, fenced per task.
-- A task whose lease_token no longer matches (its lease expired and it was leased again,
-- or it was requeued) is left untouched and reported as refused.
-- KEYS[5i-4] (hash)   task i
-- KEYS[5i-3] (string) task i's result document
-- KEYS[5i-2] (zset)   task i's running segment
-- KEYS[5i-1] (zset)   task i's finished segment (successful or failed; score: finish time)
-- KEYS[5i]   (string) this minute's egress counter of task i's queue
-- ARGV[1] (number) result time to live, seconds (also trims the finished segment)
-- ARGV[2] (number) seconds an egress counter lives
-- ARGV[3] (string) telemetry channel
-- ARGV[4] (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- ARGV[4i+1] (string) task i's lease token
-- ARGV[4i+2] (string) task i's finished document
-- ARGV[4i+3] (string) task i's finished segment name, "successful" or "failed"
-- ARGV[4i+4] (string) task i's queue name
-- Returns: {accepted_1, ..., accepted_n}, 1 where stored, 0 where the fence refused it
local ttl = tonumber(ARGV[1])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local accepted = {}
local trimmed = {}
local egress = {}
local publish = ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH'
local n = #KEYS / 5
for i = 1, n do
  local task = KEYS[5 * i - 4]
  local token = ARGV[4 * i + 1]
  if redis.call('HGET', task, 'lease_token') == token then
    local id = string.match(task, ':task:(.+)$')
    redis.call('SET', KEYS[5 * i - 3], ARGV[4 * i + 2], 'EX', ttl)
    redis.call('HSET', task, 'segment', ARGV[4 * i + 3])
    redis.call('HDEL', task, 'lease_worker', 'lease_token', 'lease_started_at')
    redis.call('EXPIRE', task, ttl)
    redis.call('ZREM', KEYS[5 * i - 2], id)
    redis.call('ZADD', KEYS[5 * i - 1], now, id)
    local queue = ARGV[4 * i + 4]
    if not egress[queue] then
      egress[queue] = {KEYS[5 * i], 0}
    end
    egress[queue][2] = egress[queue][2] + 1
    trimmed[KEYS[5 * i - 1]] = true
    accepted[i] = 1
  else
    accepted[i] = 0
  end
end
for finished in pairs(trimmed) do
  redis.call('ZREMRANGEBYSCORE', finished, '-inf', '(' .. (now - ttl))
end
for queue, entry in pairs(egress) do
  if redis.call('INCRBY', entry[1], entry[2]) == entry[2] then
    redis.call('EXPIRE', entry[1], ARGV[2])
  end
  redis.call(publish, ARGV[3], '{"type":"egress","queue":' .. cjson.encode(queue) .. ',"count":' .. entry[2] .. '}')
end
return accepted
