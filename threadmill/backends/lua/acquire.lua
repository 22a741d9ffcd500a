-- acquire: pop up to `count` ready tasks round-robin across queues and lease them.
-- The payload is read, never decoded or rewritten: the lease is stored beside it.
-- KEYS[1..n]    (zset) ready segments, in this call's rotation order
-- KEYS[n+1..2n] (zset) the matching running segments (score: lease deadline)
-- KEYS[2n+1]    (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2n+2..3n+1] (list) the matching wake lists: when a full batch leaves tasks behind, a
--               token is passed on so one more idle worker wakes (a chain, not a herd)
-- KEYS[3n+2]    (hash)   paused queues: a paused queue is skipped in this same call
-- KEYS[3n+3]    (hash)   runtime limits: queue name -> "concurrency|rate count|rate period s", an empty
--               part taking the setting's (ARGV)
-- KEYS[3n+4]    (hash)   queues held back at their concurrency limit with tasks ready (acknowledge wakes
--               an idle worker for them when it frees a slot, and clears the flag)
-- KEYS[3n+4+q]  (list)   queue q's last lease times, newest first: its rate's tokens (limits.py)
-- KEYS[4n+5]    (hash)   queues that have held a task with a per-task limit (enqueue marks them)
-- KEYS[4n+6]    (hash)   per-task limits: task path -> "concurrency|rate count|rate period s"
-- KEYS[4n+7]    (prefix) a limited path's keys: prefix .. path .. ':running' (set of the ids leased under its
--               concurrency; a member whose hash is no longer running is dropped when the limit binds) and
--               prefix .. path .. ':lease-times' (its rate's tokens, as a queue's)
-- ARGV[1] (number) n, the number of queues
-- ARGV[2] (number) count, the most tasks to lease
-- ARGV[3] (string) worker holding the lease
-- ARGV[4] (number) lease time to live, seconds
-- ARGV[5] (string) fencing token base; each lease's token is base .. ':' .. i, unique per lease
-- ARGV[6..5+n] (string) the queue names, in KEYS order
-- ARGV[6+n..5+2n] (string) each queue's limits from the settings, "concurrency|rate count|rate period s"
-- ARGV[6+2n] (number) this partition's index p; ARGV[7+2n] (number) the partition count P: a limit N
--               allows this partition N // P, plus 1 when p < N % P
-- ARGV[8+2n] (number) how many ready tasks to look at past the head of a marked queue (TASK_LIMIT_LOOK)
-- A queue's concurrency counts its running segment (every lease); its rate admits at most N leases in
-- any window of one period, by the lease times kept (at most N: a bucket of N tokens, each coming back
-- one period after it was spent). A limited queue leases at most its room, so it never starves the
-- other queues of the call.
-- A queue marked in KEYS[4n+5] is read with a look instead of a pop: its first ARGV[8+2n] ready tasks in
-- order, each task hash's `limit_path` read with its payload, a task whose path is at its limit left in
-- place and the ones behind it leased. Unmarked queues pay one HMGET for the marks, nothing else.
-- The running segments are written once per queue a call (one ZADD of every lease), not once
-- per task: each command a script runs costs the server bridging on top of its own work.
-- A suspect (a task that was in a lost worker's lease: its hash has `worker_losses`) is leased
-- with `progress` "<token> leased": its worker records its start and finish (record_progress),
-- so recovery blames a later loss exactly. Any other task costs one more HMGET field, nothing else.
-- Returns: {server_seconds, server_microseconds, id1, data1, started_at1, token1, queue_index1,
--           worker_losses1 (false unless a suspect), id2, ..., held}; held is "" when no queue has ready tasks
--           a limit held back, "-1" when only concurrency did (a freed slot wakes a waiter), else the
--           seconds until the first of their rate tokens comes back
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
local taken = {}  -- queue index -> leases this call
local held = ''
local deadline_text = string.format('%.6f', deadline)
local running = {}  -- queue index -> {deadline, id, deadline, id, ...}

local function lease(id, q, fields)
  local key = prefix .. id
  fields = fields or redis.call('HMGET', key, 'data', 'started_at', 'worker_losses')
  if not fields[1] then
    return
  end
  leased = leased + 1
  taken[q] = (taken[q] or 0) + 1
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

-- Limits: room[q] is how many queue q may lease now (nil: no limit); concurrency_room[q] and
-- rate_of[q] = {tokens share, period} say which limit it was.
local partition, partitions = tonumber(ARGV[6 + 2 * n]), tonumber(ARGV[7 + 2 * n])
local runtime = redis.call('HMGET', KEYS[3 * n + 3], unpack(ARGV, 6, 5 + n))
local room, concurrency_room, rate_of = {}, {}, {}

local function share(total)
  local whole = math.floor(total / partitions)
  return partition < total - whole * partitions and whole + 1 or whole
end

-- The number of lease times in `list` (newest first) after `cutoff`: a binary search, then the older
-- ones are dropped (they never count again).
local function live_times(list, cutoff)
  local length = redis.call('LLEN', list)
  if length == 0 or tonumber(redis.call('LINDEX', list, 0)) <= cutoff then
    return 0
  end
  if tonumber(redis.call('LINDEX', list, -1)) > cutoff then
    return length
  end
  local lo, hi = 1, length - 1  -- the first index at or before the cutoff lies in [lo, hi]
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if tonumber(redis.call('LINDEX', list, mid)) > cutoff then
      lo = mid + 1
    else
      hi = mid
    end
  end
  redis.call('LTRIM', list, 0, lo - 1)
  return lo
end

for q = 1, n do
  local setting, stored = ARGV[5 + n + q], runtime[q]
  if not paused[q] and (setting ~= '||' or stored) then
    local c, r, p = string.match(setting, '^([^|]*)|([^|]*)|([^|]*)$')
    if stored then
      local sc, sr, sp = string.match(stored, '^([^|]*)|([^|]*)|([^|]*)$')
      if sc ~= '' then c = sc end
      if sr ~= '' then r, p = sr, sp end
    end
    if c ~= '' then
      concurrency_room[q] = math.max(0, share(tonumber(c)) - redis.call('ZCARD', KEYS[n + q]))
      room[q] = concurrency_room[q]
    end
    if r ~= '' then
      local tokens, period = share(tonumber(r)), tonumber(p)
      rate_of[q] = {tokens, period}
      local left = tokens - live_times(KEYS[3 * n + 4 + q], now - period)
      if not room[q] or left < room[q] then
        room[q] = left
      end
    end
  end
end

local function full(q)
  return room[q] ~= nil and (taken[q] or 0) >= room[q]
end

-- Per-task limits, read for the paths this call meets: paths[path] = {limit, count, running key, checked,
-- rate = {tokens, period}, left, spent, times key}. A path's running set may hold ids that stopped running
-- (acknowledge and recovery do not touch it): they are dropped the first time the limit binds in a call,
-- so the count it decides on is exact and costs one read per member only then.
local marked = redis.call('HMGET', KEYS[4 * n + 5], unpack(ARGV, 6, 5 + n))
local task_limit_prefix = KEYS[4 * n + 7]
local look_limit = tonumber(ARGV[8 + 2 * n])
local paths = {}
local path_held = {}  -- queue index -> true: a per-task concurrency limit left some of its ready tasks
local path_rate_held = false

local function path_limit(path)
  local state = paths[path]
  if state then
    return state
  end
  state = {spent = 0}
  paths[path] = state
  local spec = redis.call('HGET', KEYS[4 * n + 6], path)
  if not spec then
    return state
  end
  local c, r, p = string.match(spec, '^([^|]*)|([^|]*)|([^|]*)$')
  if c and c ~= '' then
    state.limit = share(tonumber(c))
    state.leased = {}
    state.running = task_limit_prefix .. path .. ':running'
    state.count = redis.call('SCARD', state.running)
  end
  if r and r ~= '' then
    local tokens, period = share(tonumber(r)), tonumber(p)
    state.rate = {tokens, period}
    state.times = task_limit_prefix .. path .. ':lease-times'
    state.left = tokens - live_times(state.times, now - period)
  end
  return state
end

local function recount(state)
  state.checked = true
  local live, mine = 0, {}
  for _, id in ipairs(state.leased) do
    mine[id] = true
  end
  local gone = {}
  for _, id in ipairs(redis.call('SMEMBERS', state.running)) do
    if mine[id] then
      -- A recovered task this call leased again: counted once, below.
    elseif redis.call('HGET', prefix .. id, 'segment') == 'running' then
      live = live + 1
    else
      gone[#gone + 1] = id
    end
  end
  for first = 1, #gone, CHUNK do
    redis.call('SREM', state.running, unpack(gone, first, math.min(first + CHUNK - 1, #gone)))
  end
  state.count = live + #state.leased  -- this call's leases join the set at its end
end

local function path_admits(path, q)
  local state = path_limit(path)
  if state.limit and state.count >= state.limit and not state.checked then
    recount(state)
  end
  if state.limit and state.count >= state.limit then
    path_held[q] = true
    return false
  end
  if state.rate and state.spent >= state.left then
    state.rate_held = true
    path_rate_held = true
    return false
  end
  return true
end

local function path_took(path, id)
  local state = paths[path]
  if state.limit then
    state.leased[#state.leased + 1] = id
    state.count = state.count + 1
  end
  if state.rate then
    state.spent = state.spent + 1
  end
end

-- looks[q] = {ids, at, taken, fetched, done}: the ready tasks of marked queue q read so far this call, in
-- pages of the call's count (at least 16), up to look_limit. Ranks stay put: the leased ids leave the
-- ready segment only at the end of the call.
local looks = {}

-- Lease the next task of marked queue q its path admits; false when the look has none left.
local function lease_looking(q)
  local look = looks[q]
  if not look then
    look = {ids = {}, at = 0, taken = {}, fetched = 0, done = false}
    looks[q] = look
  end
  while true do
    if look.at >= #look.ids then
      if look.done or look.fetched >= look_limit then
        return false
      end
      local size = math.min(look_limit - look.fetched, math.max(count, 16))
      local page = redis.call('ZRANGE', KEYS[q], look.fetched, look.fetched + size - 1)
      look.fetched = look.fetched + #page
      look.done = #page < size
      for _, id in ipairs(page) do
        look.ids[#look.ids + 1] = id
      end
      if #page == 0 then
        return false
      end
    end
    look.at = look.at + 1
    local id = look.ids[look.at]
    local fields = redis.call('HMGET', prefix .. id, 'data', 'started_at', 'worker_losses', 'limit_path')
    local path = fields[4]
    if not fields[1] then
      look.taken[#look.taken + 1] = id  -- no hash: dropped, as a pop would
    elseif not path or path_admits(path, q) then
      look.taken[#look.taken + 1] = id
      lease(id, q, fields)
      if path then
        path_took(path, id)
      end
      return true
    end
  end
end

-- After leasing: take the leased ids out of the marked queues, spend the paths' rate tokens; returns the
-- seconds until the first token of a rate-held path comes back, or nil.
local function record_task_limits()
  for q, look in pairs(looks) do
    for first = 1, #look.taken, CHUNK do
      redis.call('ZREM', KEYS[q], unpack(look.taken, first, math.min(first + CHUNK - 1, #look.taken)))
    end
    if path_held[q] then
      redis.call('HSET', KEYS[3 * n + 4], ARGV[5 + q], '1')
    end
  end
  local wait = nil
  for _, state in pairs(paths) do
    local leased = state.leased
    if leased and #leased > 0 then
      for first = 1, #leased, CHUNK do
        redis.call('SADD', state.running, unpack(leased, first, math.min(first + CHUNK - 1, #leased)))
      end
    end
    local rate = state.rate
    if rate and state.spent > 0 then
      local times = {}
      for i = 1, state.spent do
        times[i] = now_text
      end
      for first = 1, #times, CHUNK do
        redis.call('LPUSH', state.times, unpack(times, first, math.min(first + CHUNK - 1, #times)))
      end
      redis.call('LTRIM', state.times, 0, rate[1] - 1)
      redis.call('PEXPIRE', state.times, math.ceil(rate[2] * 1000))
    end
    if state.rate_held and redis.call('LLEN', state.times) >= rate[1] then
      local oldest = tonumber(redis.call('LINDEX', state.times, rate[1] - 1))
      local next_in = math.max(0.001, oldest + rate[2] - now)
      if not wait or next_in < wait then
        wait = next_in
      end
    end
  end
  return wait
end

-- After leasing: note each limited queue that still has ready tasks it may not lease, spend its rate tokens.
local function record_limits()
  local wait = nil
  for q, left in pairs(room) do
    local rate = rate_of[q]
    if rate and (taken[q] or 0) > 0 then
      local list, times = KEYS[3 * n + 4 + q], {}
      for i = 1, taken[q] do
        times[i] = now_text
      end
      for first = 1, #times, 500 do
        redis.call('LPUSH', list, unpack(times, first, math.min(first + 499, #times)))
      end
      redis.call('LTRIM', list, 0, rate[1] - 1)
      redis.call('PEXPIRE', list, math.ceil(rate[2] * 1000))
    end
    if (taken[q] or 0) >= left and redis.call('ZCARD', KEYS[q]) > 0 then
      if concurrency_room[q] and (taken[q] or 0) >= concurrency_room[q] then
        redis.call('HSET', KEYS[3 * n + 4], ARGV[5 + q], '1')
        wait = wait or -1
      end
      if rate and redis.call('LLEN', KEYS[3 * n + 4 + q]) >= rate[1] then
        local oldest = tonumber(redis.call('LINDEX', KEYS[3 * n + 4 + q], rate[1] - 1))
        local next_in = math.max(0.001, oldest + rate[2] - now)
        if not wait or wait < 0 or next_in < wait then
          wait = next_in
        end
      end
    end
  end
  local path_wait = record_task_limits()
  if path_wait and (not wait or wait < 0 or path_wait < wait) then
    wait = path_wait
  elseif not wait and next(path_held) then
    wait = -1
  end
  held = wait and (wait < 0 and '-1' or string.format('%.3f', wait)) or ''
end

local function pass_the_token_on()
  for q = 1, n do
    -- The wake list first: during a drain a token nobody took is still there, and that ends it.
    local wake = KEYS[2 * n + 1 + q]
    if not paused[q] and not full(q) and redis.call('LLEN', wake) == 0 and redis.call('ZCARD', KEYS[q]) > 0 then
      redis.call('LPUSH', wake, '1')
      return
    end
  end
end

if n == 1 then
  if paused[1] then
    out[#out + 1] = held
    return out
  end
  local want = room[1] and math.min(count, room[1]) or count
  local got
  if marked[1] then
    got = 0
    while got < want and lease_looking(1) do
      got = got + 1
    end
  else
    local popped = want > 0 and redis.call('ZPOPMIN', KEYS[1], want) or {}
    for i = 1, #popped, 2 do
      lease(popped[i], 1)
    end
    got = #popped / 2
  end
  record_leases()
  record_limits()
  if got == count then
    pass_the_token_on()
  end
  out[#out + 1] = held
  return out
end

local live = {}
local remaining = 0
for q = 1, n do
  live[q] = not paused[q] and not full(q)
  if live[q] then
    remaining = remaining + 1
  end
end
while leased < count and remaining > 0 do
  for q = 1, n do
    if live[q] and leased < count then
      local got
      if marked[q] then
        got = lease_looking(q)
      else
        local popped = redis.call('ZPOPMIN', KEYS[q], 1)
        got = #popped > 0
        if got then
          lease(popped[1], q)
        end
      end
      if not got or full(q) then
        live[q] = false
        remaining = remaining - 1
      end
    end
  end
end
record_leases()
record_limits()
if remaining > 0 then
  pass_the_token_on()
end
out[#out + 1] = held
return out
