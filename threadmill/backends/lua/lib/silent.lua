-- silent (included): whether a lease's worker is silent (its heartbeat older than the timeout).

-- `given` is "" to read heartbeats from the workers zset `workers_key`, else "=" and the silent
-- workers' names one a line (a partition other than 0, whose slot does not hold that set).
-- Returns a function worker -> true when silent; a worker with no heartbeat is not silent.
local function silent_check(given, workers_key, now, timeout)
  if given ~= '' then
    local names = {}
    for name in string.gmatch(string.sub(given, 2), '[^\n]+') do
      names[name] = true
    end
    return function(worker)
      return worker and names[worker] or false
    end
  end
  return function(worker)
    local beat = worker and redis.call('ZSCORE', workers_key, worker)
    return beat and tonumber(beat) < now - timeout or false
  end
end
