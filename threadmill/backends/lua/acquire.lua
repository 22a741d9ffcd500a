-- acquire: pop up to `count` ready tasks round-robin across queues and lease them.
-- The payload is read, never decoded or rewritten: the lease is stored beside it.
-- KEYS[1..n]    (zset) ready segments, in this call's rotation order
-- KEYS[n+1..2n] (zset) the matching running segments (score: lease deadline)
-- KEYS[2n+1]    (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2n+2..3n+1] (list) the matching wake lists: when a full batch leaves tasks behind, a
--               token is passed on so one more idle worker wakes (a chain, not a herd)
-- KEYS[3n+2]    (hash)   paused queues: a paused queue is skipped in this same call
-- ARGV[1] (number) n, the number of queues
-- ARGV[2] (number) count, the most tasks to lease
-- ARGV[3] (string) worker holding the lease
-- ARGV[4] (number) lease time to live, seconds
-- ARGV[5] (string) fencing token base; each lease's token is base .. ':' .. i, unique per lease
-- ARGV[6..5+n] (string) the queue names, in KEYS order
-- The running segments are written once per queue a call (one ZADD of every lease), not once
-- per task: each command a script runs costs the server bridging on top of its own work.
-- A suspect (a task that was in a lost worker's lease: its hash has `worker_losses`) is leased
-- with `progress` "<token> leased": its worker records its start and finish (record_progress),
-- so recovery blames a later loss exactly. Any other task costs one more HMGET field, nothing else.
-- Returns: {server_seconds, server_microseconds, id1, data1, started_at1, token1, queue_index1,
--           worker_losses1 (false unless a suspect), id2, ...}
local n = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local worker = ARGV[3]
local ttl = tonumber(ARGV[4])
local base = ARGV[5]
local prefix = KEYS[2 * n + 1]
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local now_text = string.format('%.6f', now)
local deadline = now + ttl
local out = {time[1], time[2]}
local leased = 0
local deadline_text = string.format('%.6f', deadline)
local running = {}  -- queue index -> {deadline, id, deadline, id, ...}

local function lease(id, q)
  local key = prefix .. id
  local fields = redis.call('HMGET', key, 'data', 'started_at', 'worker_losses')
  if not fields[1] then
    return
  end
  leased = leased + 1
  local token = base .. ':' .. leased
  local started = fields[2]
  if not started then
    started = now_text
    redis.call('HSET', key, 'segment', 'running', 'lease_worker', worker, 'lease_started_at', now_text,
      'lease_token', token, 'started_at', started)
  else
    redis.call('HSET', key, 'segment', 'running', 'lease_worker', worker, 'lease_started_at', now_text,
      'lease_token', token)
  end
  if fields[3] then
    redis.call('HSET', key, 'progress', token .. ' leased')
  end
  local leases = running[q]
  if not leases then
    leases = {}
    running[q] = leases
  end
  leases[#leases + 1] = deadline_text
  leases[#leases + 1] = id
  out[#out + 1] = id
  out[#out + 1] = fields[1]
  out[#out + 1] = started
  out[#out + 1] = token
  out[#out + 1] = q
  out[#out + 1] = fields[3]
end

-- unpack() puts every element on Lua's stack, which is bounded: long lists go in chunks.
local CHUNK = 500
local function record_leases()
  for q, leases in pairs(running) do
    for first = 1, #leases, CHUNK do
      redis.call('ZADD', KEYS[n + q], unpack(leases, first, math.min(first + CHUNK - 1, #leases)))
    end
  end
end

local paused = redis.call('HMGET', KEYS[3 * n + 2], unpack(ARGV, 6, 5 + n))

local function pass_the_token_on()
  for q = 1, n do
    -- The wake list first: during a drain a token nobody took is still there, and that ends it.
    local wake = KEYS[2 * n + 1 + q]
    if not paused[q] and redis.call('LLEN', wake) == 0 and redis.call('ZCARD', KEYS[q]) > 0 then
      redis.call('LPUSH', wake, '1')
      return
    end
  end
end

if n == 1 then
  if paused[1] then
    return out
  end
  local popped = redis.call('ZPOPMIN', KEYS[1], count)
  for i = 1, #popped, 2 do
    lease(popped[i], 1)
  end
  record_leases()
  if #popped == 2 * count then
    pass_the_token_on()
  end
  return out
end

local live = {}
local remaining = 0
for q = 1, n do
  live[q] = not paused[q]
  if live[q] then
    remaining = remaining + 1
  end
end
while leased < count and remaining > 0 do
  for q = 1, n do
    if live[q] and leased < count then
      local popped = redis.call('ZPOPMIN', KEYS[q], 1)
      if #popped == 0 then
        live[q] = false
        remaining = remaining - 1
      else
        lease(popped[1], q)
      end
    end
  end
end
record_leases()
if remaining > 0 then
  pass_the_token_on()
end
return out
