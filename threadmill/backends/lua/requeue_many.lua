#!lua flags=allow-oom
-- requeue_many: move the given tasks of one segment of a queue back to ready, keeping their ids.
-- Each task moves whole or not at all. Like requeue, the lease and the reported progress are cleared (so a late
-- acknowledgement by its worker is refused), the task joins the back of its priority band, and
-- a finished task's result document (its errors and worker ids) becomes its payload.
-- A running task moves only with the document the caller built from it (its abandoned attempt
-- recorded), fenced by the lease token it was read under; and, unless forced, only when its
-- lease is overdue or its worker's heartbeat is older than the worker timeout (a worker with
-- no heartbeat counts as alive until the lease is as old as the timeout; none counts as silent
-- while the server settles after a restart, see ARGV[4]), so a task a live worker runs is never
-- started twice.
-- KEYS[1] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2] (prefix) result prefix of an older layout (1), read where the hash has no `result` field
-- KEYS[3] (zset)   the queue's ready segment
-- KEYS[4] (zset)   the source segment (deferred, running, successful, failed or unreadable)
-- KEYS[5] (zset)   worker names by last heartbeat, server epoch seconds (unread when ARGV[4] is given)
-- KEYS[6] (list)   the queue's wake list: one token wakes an idle worker when tasks moved
-- ARGV[1] (string) the source segment's name; a task in another segment or queue is left alone
-- ARGV[2] (string) "1" to move a running task even when its lease is live
-- ARGV[3] (number) worker timeout, seconds
-- ARGV[4] (string) "" to read heartbeats from KEYS[5]; "@" and seconds S to read them too, but count no
--                  worker with a heartbeat as silent until this server has been up S seconds (after a
--                  restart its heartbeats are from before the outage); else "+" and every worker of that
--                  set as `name<TAB>heartbeat age` lines (a partition other than 0, whose slot does not hold it)
-- ARGV[5] (number) k, the number of needles
-- ARGV[6..5+k] (string) needles, each matched as plain text against the result document, else
--                       the stored payload (for unreadable tasks, also the read error)
-- ARGV[6+k..] (string) triples: task id, the lease token it was read under ("" none), and its new
--                      document ("" to keep the result document or the stored payload)
-- A unique task requeued from a segment its key does not count in (a finished task) takes its key back
-- when no other counted task holds it (lib/unique.lua); otherwise the key stays where it is.
-- Returns: {moved, id1, ..., id_moved, refused1, ...}: how many moved, the ids that moved, then
--          the running ids the fence refused (leased again, or sent without a token)
-- include: silent
-- include: unique
-- include: filter
local source = ARGV[1]
local force = ARGV[2] == '1'
local timeout = tonumber(ARGV[3])
local k = tonumber(ARGV[5])
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local silent = silent_check(ARGV[4], KEYS[5], now, timeout)
local moved = {}
local refused = {}

local function matches(key, id)
  if k == 0 then
    return true
  end
  local f = redis.call('HMGET', key, 'data', 'read_error', 'result')
  return filter_matches(f[1], f[3] or redis.call('GET', KEYS[2] .. id), f[2], ARGV, 6, 5 + k)
end

-- A lease is live while its deadline (the running score) is ahead and its worker's heartbeat is fresh.
local function live(id, worker, lease_started_at)
  local deadline = redis.call('ZSCORE', KEYS[4], id)
  if deadline and tonumber(deadline) < now then
    return false
  end
  return not silent(worker, lease_started_at)
end

for i = 6 + k, #ARGV, 3 do
  local id, token, document = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local key = KEYS[1] .. id
  local f = redis.call('HMGET', key, 'segment', 'score', 'lease_token', 'lease_worker', 'result', 'lease_started_at',
    'unique', 'unique_segments')
  -- In this queue's segment, not merely a segment of that name: a task is in one queue only.
  if f[1] == source and redis.call('ZSCORE', KEYS[4], id) and matches(key, id) then
    if source == 'running' and (token == '' or f[3] ~= token) then
      refused[#refused + 1] = id
    elseif source ~= 'running' or force or not live(id, f[4], f[6]) then
      if document ~= '' then
        redis.call('HSET', key, 'data', document)
      else
        local result = f[5] or redis.call('GET', KEYS[2] .. id)
        if result then
          redis.call('HSET', key, 'data', result)
        end
      end
      -- Same score rule as requeue: keep the priority band, join its back.
      local score = string.format('%.0f', math.floor(tonumber(f[2] or '1e15') / 1e13) * 1e13 + now_ms)
      redis.call('ZREM', KEYS[4], id)
      redis.call('DEL', KEYS[2] .. id)
      redis.call('PERSIST', key)
      redis.call('HDEL', key, 'lease_worker', 'lease_token', 'lease_started_at', 'read_error', 'result',
        'reported_progress')
      redis.call('HSET', key, 'segment', 'ready', 'score', score)
      redis.call('ZADD', KEYS[3], score, id)
      if f[7] then
        retake_unique(key, id, f[7], f[8], source, 'ready')
      end
      moved[#moved + 1] = id
    end
  end
end
if #moved > 0 and redis.call('LLEN', KEYS[6]) == 0 then
  redis.call('LPUSH', KEYS[6], '1')
end
local out = {#moved}
for _, id in ipairs(moved) do
  out[#out + 1] = id
end
for _, id in ipairs(refused) do
  out[#out + 1] = id
end
return out
