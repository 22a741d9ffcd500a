-- scan: read the next window of a segment after a (score, id) cursor, read-only.
-- The cursor names a place in the order, not a rank, so entries that leave the segment (or
-- join it) between two windows never make a walk skip a task that stays. Zset entries of one
-- score are ordered by id, so the window starts at the first entry past the cursor's id among
-- those of the cursor's score, found by binary search (O(log^2 n), however many share a score).
-- KEYS[1] (zset) the segment
-- ARGV[1] (number) cursor score, exactly as a previous reply gave it, or "" to start at the head
-- ARGV[2] (string) cursor id, the last id of the previous window
-- ARGV[3] (number) the most entries to return
-- ARGV[4] (string) "1" to walk newest first (highest score first, ids descending)
-- Returns: {id1, score1, id2, score2, ...}; the last pair is the next cursor, fewer than ARGV[3]
--          pairs means the walk is done
-- include: keyset
local key = KEYS[1]
local rev = ARGV[4] == '1'
local start = keyset_start(key, rev, ARGV[1], ARGV[2])
local stop = start + tonumber(ARGV[3]) - 1
if rev then
  return redis.call('ZRANGE', key, start, stop, 'REV', 'WITHSCORES')
end
return redis.call('ZRANGE', key, start, stop, 'WITHSCORES')
