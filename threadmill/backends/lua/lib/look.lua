-- look (included): leasing past held heads. A queue marked as having held a task with a per-task limit is
-- read with a look instead of a pop: its first `look_limit` ready tasks in order (TASK_LIMIT_LOOK), each
-- task hash's `limit_path` read with its payload, a task whose path is at its limit left in place and
-- the ones behind it leased. The ready tasks are read in pages of the call's count (at least 16); ranks
-- stay put, as the leased ids leave the ready segment only at the end of the call.
-- Needs chunked, included first.

-- Returns the call's looks: `lease_next(q)` leases the next task of marked queue index q its path admits
-- (false when the look has none left), `record(held_key)` takes the leased ids out of the ready segments
-- and flags in hash `held_key` each queue a path's concurrency held back.
local function looks(queues, count, look_limit, task_prefix, leases, paths)
  local looked = {}  -- queue index -> {ids, at, taken, fetched, done}: its ready tasks read so far
  local lease, admits, took = leases.lease, paths.admits, paths.took  -- once, not once a task
  local function lease_next(q)
    local look = looked[q]
    if not look then
      look = {ids = {}, at = 0, taken = {}, fetched = 0, done = false}
      looked[q] = look
    end
    while true do
      if look.at >= #look.ids then
        if look.done or look.fetched >= look_limit then
          return false
        end
        local size = math.min(look_limit - look.fetched, math.max(count, 16))
        local page = redis.call('ZRANGE', queues[q].ready, look.fetched, look.fetched + size - 1)
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
      local fields = redis.call('HMGET', task_prefix .. id, 'data', 'started_at', 'worker_losses', 'limit_path')
      local path = fields[4]
      if not fields[1] then
        look.taken[#look.taken + 1] = id  -- no hash: dropped, as a pop would
      elseif not path or admits(path, q) then
        look.taken[#look.taken + 1] = id
        lease(id, q, fields)
        if path then
          took(path, id)
        end
        return true
      end
    end
  end

  local function record(held_key)
    for q, look in pairs(looked) do
      call_chunked('ZREM', queues[q].ready, look.taken)
      if paths.held[q] then
        redis.call('HSET', held_key, queues[q].name, '1')
      end
    end
  end

  return {lease_next = lease_next, record = record}
end
