-- claim_abandoned (the broker's recovery): take over the leases of workers whose heartbeat stopped.
-- A worker is dead when its last heartbeat is older than worker_timeout by the server's clock.
-- Each claimed task gets a new token and a short claim window, like claim_expired, so a second
-- broker cannot claim it too and a late acknowledgement from the lost worker is fenced out.
-- Dead workers whose heartbeat is older than forget_after are dropped from the workers set:
-- by then every lease they held has expired and belongs to the reaper.
-- KEYS[1] (zset)   workers by last heartbeat, server epoch seconds (unread when ARGV[7] is given)
-- KEYS[2] (zset)   running segment of one queue (score: lease deadline)
-- KEYS[3] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- ARGV[1] (number) worker_timeout, seconds
-- ARGV[2] (number) forget_after, seconds
-- ARGV[3] (number) the most tasks to claim
-- ARGV[4] (number) the most running entries to look at
-- ARGV[5] (number) claim window, seconds
-- ARGV[6] (string) fencing token base; each claim's token is base .. ':' .. i
-- ARGV[7] (string) optional: "=" and the dead workers as `name<TAB>heartbeat age` lines, read by the
--                  caller from partition 0 (a partition other than 0 does not hold the workers set)
-- Returns: {server_seconds, id1, data1 or false, lease_worker1, lease_started_at1, started_at1, token1,
--           heartbeat_age1, id2, ...}
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local out = {time[1]}
local dead = {}
if ARGV[7] and ARGV[7] ~= '' then
  for name, age in string.gmatch(string.sub(ARGV[7], 2), '([^\t\n]+)\t([^\n]+)') do
    dead[name] = tonumber(age)
  end
else
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[2])))
  local dead_list = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[1])), 'WITHSCORES')
  for i = 1, #dead_list, 2 do
    dead[dead_list[i]] = now - tonumber(dead_list[i + 1])
  end
end
if next(dead) == nil then
  return out
end
local limit = tonumber(ARGV[3])
local running = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[4]) - 1)
local claimed = 0
for _, id in ipairs(running) do
  if claimed >= limit then
    break
  end
  local key = KEYS[3] .. id
  local fields = redis.call('HMGET', key, 'data', 'lease_worker', 'lease_started_at', 'started_at')
  local age = fields[2] and dead[fields[2]]
  if age then
    claimed = claimed + 1
    local token = ARGV[6] .. ':' .. claimed
    if fields[1] then
      redis.call('HSET', key, 'lease_token', token)
      redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), id)
    else
      redis.call('ZREM', KEYS[2], id)
    end
    out[#out + 1] = id
    out[#out + 1] = fields[1]
    out[#out + 1] = fields[2]
    out[#out + 1] = fields[3] or ''
    out[#out + 1] = fields[4] or ''
    out[#out + 1] = token
    out[#out + 1] = string.format('%.3f', age)
  end
end
return out
