#!lua flags=allow-oom
-- trim_finished: drop the oldest ids of a queue's finished segments older than the result
-- time to live, at most ARGV[2] per segment a call, so a long-idle queue never blocks the server.
-- Their task data and results expire on their own; without this an idle queue (no acknowledge
-- to trim it) keeps their ids: inflated counts and rows whose data is gone.
-- KEYS[1] (zset) the queue's successful segment (score: finish time)
-- KEYS[2] (zset) the queue's failed segment (score: finish time)
-- ARGV[1] (number) result time to live, seconds
-- ARGV[2] (number) the most ids to drop from each segment
-- Returns: the number of ids dropped from both segments
local time = redis.call('TIME')
local cutoff = '(' .. (tonumber(time[1]) + tonumber(time[2]) / 1000000 - tonumber(ARGV[1]))
local limit = tonumber(ARGV[2])
local dropped = 0
for _, key in ipairs(KEYS) do
  -- A zset is ordered by score, so the ids older than the cutoff are its first ranks.
  local expired = math.min(redis.call('ZCOUNT', key, '-inf', cutoff), limit)
  if expired > 0 then
    dropped = dropped + redis.call('ZREMRANGEBYRANK', key, 0, expired - 1)
  end
end
return dropped
