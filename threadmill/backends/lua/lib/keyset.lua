-- keyset (included): where a walk of a sorted set resumes after a (score, id) cursor.
-- The cursor names a place in the order, not a rank, so entries that leave the set (or join
-- it) between two windows never make a walk skip one that stays. Entries of one score are
-- ordered by id, so the start is found by binary search among the cursor's score
-- (O(log^2 n), however many share a score).

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

-- The rank in `key` (walked highest first when `rev`) of the first entry past (score, after);
-- 0 when `score` is "" (the head).
local function keyset_start(key, rev, score, after)
  if score == '' then
    return 0
  end
  local function member_at(rank)
    if rev then
      return redis.call('ZRANGE', key, rank, rank, 'REV')[1]
    end
    return redis.call('ZRANGE', key, rank, rank)[1]
  end
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
  return lo
end
