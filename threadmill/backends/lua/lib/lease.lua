-- lease (included): leasing tasks to a worker in one acquire call. The payload is read, never decoded or
-- rewritten: the lease is stored beside it.
-- Needs chunked, included first.

-- Returns the call's leases: `lease(id, q, fields)` leases task `id` of queue index q (`fields`: its
-- HMGET of data, started_at, worker_losses, read here when nil; a task without a hash is skipped) and
-- appends its reply row to `out`; `record(queues)` writes each queue's leases into its running segment;
-- `count` is the leases so far and `taken[q]` queue q's (nil: none).
-- A suspect (a task that was in a lost worker's lease: its hash has `worker_losses`) is leased with
-- `progress` "<token> leased": its worker records its start and finish (record_progress), so recovery
-- blames a later loss exactly. Any other task costs one more HMGET field, nothing else.
local function new_leases(task_prefix, worker, token_base, now_text, deadline_text, out)
  local taken = {}
  local running = {}  -- queue index -> {deadline, id, deadline, id, ...}
  local rows = #out  -- out's length, counted here: six `#out` (a search for the border each) cost a lease 1.4%
  local leases  -- built below with every field at once: a table that grows is rehashed

  local function lease(id, q, fields)
    local key = task_prefix .. id
    fields = fields or redis.call('HMGET', key, 'data', 'started_at', 'worker_losses')
    if not fields[1] then
      return
    end
    local count = leases.count + 1
    leases.count = count
    taken[q] = (taken[q] or 0) + 1
    local token = token_base .. ':' .. count
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
    local entries = running[q]
    if not entries then
      entries = {}
      running[q] = entries
    end
    entries[#entries + 1] = deadline_text
    entries[#entries + 1] = id
    out[rows + 1], out[rows + 2], out[rows + 3], out[rows + 4], out[rows + 5], out[rows + 6] =
      id, fields[1], started, token, q, fields[3]
    rows = rows + 6
  end

  -- Once per queue a call (one ZADD of every lease), not once per task: each command a script runs
  -- costs the server bridging on top of its own work.
  local function record(queues)
    for q, entries in pairs(running) do
      call_chunked('ZADD', queues[q].running, entries)
    end
  end

  leases = {count = 0, taken = taken, lease = lease, record = record}
  return leases
end
