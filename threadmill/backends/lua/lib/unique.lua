-- unique (included by enqueue): which entries of an enqueue call are duplicates of a task that
-- holds their uniqueness key, and the keys the others take. A key holds the id of its task; the
-- holder counts only while its hash names one of the entry's counted segments, so a key whose
-- task finished, expired or was removed without releasing it (a crash, an older release's
-- acknowledge) admits the next enqueue instead of blocking it. Two entries of one call with one
-- key: the first is stored, the second is its duplicate. The holder's hash is the declared task
-- prefix plus the id read from the key; a stored task keeps its key's digest in field `unique`.

-- Whether `segment` is one of the comma-separated `counted`.
local function counts_in(counted, segment)
  return segment and string.find(',' .. counted .. ',', ',' .. segment .. ',', 1, true) ~= nil
end

-- Takes the keys of the free entries; returns {duplicate = {[i] = true}, reply = {stored, i, holder, ...},
-- store = function(n) -> the number of tasks stored, which marks each stored unique task with its key}.
local function admit_unique(n, u)
  local duplicate, reply, taken = {}, {0}, {}
  local claimed = {}  -- key -> {id, segment} of an entry of this call that took it
  for j = 1, u do
    local t = 5 * n + 3 * j + 6
    local i, hold_ms, counted = tonumber(ARGV[t]), tonumber(ARGV[t + 1]), ARGV[t + 2]
    local key, task_key, id = KEYS[5 + 2 * n + j], KEYS[2 * i + 4], ARGV[5 * i + 4]
    local holder, segment
    if claimed[key] then
      holder, segment = claimed[key][1], claimed[key][2]
    else
      holder = redis.call('GET', key)
      if holder then
        segment = redis.call('HGET', string.sub(task_key, 1, #task_key - #id) .. holder, 'segment')
      end
    end
    if holder and counts_in(counted, segment) then
      duplicate[i] = true
      reply[#reply + 1] = i
      reply[#reply + 1] = holder
    else
      if hold_ms > 0 then
        redis.call('SET', key, id, 'PX', hold_ms)
      else
        redis.call('SET', key, id)
      end
      claimed[key] = {id, ARGV[5 * i + 6]}
      taken[#taken + 1] = {task_key, string.match(key, ':unique:(.+)$'), counted}
    end
  end
  local function store(count)
    for _, entry in ipairs(taken) do
      redis.call('HSET', entry[1], 'unique', entry[2], 'unique_segments', entry[3])
    end
    reply[1] = count - (#reply - 1) / 2
    return reply[1]
  end
  return {duplicate = duplicate, reply = reply, store = store}
end
