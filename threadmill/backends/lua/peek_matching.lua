-- peek_matching: read one page of the tasks of a segment whose document contains every
-- needle, and how many match, in one round trip. Scans at most ARGV[4] entries of the
-- segment so a filter over a huge segment stays bounded; the reply says if it stopped short.
-- KEYS[1] (zset)   the segment
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (prefix) result prefix of an older layout (1), read where the hash has no `result` field
-- ARGV[1] (number) offset among the matching tasks
-- ARGV[2] (number) count
-- ARGV[3] (string) "1" for newest first (highest score first)
-- ARGV[4] (number) most segment entries to scan
-- ARGV[5..n] (string) needles, each matched as plain text against the result document,
--                     else the stored payload (for unreadable tasks, also the read error);
--                     a page without needles is peek.lua's job (read by rank, no scan)
-- Returns: {matched, complete (1 scanned the whole segment, 0 stopped at the limit), server_seconds,
--           id1, data1, result1, started_at1, lease_worker1, lease_started_at1, lease_token1,
--           read_error1, score1, reported_progress1, id2, ...}; absent values are false
-- include: filter
local first = tonumber(ARGV[1])
local last = first + tonumber(ARGV[2])
local rev = ARGV[3] == '1'
local limit = tonumber(ARGV[4])
local chunk = 500
local matched = 0
local scanned = 0
local rows = {}
local total = redis.call('ZCARD', KEYS[1])

while scanned < total and scanned < limit do
  local stop = math.min(scanned + chunk, limit) - 1
  local ids
  if rev then
    ids = redis.call('ZRANGE', KEYS[1], scanned, stop, 'REV', 'WITHSCORES')
  else
    ids = redis.call('ZRANGE', KEYS[1], scanned, stop, 'WITHSCORES')
  end
  if #ids == 0 then
    break
  end
  for i = 1, #ids, 2 do
    local id = ids[i]
    local f = redis.call('HMGET', KEYS[2] .. id, 'data', 'started_at', 'lease_worker', 'lease_started_at',
      'lease_token', 'read_error', 'result', 'reported_progress')
    local result = f[7] or redis.call('GET', KEYS[3] .. id)
    if filter_matches(f[1], result, f[6], ARGV, 5, #ARGV) then
      matched = matched + 1
      if matched > first and matched <= last then
        for _, value in ipairs({id, f[1], result, f[2], f[3], f[4], f[5], f[6], ids[i + 1], f[8]}) do
          rows[#rows + 1] = value
        end
      end
    end
  end
  scanned = scanned + #ids / 2
end
local time = redis.call('TIME')
local out = {matched, scanned >= total and 1 or 0, time[1] .. '.' .. string.format('%06d', tonumber(time[2]))}
for _, value in ipairs(rows) do
  out[#out + 1] = value
end
return out
