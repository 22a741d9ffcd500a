#!lua flags=allow-oom
-- sweep_waiting: settle the final parents of some waiting tasks of one queue that no acknowledgement
-- or cancel settled (an older release's worker acknowledged them, or an older release cancelled
-- them), so their children are released or failed as the acknowledgement would have (lib/workflow).
-- It also finishes a cascade or a release an acknowledgement left at its budget (lib/workflow): a
-- parent still in a waiting task's pending set has children left to settle, and its outcome is
-- counted once whoever settles it (its `counted` field). A parent whose hash is gone (expired,
-- purged, deleted by an older release) or quarantined (unreadable) is settled as failed: its outcome
-- cannot be read any more; a gone one is counted once, by the `counted` hash it is left (which expires
-- with the results), or the one a delete or a purge left (lib/workflow's mark_counted).
-- Bounded: a call takes at most ARGV[4] steps (a waiting task looked at, a parent read, SETTLE_STEPS a child
-- a settle visits; a page of a pending set, at most 100 parents or a small set's whole, is finished past
-- it), and reads a pending set by SSCAN, so one join's 9,999 parents take several calls. It returns a cursor: the
-- waiting task to resume at (found again by its id, since the tasks released before it move its rank
-- down; by the rank when it left the segment) and the SSCAN cursor in its pending set. A parent
-- added or settled between two calls is safe: a settle is atomic and removes the parent from the
-- pending set, so a parent SSCAN returns twice settles once, and one it misses waits for the next sweep.
-- KEYS[1] (zset)   the queue's waiting segment
-- KEYS[2] (string) the task hash prefix, `<prefix>:task:` (not a key: every key here shares its tag)
-- ARGV[1] (number) the cursor's rank: the first waiting task to look at, from 0, unless ARGV[5] waits
-- ARGV[2] (number) how many waiting tasks to look at
-- ARGV[3] (number) result time to live, seconds (what a failed child's hash expires after)
-- ARGV[4] (number) most steps
-- ARGV[5] (string) the cursor's waiting task, or '' (start at ARGV[1])
-- ARGV[6] (string) the SSCAN cursor in that task's pending set, '0' for its start
-- Returns: {parents settled, the next cursor's rank, its task or '', its SSCAN cursor, 1 at the end else 0}
-- include: workflow
-- Steps a child visited by a settle counts: its 6 to 12 commands against a parent read's one or two (a call
-- of 500 steps settling a join's parents took a median 2.8 ms at one step, and up to 20 ms).
local SETTLE_STEPS = 4
local prefix = string.sub(KEYS[2], 1, #KEYS[2] - #':task:')
local rank, resume, scan = tonumber(ARGV[1]), ARGV[5], ARGV[6]
if resume ~= '' then
  local at = redis.call('ZRANK', KEYS[1], resume)
  if at then
    rank = at
  else
    scan = '0'  -- released or failed meanwhile: the rank it had is where the tasks after it are now
  end
end
local count = tonumber(ARGV[2])
-- One task past the count: where the next call starts, or nothing when the segment ends here.
local ids = redis.call('ZRANGE', KEYS[1], rank, rank + count)
if #ids == 0 then
  return {0, 0, '', '0', 1}  -- the common case, nothing waiting: one command
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local settled, steps, ttl = 0, tonumber(ARGV[4]), tonumber(ARGV[3])
for i, child in ipairs(ids) do
  local cursor = child == resume and scan or '0'
  if i > count or steps <= 0 then
    return {settled, redis.call('ZRANK', KEYS[1], child) or rank, child, cursor, 0}
  end
  steps = steps - 1
  local workflow = redis.call('HGET', KEYS[2] .. child, 'workflow')
  if workflow then
    repeat
      local page = redis.call('SSCAN', prefix .. ':pending:' .. child, cursor, 'COUNT',
        math.max(math.min(steps, 100), 1))
      cursor = page[1]
      for _, parent in ipairs(page[2]) do
        steps = steps - 1
        local task = KEYS[2] .. parent
        local f = redis.call('HMGET', task, 'segment', 'node')
        if f[1] == 'successful' or f[1] == 'failed' or f[1] == 'unreadable' or not f[1] then
          local budget = math.max(math.floor(steps / SETTLE_STEPS), 1)
          local left = settle_workflow(task, parent, workflow, f[2] or parent, f[1] ~= 'successful', now, ttl,
            budget, not f[1] and 'gone' or nil)
          steps, settled = steps - (budget - left) * SETTLE_STEPS, settled + 1
        end
      end
    until cursor == '0' or steps <= 0
    if cursor ~= '0' then
      return {settled, redis.call('ZRANK', KEYS[1], child) or rank, child, cursor, 0}
    end
  end
end
return {settled, 0, '', '0', 1}
