-- round_robin (included): which queue's task acquire leases next. One queue is served in one batch; several
-- take turns, one task each, so no queue starves the others of a call. A queue that is paused, at its
-- limit or out of ready tasks drops out of the turns. A marked queue leases through its look.
-- Needs queue_limits, included first.

-- Lease up to `want` tasks of queue index q; returns how many ids it took (a popped id whose hash is
-- gone counts).
local function lease_batch(queue, q, want, leases, looks)
  if queue.marked then
    local got, lease_next = 0, looks.lease_next
    while got < want and lease_next(q) do
      got = got + 1
    end
    return got
  end
  local popped = want > 0 and redis.call('ZPOPMIN', queue.ready, want) or {}
  for i = 1, #popped, 2 do
    leases.lease(popped[i], q)
  end
  return #popped / 2
end

-- Lease the next task of queue index q; returns whether it took one.
local function lease_next(queue, q, leases, looks)
  if queue.marked then
    return looks.lease_next(q)
  end
  local popped = redis.call('ZPOPMIN', queue.ready, 1)
  if #popped == 0 then
    return false
  end
  leases.lease(popped[1], q)
  return true
end

-- Lease up to `count` tasks of `queues` in turns; returns whether a queue may have ready tasks left that
-- it could lease (then the wake token passes on).
local function lease_round_robin(queues, count, leases, limits, looks)
  if #queues == 1 then
    local queue = queues[1]
    if queue.paused then
      return false
    end
    local room = limits.room[1]
    local want = room and math.min(count, room) or count
    return lease_batch(queue, 1, want, leases, looks) == count
  end
  local live, remaining = {}, 0
  for q, queue in ipairs(queues) do
    live[q] = not queue.paused and not at_limit(limits, q, leases.taken)
    if live[q] then
      remaining = remaining + 1
    end
  end
  while leases.count < count and remaining > 0 do
    for q, queue in ipairs(queues) do
      if live[q] and leases.count < count then
        if not lease_next(queue, q, leases, looks) or at_limit(limits, q, leases.taken) then
          live[q] = false
          remaining = remaining - 1
        end
      end
    end
  end
  return remaining > 0
end

-- Push a wake token for the first queue that is not paused or at its limit, has ready tasks and no
-- token, so one more idle worker wakes (a chain, not a herd). The wake list is read first: during a drain
-- a token nobody took is still there, and that ends it.
local function pass_the_token_on(queues, limits, taken)
  for q, queue in ipairs(queues) do
    if not queue.paused and not at_limit(limits, q, taken) and redis.call('LLEN', queue.wake) == 0
      and redis.call('ZCARD', queue.ready) > 0 then
      redis.call('LPUSH', queue.wake, '1')
      return
    end
  end
end
