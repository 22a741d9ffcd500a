-- peek_after: read the page of a segment that follows a (score, id) cursor, and the segment's size.
-- The keyset form of peek: the cursor names a place in the order, not a rank, so a page costs the
-- same at any depth and a merged view over partitions needs one call per partition (the start
-- found as scan's is, lib/keyset.lua).
-- KEYS[1] (zset)   the segment
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (prefix) result prefix of an older layout (1), read where the hash has no `result` field
-- ARGV[1] (number) cursor score, exactly as a reply gave it, or "" to start at the head
-- ARGV[2] (string) cursor id
-- ARGV[3] (number) the most entries to return
-- ARGV[4] (string) "1" to walk newest first (highest score first, ids descending)
-- Returns: {total, server_seconds, id1, data1, result1, started_at1, lease_worker1,
--           lease_started_at1, lease_token1, read_error1, score1, reported_progress1, id2, ...};
--          absent values are false
-- include: keyset
-- include: rows
local key = KEYS[1]
local rev = ARGV[4] == '1'
local start = keyset_start(key, rev, ARGV[1], ARGV[2])
local stop = start + tonumber(ARGV[3]) - 1
local ids
if rev then
  ids = redis.call('ZRANGE', key, start, stop, 'REV', 'WITHSCORES')
else
  ids = redis.call('ZRANGE', key, start, stop, 'WITHSCORES')
end
local time = redis.call('TIME')
local out = {redis.call('ZCARD', key), time[1] .. '.' .. string.format('%06d', tonumber(time[2]))}
return append_rows(out, ids, KEYS[2], KEYS[3])
