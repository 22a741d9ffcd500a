-- silent (included): heartbeat ages, and whether a lease's worker is silent.

-- `given` is "" to read heartbeats from the workers zset `workers_key`, else "+" and every worker of
-- that set as `name<TAB>heartbeat age` lines, read by the caller from partition 0 (a partition
-- other than 0, whose slot does not hold that set).
-- Returns a function worker -> seconds since its last heartbeat, or nil when it has none.
local function heartbeat_ages(given, workers_key, now)
  local ages = {}
  if given ~= '' then
    for name, age in string.gmatch(string.sub(given, 2), '([^\t\n]+)\t([^\n]+)') do
      ages[name] = tonumber(age)
    end
    return function(worker)
      return worker and ages[worker] or nil
    end
  end
  return function(worker)
    if not worker then
      return nil
    end
    if ages[worker] == nil then
      local beat = redis.call('ZSCORE', workers_key, worker)
      ages[worker] = beat and now - tonumber(beat) or false
    end
    return ages[worker] or nil
  end
end

-- Returns a function (worker, lease_started_at) -> true when the worker is silent: its heartbeat
-- is older than the timeout, or it has none and the lease started more than the timeout ago (a
-- worker sends its first heartbeat as it starts, so by then only a lost one has none).
local function silent_check(given, workers_key, now, timeout)
  local age_of = heartbeat_ages(given, workers_key, now)
  return function(worker, lease_started_at)
    if not worker then
      return false
    end
    local age = age_of(worker)
    if age then
      return age > timeout
    end
    local started = tonumber(lease_started_at or '')
    return started ~= nil and started < now - timeout
  end
end
