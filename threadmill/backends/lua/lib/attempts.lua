-- attempts (included): a task's attempt records, one JSON array a line, oldest first.

-- Records a task keeps, the newest (threadmill.attempts.ATTEMPTS_KEPT holds the same number).
local ATTEMPTS_KEPT = 20

-- Return the `attempts` field `stored` (false when none) with `record` appended, the oldest
-- record dropped beyond ATTEMPTS_KEPT.
local function with_attempt(stored, record)
  if not stored or stored == '' then
    return record
  end
  local text = stored .. '\n' .. record
  local first = string.find(text, '\n', 1, true)
  local lines, at = 2, first
  while lines <= ATTEMPTS_KEPT do
    at = string.find(text, '\n', at + 1, true)
    if not at then
      return text
    end
    lines = lines + 1
  end
  return string.sub(text, first + 1)
end
