-- peek: read one page of a segment and the segment's size in one round trip.
-- KEYS[1] (zset)   the segment
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (prefix) result prefix of an older layout (1), read where the hash has no `result` field
-- ARGV[1] (number) offset
-- ARGV[2] (number) count
-- ARGV[3] (string) "1" for newest first (highest score first)
-- Returns: {total, server_seconds, id1, data1, result1, started_at1, lease_worker1,
--           lease_started_at1, lease_token1, read_error1, score1, reported_progress1, id2, ...};
--          absent values are false
-- include: rows
local total = redis.call('ZCARD', KEYS[1])
local first = tonumber(ARGV[1])
local last = first + tonumber(ARGV[2]) - 1
local ids
if ARGV[3] == '1' then
  ids = redis.call('ZRANGE', KEYS[1], first, last, 'REV', 'WITHSCORES')
else
  ids = redis.call('ZRANGE', KEYS[1], first, last, 'WITHSCORES')
end
local time = redis.call('TIME')
local out = {total, time[1] .. '.' .. string.format('%06d', tonumber(time[2]))}
return append_rows(out, ids, KEYS[2], KEYS[3])
