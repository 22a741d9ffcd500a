#!lua flags=allow-oom
-- sample_latency: record a queue's latency (the age of its oldest ready task) for this minute.
-- Keeps the largest sample of the minute, by the server's clock. Reads the head and the tail
-- of the ready set only: exact with one or two priorities in use, a lower bound with more.
-- KEYS[1] (zset)   the queue's ready segment (score: (100 - priority) * band + enqueue ms)
-- KEYS[2] (prefix) the queue's per-minute latency counter prefix; the key is this plus the minute
-- ARGV[1] (number) seconds a sample lives
-- ARGV[2] (number) the priority band width of the ready score
-- Returns: the latency sampled now, milliseconds (0 when nothing is ready)
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local band = tonumber(ARGV[2])
local oldest = nil
for _, rank in ipairs({0, -1}) do
  local entry = redis.call('ZRANGE', KEYS[1], rank, rank, 'WITHSCORES')
  if #entry > 0 then
    local enqueued = tonumber(entry[2]) % band
    if not oldest or enqueued < oldest then
      oldest = enqueued
    end
  end
end
local age = oldest and math.max(0, now_ms - oldest) or 0
local key = KEYS[2] .. math.floor(tonumber(time[1]) / 60)
local current = tonumber(redis.call('GET', key) or '-1')
if age > current then
  redis.call('SET', key, string.format('%d', age), 'EX', ARGV[1])
end
return age
