#!lua flags=allow-oom
-- summarise_quarters: sum closed quarter-hours of a queue's per-minute counters, one summary key each.
-- The 24-hour chart reads a quarter's summary instead of its 60 minute counters. Every sum is
-- returned; it is stored only once its quarter closed ARGV[1] minutes ago by the server's clock,
-- because a counter's key names its writer's minute: a writer whose clock lags, or a slow call,
-- may still add to a quarter that has just closed. Each quarter i takes 61 keys, from k = 61(i-1):
-- KEYS[k+1]       (string) quarter i's summary: "in,out,failed,latency_ms" (latency "" when none sampled)
-- KEYS[k+2..k+16] (string) its 15 ingress counters, oldest minute first
-- KEYS[k+17..k+31] (string) its 15 egress counters
-- KEYS[k+32..k+46] (string) its 15 failed counters
-- KEYS[k+47..k+61] (string) its 15 latency samples, milliseconds (the largest of each minute)
-- ARGV[1]   (number) minutes a quarter must have been closed before its summary is stored
-- ARGV[2]   (number) seconds a summary lives
-- ARGV[2+i] (number) the minute after quarter i's last, epoch minutes
-- Returns: one summary string a quarter, in the order given (stored or not)
local minute = math.floor(tonumber(redis.call('TIME')[1]) / 60)
local grace = tonumber(ARGV[1])
local summaries = {}
for i = 1, #ARGV - 2 do
  local k = 61 * (i - 1)
  local sums = {}
  for series = 0, 2 do
    local total = 0
    for _, v in ipairs(redis.call('MGET', unpack(KEYS, k + 2 + 15 * series, k + 16 + 15 * series))) do
      total = total + (tonumber(v) or 0)
    end
    sums[series + 1] = string.format('%d', total)
  end
  local slowest = nil
  for _, v in ipairs(redis.call('MGET', unpack(KEYS, k + 47, k + 61))) do
    if v and (not slowest or tonumber(v) > slowest) then
      slowest = tonumber(v)
    end
  end
  sums[4] = slowest and string.format('%d', slowest) or ''
  local summary = table.concat(sums, ',')
  if minute >= tonumber(ARGV[2 + i]) + grace then
    redis.call('SET', KEYS[k + 1], summary, 'EX', ARGV[2])
  end
  summaries[i] = summary
end
return summaries
