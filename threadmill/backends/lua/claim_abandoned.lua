#!lua flags=allow-oom
-- claim_abandoned (the broker's recovery): take over the leases of workers whose heartbeat stopped.
-- A worker is dead when its last heartbeat is older than worker_timeout by the server's clock, or,
-- with lease_ttl given, when it has no heartbeat at all and the lease started more than
-- worker_timeout ago: a worker sends its first heartbeat as it starts, so by then only a lost one
-- (or one that said goodbye while it still held leases) has none.
-- Each claimed task gets a new token and a short claim window, like claim_expired, so a second
-- broker cannot claim it too and a late acknowledgement from the lost worker is fenced out.
-- Dead workers whose heartbeat is older than forget_after are dropped from the workers set:
-- by then every lease they held has expired and belongs to the reaper.
-- Every claimed task becomes a suspect: its `worker_losses` counts the lost leases in a row in
-- which it may have run. A lease its worker recorded (`progress`, see record_progress) says
-- exactly: "started" counts, "leased" (never started) leaves the count, "finished" (its
-- acknowledgement lost) resets it. A lease without a record counts: its heartbeat may be stale.
-- KEYS[1] (zset)   workers by last heartbeat, server epoch seconds (unread when ARGV[7] is given)
-- KEYS[2] (zset)   running segment of one queue (score: lease deadline)
-- KEYS[3] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- ARGV[1] (number) worker_timeout, seconds
-- ARGV[2] (number) forget_after, seconds
-- ARGV[3] (number) the most tasks to claim
-- ARGV[4] (number) the most running entries to look at
-- ARGV[5] (number) claim window, seconds
-- ARGV[6] (string) fencing token base; each claim's token is base .. ':' .. i
-- ARGV[7] (string) optional: "" to read heartbeats from KEYS[1]; else "+" and every worker of that
--                  set as `name<TAB>heartbeat age` lines, read by the caller from partition 0 (a
--                  partition other than 0 does not hold the workers set)
-- ARGV[8] (number) optional: lease_ttl, seconds; without it a worker with no heartbeat is left alone.
--                  While no heartbeat is stale, only the leases whose deadline (start + lease_ttl)
--                  says they are older than worker_timeout are looked at.
-- Returns: {server_seconds, id1, data1 or false, lease_worker1, lease_started_at1, started_at1, token1,
--           heartbeat_age1, progress1 ("leased", "started", "finished", or "" without a record),
--           worker_losses1, id2, ...}; a worker with no heartbeat has the lease's age as its heartbeat age
-- include: silent
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local timeout = tonumber(ARGV[1])
local forget_after = tonumber(ARGV[2])
local given = ARGV[7] or ''
local lease_ttl = tonumber(ARGV[8] or '')
local out = {time[1]}
local any_stale = false
if given == '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - forget_after))
  any_stale = #redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - timeout), 'LIMIT', 0, 1) > 0
else
  for age in string.gmatch(given, '\t([^\n]+)') do
    age = tonumber(age)
    if age and age > timeout and age < forget_after then
      any_stale = true
      break
    end
  end
end
local scan = tonumber(ARGV[4])
local running
if any_stale then
  running = redis.call('ZRANGE', KEYS[2], 0, scan - 1)
elseif lease_ttl then
  -- Every heartbeat is fresh: only a worker with none can be dead, and only for a lease older than the timeout.
  running = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%.6f', now + lease_ttl - timeout),
    'LIMIT', 0, scan)
else
  return out
end
local age_of = heartbeat_ages(given, KEYS[1], now)

-- Seconds the lease's worker has been silent when it is dead, else nil.
local function dead_for(worker, lease_started_at)
  if not worker then
    return nil
  end
  local age = age_of(worker)
  if age then
    return (age > timeout and age < forget_after) and age or nil
  end
  local started = lease_ttl and tonumber(lease_started_at or '')
  return (started and started < now - timeout) and now - started or nil
end

local limit = tonumber(ARGV[3])
local claimed = 0
for _, id in ipairs(running) do
  if claimed >= limit then
    break
  end
  local key = KEYS[3] .. id
  -- The lease first: the payload is read (copied) only for a task that is claimed.
  local lease = redis.call('HMGET', key, 'lease_worker', 'lease_started_at')
  local age = dead_for(lease[1], lease[2])
  if age then
    local fields = redis.call('HMGET', key, 'data', 'lease_worker', 'lease_started_at', 'started_at', 'lease_token',
      'progress', 'worker_losses')
    claimed = claimed + 1
    local token = ARGV[6] .. ':' .. claimed
    local stage, losses = '', 0
    if fields[1] then
      local own = (fields[5] or '') .. ' '
      if fields[6] and string.sub(fields[6], 1, #own) == own then
        stage = string.sub(fields[6], #own + 1)
      end
      losses = tonumber(fields[7] or '0')
      if stage == 'finished' then
        losses = 0
      elseif stage ~= 'leased' then
        losses = losses + 1
      end
      redis.call('HSET', key, 'lease_token', token, 'worker_losses', losses)
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
    out[#out + 1] = stage
    out[#out + 1] = losses
  end
end
return out
