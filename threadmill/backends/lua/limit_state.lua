-- limit_state: read what a queue's limits hold back in one partition, for status and the console: its
-- runtime limits, its ready and running counts and, for a rate, the one lease time its next token waits
-- on. A rate of N keeps up to N lease times (up to 100,000); only the N-th newest decides, so only it is
-- read (the list is newest first, as acquire keeps it).
-- KEYS[1]    (hash) runtime limits: queue name -> "concurrency|rate count|rate period s" (an empty part
--            takes the setting's), and `<queue>:set` -> JSON {"by": who, "since": server epoch seconds}
-- KEYS[3q-1] (zset) queue q's ready segment
-- KEYS[3q]   (zset) queue q's running segment
-- KEYS[3q+1] (list) queue q's last lease times, newest first (server epoch seconds)
-- ARGV[1] (number) this partition's index p; ARGV[2] (number) the partition count P: a rate of N allows
--         this partition N // P, plus 1 when p < N % P (as acquire counts it)
-- ARGV[1+2q] (string) queue q's name
-- ARGV[2+2q] (string) queue q's rate count from the settings, "" for none
-- Returns: {server seconds, server microseconds, then for each queue: its runtime limits (false: none),
--          their audit JSON (false: none), its ready count, its running count, and the N-th newest lease
--          time, N this partition's share of the rate in force (false: no rate, or fewer than N kept)}
-- include: limits
local partition, partitions = tonumber(ARGV[1]), tonumber(ARGV[2])
local time = redis.call('TIME')
local out = {time[1], time[2]}
for q = 1, (#ARGV - 2) / 2 do
  local name, count = ARGV[1 + 2 * q], ARGV[2 + 2 * q]
  local stored = redis.call('HMGET', KEYS[1], name, name .. ':set')
  if stored[1] then
    local _, runtime = limit_parts(stored[1])
    if runtime and runtime ~= '' then
      count = runtime
    end
  end
  local lease_time = false
  if count ~= '' then
    local tokens = share(tonumber(count), partition, partitions)
    if tokens > 0 then
      lease_time = redis.call('LINDEX', KEYS[3 * q + 1], tokens - 1)
    end
  end
  out[#out + 1] = stored[1]
  out[#out + 1] = stored[2]
  out[#out + 1] = redis.call('ZCARD', KEYS[3 * q - 1])
  out[#out + 1] = redis.call('ZCARD', KEYS[3 * q])
  out[#out + 1] = lease_time
end
return out
