-- task_limits (included): per-task limits (`@task(concurrency=, rate=)`) in one acquire call, read for the
-- task paths the call meets. A path's running set may hold ids that stopped running (acknowledge and
-- recovery do not touch it): they are dropped the first time the limit binds in a call, so the count it
-- decides on is exact and costs one read per member only then.
-- Needs chunked, limits and rate_tokens, included first.

-- Returns the call's per-task limits over hash `specs_key` (task path -> limit text) and the paths' keys
-- `limit_prefix .. path .. ':running'` (set) and `... ':lease-times'` (list): `admits(path, q)` whether a
-- task of `path` in queue index q may be leased now, `took(path, id)` counts a lease, `record(now_text)`
-- stores them; `held[q]` is true once a path's concurrency left some of queue q's ready tasks.
local function task_limits(specs_key, limit_prefix, task_prefix, partition, partitions, now)
  local held = {}
  -- path -> {limit, count, running key, leased ids, checked, rate = {tokens, period}, left, spent, times
  -- key, rate_held}
  local paths = {}

  local function path_state(path)
    local state = paths[path]
    if state then
      return state
    end
    state = {spent = 0}
    paths[path] = state
    local spec = redis.call('HGET', specs_key, path)
    if not spec then
      return state
    end
    local c, r, p = limit_parts(spec)
    if c and c ~= '' then
      state.limit = share(tonumber(c), partition, partitions)
      state.leased = {}
      state.running = limit_prefix .. path .. ':running'
      state.count = redis.call('SCARD', state.running)
    end
    if r and r ~= '' then
      local tokens, period = share(tonumber(r), partition, partitions), tonumber(p)
      state.rate = {tokens, period}
      state.times = limit_prefix .. path .. ':lease-times'
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
      elseif redis.call('HGET', task_prefix .. id, 'segment') == 'running' then
        live = live + 1
      else
        gone[#gone + 1] = id
      end
    end
    call_chunked('SREM', state.running, gone)
    state.count = live + #state.leased  -- this call's leases join the set at its end
  end

  local function admits(path, q)
    local state = path_state(path)
    if state.limit and state.count >= state.limit and not state.checked then
      recount(state)
    end
    if state.limit and state.count >= state.limit then
      held[q] = true
      return false
    end
    if state.rate and state.spent >= state.left then
      state.rate_held = true
      return false
    end
    return true
  end

  local function took(path, id)
    local state = paths[path]
    if state.limit then
      state.leased[#state.leased + 1] = id
      state.count = state.count + 1
    end
    if state.rate then
      state.spent = state.spent + 1
    end
  end

  -- Add this call's leases to each path's running set and spend its rate tokens; returns the seconds
  -- until the first token of a rate-held path comes back, or nil.
  local function record(now_text)
    local wait = nil
    for _, state in pairs(paths) do
      if state.leased then
        call_chunked('SADD', state.running, state.leased)
      end
      local rate = state.rate
      if rate and state.spent > 0 then
        spend_tokens(state.times, state.spent, now_text, rate[1], rate[2])
      end
      local next_in = state.rate_held and next_token_in(state.times, rate[1], rate[2], now)
      if next_in and (not wait or next_in < wait) then
        wait = next_in
      end
    end
    return wait
  end

  return {admits = admits, took = took, record = record, held = held}
end
