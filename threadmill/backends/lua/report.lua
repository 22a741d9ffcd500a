#!lua flags=allow-oom
-- report: store what running tasks reported (progress, metadata) in their hashes, fenced per task.
-- A task whose lease_token no longer matches (its lease was taken back, or it was acknowledged)
-- is left untouched. Metadata merges into what is stored; this script does not parse JSON, so a
-- run's first write ("merged" 0) is refused where metadata is stored already and the stored text
-- is returned: the worker merges its values over it and writes the whole again (merged 1).
-- KEYS[i] (hash) task i
-- ARGV[4i-3] (string) task i's lease token
-- ARGV[4i-2] (string) task i's progress document, or "" to leave the stored one
-- ARGV[4i-1] (string) task i's metadata document, or "" to leave the stored one
-- ARGV[4i]   (string) "1" when that metadata includes what was stored before the run, else "0"
-- ARGV[4n+1] (string) optional, the telemetry channel: the ids whose progress was stored are published
--                   on it in one message (the console's live progress); absent (an older caller): none
-- ARGV[4n+2] (string) "1" to publish with SPUBLISH (a cluster's sharded pub/sub), "0" with PUBLISH
-- Returns: {reply_1, ..., reply_n}: 1 stored, 0 the fence refused it, or the stored metadata to
--          merge (the progress was stored, the metadata was not)
local replies = {}
local progressed = {}
for i = 1, #KEYS do
  local task, a = KEYS[i], 4 * i - 4
  if redis.call('HGET', task, 'lease_token') ~= ARGV[a + 1] then
    replies[i] = 0
  else
    replies[i] = 1
    if ARGV[a + 2] ~= '' then
      redis.call('HSET', task, 'reported_progress', ARGV[a + 2])
      progressed[#progressed + 1] = task
    end
    if ARGV[a + 3] ~= '' then
      local stored = ARGV[a + 4] ~= '1' and redis.call('HGET', task, 'metadata')
      if stored then
        replies[i] = stored
      else
        redis.call('HSET', task, 'metadata', ARGV[a + 3])
      end
    end
  end
end
local channel = ARGV[4 * #KEYS + 1]
if channel and #progressed > 0 then
  local publish = ARGV[4 * #KEYS + 2] == '1' and 'SPUBLISH' or 'PUBLISH'
  redis.call(publish, channel, '{"type":"progress","keys":' .. cjson.encode(progressed) .. '}')
end
return replies
