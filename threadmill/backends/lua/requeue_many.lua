-- requeue_many: move many tasks of one segment of a queue back to ready, keeping their ids.
-- Either the given ids, or one window of the segment scanned from a cursor, filtered by
-- needles; the caller repeats the scan with the returned cursor until it is -1, so a huge
-- segment never blocks the server. Each task moves whole or not at all. Like requeue, a
-- finished task's result document (its errors and worker ids) becomes its payload, the lease
-- is cleared (so a late acknowledgement by its worker is refused) and the task joins the back
-- of its priority band.
-- KEYS[1] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[2] (prefix) result prefix
-- KEYS[3] (zset)   the queue's ready segment
-- KEYS[4] (zset)   the source segment (deferred, running, successful, failed or unreadable)
-- ARGV[1] (string) the source segment's name; a task hash naming another segment is left alone
-- ARGV[2] (string) "ids" or "scan"
-- ids:  ARGV[3..n] (string) task ids
-- scan: ARGV[3] (number) cursor, the index in the source segment to scan from
--       ARGV[4] (number) window, how many entries to scan
--       ARGV[5] (string) "1" to scan newest first (highest score first)
--       ARGV[6..n] (string) needles, each matched as plain text against the result document,
--                           else the stored payload (for unreadable tasks, also the read error)
-- Returns: {requeued, next_cursor, id1, id2, ...}: how many moved, -1 when the scan is done
--          (always for ids) else where to scan next, and the ids that moved
local source = ARGV[1]
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local requeued = 0
local moved = {}

local function requeue(id, document)
  local key = KEYS[1] .. id
  local f = redis.call('HMGET', key, 'segment', 'score')
  if f[1] ~= source then
    return
  end
  if document then
    redis.call('HSET', key, 'data', document)
  end
  -- Same score rule as requeue: keep the priority band, join its back.
  local score = math.floor(tonumber(f[2] or '1e15') / 1e13) * 1e13 + now_ms
  redis.call('ZREM', KEYS[4], id)
  redis.call('DEL', KEYS[2] .. id)
  redis.call('PERSIST', key)
  redis.call('HDEL', key, 'lease_worker', 'lease_token', 'lease_started_at', 'read_error')
  redis.call('HSET', key, 'segment', 'ready', 'score', string.format('%.0f', score))
  redis.call('ZADD', KEYS[3], string.format('%.0f', score), id)
  requeued = requeued + 1
  moved[#moved + 1] = id
end

local function reply(next_cursor)
  local out = {requeued, next_cursor}
  for _, id in ipairs(moved) do
    out[#out + 1] = id
  end
  return out
end

if ARGV[2] == 'ids' then
  for i = 3, #ARGV do
    requeue(ARGV[i], redis.call('GET', KEYS[2] .. ARGV[i]))
  end
  return reply(-1)
end

local cursor = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local ids
if ARGV[5] == '1' then
  ids = redis.call('ZRANGE', KEYS[4], cursor, cursor + window - 1, 'REV')
else
  ids = redis.call('ZRANGE', KEYS[4], cursor, cursor + window - 1)
end
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', KEYS[1] .. id, 'data', 'read_error')
  local result = redis.call('GET', KEYS[2] .. id)
  local text = (result or f[1] or '') .. '\n' .. (f[2] or '')
  local ok = f[1] ~= false
  for i = 6, #ARGV do
    if ok and not string.find(text, ARGV[i], 1, true) then
      ok = false
    end
  end
  if ok then
    requeue(id, result)
  end
end
if #ids < window then
  return reply(-1)
end
-- Requeued entries left the segment, so the unscanned rest starts that much earlier.
return reply(cursor + #ids - requeued)
