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

-- Returns whether this server has been up fewer than `settle` seconds (INFO's uptime_in_seconds, whole
-- seconds, so the answer errs towards "not yet"). After a restart it restores every heartbeat as it was
-- before the outage, and a live worker needs that long to store its next one.
local function server_settling(settle)
  local uptime = string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')
  return uptime ~= nil and tonumber(uptime) < settle
end

-- `given` is as heartbeat_ages takes it, or "@" and a number of seconds S: read the workers zset, but count
-- no worker with a heartbeat as silent until this server has been up S seconds (its heartbeats may all be
-- from before a restart).
-- Returns a function (worker, lease_started_at) -> true when the worker is silent: its heartbeat
-- is older than the timeout, or it has none and the lease started more than the timeout ago (a
-- worker sends its first heartbeat as it starts, so by then only a lost one has none; a server
-- restores a live worker's heartbeat with its leases).
local function silent_check(given, workers_key, now, timeout)
  local settle = nil
  if string.sub(given, 1, 1) == '@' then
    settle, given = tonumber(string.sub(given, 2)), ''
  end
  local age_of = heartbeat_ages(given, workers_key, now)
  local settling = nil
  return function(worker, lease_started_at)
    if not worker then
      return false
    end
    local age = age_of(worker)
    if age then
      if age <= timeout then
        return false
      end
      if settling == nil then
        settling = settle ~= nil and server_settling(settle)
      end
      return not settling
    end
    local started = tonumber(lease_started_at or '')
    return started ~= nil and started < now - timeout
  end
end
