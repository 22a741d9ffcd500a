-- live_leases: which of the given tasks are running under a live lease, read-only.
-- The same rule as requeue_many's: a lease is live while its deadline (the running score) is
-- ahead on the server's clock and its worker's heartbeat is no older than the worker timeout
-- (a worker with no heartbeat counts as alive until the lease is as old as the timeout).
-- Without force, requeue_many skips these.
-- KEYS[1] (zset)   the queue's running segment (score: lease deadline)
-- KEYS[2] (prefix) task hash prefix; a task's key is this plus its id (same hash tag)
-- KEYS[3] (zset)   worker names by last heartbeat, server epoch seconds (unread when ARGV[2] is given)
-- ARGV[1] (number) worker timeout, seconds
-- ARGV[2] (string) "" to read heartbeats from KEYS[3]; "@" and seconds S to read them too, but count no
--                  worker with a heartbeat as silent until this server has been up S seconds (after a
--                  restart its heartbeats are from before the outage); else "+" and every worker of that
--                  set as `name<TAB>heartbeat age` lines (another partition's slot does not hold the set)
-- ARGV[3..n] (string) task ids
-- Returns: {id1, id2, ...} those of the ids running under a live lease, in the order given
-- include: silent
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local timeout = tonumber(ARGV[1])
local silent = silent_check(ARGV[2], KEYS[3], now, timeout)
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local deadline = redis.call('ZSCORE', KEYS[1], id)
  if deadline and tonumber(deadline) >= now then
    local lease = redis.call('HMGET', KEYS[2] .. id, 'lease_worker', 'lease_started_at')
    if not silent(lease[1], lease[2]) then
      out[#out + 1] = id
    end
  end
end
return out
