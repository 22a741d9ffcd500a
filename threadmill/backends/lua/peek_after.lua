-- peek_after: read the page of a segment that follows a (score, id) cursor, and the segment's size.
-- The keyset form of peek: the cursor names a place in the order, not a rank, so a page costs the
-- same at any depth and a merged view over partitions needs one call per partition. The start is
-- found as scan's is: entries of one score are ordered by id, so a binary search among the
-- cursor's score finds the first entry past the cursor's id.
-- KEYS[1] (zset)   the segment
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (prefix) result prefix of an older layout (1), read where the hash has no `result` field
-- ARGV[1] (number) cursor score, exactly as a reply gave it, or "" to start at the head
-- ARGV[2] (string) cursor id
-- ARGV[3] (number) the most entries to return
-- ARGV[4] (string) "1" to walk newest first (highest score first, ids descending)
-- Returns: {total, server_seconds, id1, data1, result1, started_at1, lease_worker1,
--           lease_started_at1, lease_token1, read_error1, score1, id2, ...}; absent values are false
local key = KEYS[1]
local rev = ARGV[4] == '1'
local start = 0

-- Byte order, as the zset orders ids (Lua's own `<` follows the server's collation locale).
local function precedes(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

local function member_at(rank)
  if rev then
    return redis.call('ZRANGE', key, rank, rank, 'REV')[1]
  end
  return redis.call('ZRANGE', key, rank, rank)[1]
end

if ARGV[1] ~= '' then
  local score, after = ARGV[1], ARGV[2]
  local lo
  if rev then
    lo = redis.call('ZCOUNT', key, '(' .. score, '+inf')
  else
    lo = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  end
  local hi = lo + redis.call('ZCOUNT', key, score, score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local member = member_at(mid)
    if (rev and precedes(member, after)) or (not rev and precedes(after, member)) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  start = lo
end
local stop = start + tonumber(ARGV[3]) - 1
local ids
if rev then
  ids = redis.call('ZRANGE', key, start, stop, 'REV', 'WITHSCORES')
else
  ids = redis.call('ZRANGE', key, start, stop, 'WITHSCORES')
end
local time = redis.call('TIME')
local out = {redis.call('ZCARD', key), time[1] .. '.' .. string.format('%06d', tonumber(time[2]))}
for i = 1, #ids, 2 do
  local id = ids[i]
  local f = redis.call('HMGET', KEYS[2] .. id, 'data', 'started_at', 'lease_worker', 'lease_started_at',
    'lease_token', 'read_error', 'result')
  out[#out + 1] = id
  out[#out + 1] = f[1]
  out[#out + 1] = f[7] or redis.call('GET', KEYS[3] .. id)
  out[#out + 1] = f[2]
  out[#out + 1] = f[3]
  out[#out + 1] = f[4]
  out[#out + 1] = f[5]
  out[#out + 1] = f[6]
  out[#out + 1] = ids[i + 1]
end
return out
