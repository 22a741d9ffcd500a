#!lua flags=allow-oom
-- recount_workflows: count in their records the final outcomes no script counted (an older release's
-- acknowledge, cancel or quarantine, which predate workflows, recorded them: a leaf has no children, so
-- the sweeper never reaches it; a quarantined task counts as failed), and finish a record whose counts then reach its total, as lib/workflow does. Walks
-- the `workflows` index from a cursor, oldest first; a finished record is passed over with one HMGET, a
-- gone one (it expired after its result time to live) has its id removed from the index (so the console's
-- list and the next walks stop paying for it; the ids after it move down a rank, where the cursor
-- stays), an open one has its graph's text read and each of its tasks' hashes. A task is
-- counted once, marked by its `counted` field (read and set in one call, as lib/workflow's count_outcome
-- does with HSETNX); a task whose hash is gone is
-- not counted (whether it was cannot be read any more). At most ARGV[3] records and ARGV[4] task hashes
-- are read a call; the cursor returned resumes inside a graph the budget cut. Allowed past maxmemory:
-- it writes one field a task, and a record it finishes expires.
-- KEYS[1] (zset)   workflow ids by enqueue time
-- KEYS[2] (string) the task hash prefix, `<prefix>:task:` (not a key: the records share its tag)
-- ARGV[1] (number) the cursor's rank in the index, from 0
-- ARGV[2] (number) the cursor's place in that workflow's graph text: where the last id read ended, or 0
-- ARGV[3] (number) most records to look at
-- ARGV[4] (number) most task hashes to read
-- ARGV[5] (number) result time to live, seconds (what a finished record expires after)
-- ARGV[6] (string) optional: the workflow at the cursor whose next task ids follow (the caller read them
--                  once from its graph, so this call need not read that text again), or ''
-- ARGV[7] (number) optional: the place in that graph's text where the last id given ends
-- ARGV[8..]        optional: those task ids, at most ARGV[4]
-- Returns: {outcomes counted, the next cursor's rank, its place in the graph, 1 at the index's end else 0,
--           the workflow whose graph the cursor is inside or ''}
local prefix = string.sub(KEYS[2], 1, #KEYS[2] - #':task:')
local rank, at = tonumber(ARGV[1]), tonumber(ARGV[2])
-- A graph entry, `[<name as JSON>, "<task id>", [<parents' names>]]`: the id is the quoted UUID before `, [`.
local ID_IN_GRAPH = '"(%x+%-%x+%-%x+%-%x+%-%x+)", %['
local ids = redis.call('ZRANGE', KEYS[1], rank, rank + tonumber(ARGV[3]) - 1)
if #ids == 0 then
  return {0, 0, 0, 1, ''}  -- the common case on an idle server, no workflow: one command
end
local counted, budget, given = 0, tonumber(ARGV[4]), ARGV[6] or ''
-- Count task `id`'s final outcome in record `record` of workflow `wid` unless it was; return 1 if counted.
local function count_task(id, record, wid)
  local task = KEYS[2] .. id
  local t = redis.call('HMGET', task, 'segment', 'workflow', 'counted')
  if (t[1] == 'successful' or t[1] == 'failed' or t[1] == 'unreadable') and t[2] == wid and not t[3] then
    redis.call('HSET', task, 'counted', '1')
    redis.call('HINCRBY', record, t[1] == 'successful' and 'successful' or 'failed', 1)
    return 1
  end
  return 0
end
for _, wid in ipairs(ids) do
  local record = prefix .. ':workflow:' .. wid
  local f = redis.call('HMGET', record, 'finished_at', 'total')
  if not f[1] and not f[2] then
    -- The record is gone: enqueue_workflow stores it with no expiry, which only a finished one gets.
    redis.call('ZREM', KEYS[1], wid)
    rank = rank - 1
  elseif f[2] and not f[1] then
    if budget <= 0 then
      return {counted, rank, at, 0, wid}
    end
    if wid == given and #ARGV > 7 then
      -- The ids the caller read after the cursor: a graph only grows at its end (a task added at run time),
      -- so the text's next ids are these, and the text is read (below) only for what comes after them.
      for i = 8, #ARGV do
        budget, counted = budget - 1, counted + count_task(ARGV[i], record, wid)
      end
      at, given = tonumber(ARGV[7]), ''
      if budget <= 0 then
        return {counted, rank, at, 0, wid}
      end
    end
    -- The ids are found in the graph's text, not decoded: decoding a 10,000-task graph takes 18 ms a
    -- call. A node's name cannot pass for a task of another workflow: a task counts here only when its
    -- hash names this workflow.
    local graph = redis.call('HGET', record, 'graph')
    while true do
      local _, last, id = string.find(graph, ID_IN_GRAPH, at + 1)
      if not id then
        break
      elseif budget <= 0 then
        return {counted, rank, at, 0, wid}
      end
      budget, at = budget - 1, last
      counted = counted + count_task(id, record, wid)
    end
    local counts = redis.call('HMGET', record, 'total', 'successful', 'failed')
    if (tonumber(counts[2]) or 0) + (tonumber(counts[3]) or 0) >= (tonumber(counts[1]) or 0) then
      local time = redis.call('TIME')
      redis.call('HSET', record, 'finished_at', tonumber(time[1]) + tonumber(time[2]) / 1000000)
      redis.call('EXPIRE', record, tonumber(ARGV[5]))
    end
  end
  at, rank = 0, rank + 1
end
return {counted, rank, 0, #ids < tonumber(ARGV[3]) and 1 or 0, ''}
