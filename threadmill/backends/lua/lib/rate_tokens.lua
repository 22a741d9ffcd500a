-- rate_tokens (included): a rate's tokens, kept as a list of lease times, newest first (limits.py): a rate
-- of N per period is a bucket of N tokens, each coming back one period after it was spent.
-- Needs chunked, included first.

-- The number of lease times in `list` after `cutoff`: a binary search, then the older ones are dropped
-- (they never count again).
local function live_times(list, cutoff)
  local length = redis.call('LLEN', list)
  if length == 0 or tonumber(redis.call('LINDEX', list, 0)) <= cutoff then
    return 0
  end
  if tonumber(redis.call('LINDEX', list, -1)) > cutoff then
    return length
  end
  local lo, hi = 1, length - 1  -- the first index at or before the cutoff lies in [lo, hi]
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if tonumber(redis.call('LINDEX', list, mid)) > cutoff then
      lo = mid + 1
    else
      hi = mid
    end
  end
  redis.call('LTRIM', list, 0, lo - 1)
  return lo
end

-- Spend `spent` tokens at `now_text` of a rate of `tokens` per `period` seconds: the list keeps the
-- newest `tokens` times and expires a period after the last lease.
local function spend_tokens(list, spent, now_text, tokens, period)
  local times = {}
  for i = 1, spent do
    times[i] = now_text
  end
  call_chunked('LPUSH', list, times)
  redis.call('LTRIM', list, 0, tokens - 1)
  redis.call('PEXPIRE', list, math.ceil(period * 1000))
end

-- Seconds from `now` until the first spent token of `list` comes back (at least 1 ms); nil while fewer
-- than `tokens` are kept.
local function next_token_in(list, tokens, period, now)
  if redis.call('LLEN', list) < tokens then
    return nil
  end
  local oldest = tonumber(redis.call('LINDEX', list, tokens - 1))
  return math.max(0.001, oldest + period - now)
end
