-- queue_limits (included): a queue's concurrency and rate limits in one acquire call. Its concurrency
-- counts its running segment (every lease); its rate admits at most N leases in any window of one period,
-- by the lease times kept. A limited queue leases at most its room, so it never starves the other queues.
-- Needs limits and rate_tokens, included first.

-- Returns the limits of `queues` (each {paused, setting, running, lease_times}) with `runtime` (each
-- queue's stored runtime limits, false: none) on top: `room[q]` how many queue q may lease now (nil: no
-- limit), `concurrency[q]` its room under concurrency, `rate[q]` = {tokens share, period} its rate.
local function queue_limits(queues, runtime, partition, partitions, now)
  local limits = {room = {}, concurrency = {}, rate = {}}
  for q, queue in ipairs(queues) do
    local stored = runtime[q]
    if not queue.paused and (queue.setting ~= '||' or stored) then
      local c, r, p = limit_overlay(queue.setting, stored)
      if c ~= '' then
        local room = math.max(0, share(tonumber(c), partition, partitions) - redis.call('ZCARD', queue.running))
        limits.concurrency[q] = room
        limits.room[q] = room
      end
      if r ~= '' then
        local tokens, period = share(tonumber(r), partition, partitions), tonumber(p)
        limits.rate[q] = {tokens, period}
        local left = tokens - live_times(queue.lease_times, now - period)
        if not limits.room[q] or left < limits.room[q] then
          limits.room[q] = left
        end
      end
    end
  end
  return limits
end

-- Whether queue q has leased all its room (`taken`: leases per queue index).
local function at_limit(limits, q, taken)
  local room = limits.room[q]
  return room ~= nil and (taken[q] or 0) >= room
end

-- After leasing: spend each rate's tokens, and flag in hash `held_key` each queue that still has ready
-- tasks its concurrency holds back (acknowledge wakes an idle worker for it when it frees a slot).
-- Returns nil when no limit held ready tasks back, -1 when only concurrency did, else the seconds until
-- the first of their rate tokens comes back.
local function record_queue_limits(limits, queues, taken, held_key, now_text, now)
  local wait = nil
  for q, left in pairs(limits.room) do
    local queue, rate, took = queues[q], limits.rate[q], taken[q] or 0
    if rate and took > 0 then
      spend_tokens(queue.lease_times, took, now_text, rate[1], rate[2])
    end
    if took >= left and redis.call('ZCARD', queue.ready) > 0 then
      local concurrency = limits.concurrency[q]
      if concurrency and took >= concurrency then
        redis.call('HSET', held_key, queue.name, '1')
        wait = wait or -1
      end
      local next_in = rate and next_token_in(queue.lease_times, rate[1], rate[2], now)
      if next_in and (not wait or wait < 0 or next_in < wait) then
        wait = next_in
      end
    end
  end
  return wait
end

-- acquire's `held` reply from the queues' wait and the task paths' (each nil, -1 or seconds, as
-- record_queue_limits returns it; `path_held`: a per-task concurrency limit held tasks back): "" none
-- held, "-1" only concurrency did, else the seconds until the soonest rate token comes back.
local function held_reply(wait, path_wait, path_held)
  if path_wait and (not wait or wait < 0 or path_wait < wait) then
    wait = path_wait
  elseif not wait and path_held then
    wait = -1
  end
  return wait and (wait < 0 and '-1' or string.format('%.3f', wait)) or ''
end
