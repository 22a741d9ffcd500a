#!lua flags=allow-oom
-- claim_expired (the reaper's claim): take over leases whose deadline has passed.
-- Each claimed task gets a new token and a short claim window, so a second reaper
-- running at once cannot claim it too, and a late acknowledgement is fenced out.
-- KEYS[1] (zset)   running segment (score: lease deadline)
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- ARGV[1] (number) the most tasks to claim
-- ARGV[2] (number) claim window, seconds
-- ARGV[3] (string) fencing token base; each claim's token is base .. ':' .. i
-- Returns: {id1, data1 or false, lease_worker1, lease_started_at1, started_at1, token1, id2, ...}
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for i, id in ipairs(expired) do
  local key = KEYS[2] .. id
  local token = ARGV[3] .. ':' .. i
  local fields = redis.call('HMGET', key, 'data', 'lease_worker', 'lease_started_at', 'started_at')
  if fields[1] then
    redis.call('HSET', key, 'lease_token', token)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
  else
    redis.call('ZREM', KEYS[1], id)
  end
  out[#out + 1] = id
  out[#out + 1] = fields[1]
  out[#out + 1] = fields[2] or ''
  out[#out + 1] = fields[3] or ''
  out[#out + 1] = fields[4] or ''
  out[#out + 1] = token
end
return out
