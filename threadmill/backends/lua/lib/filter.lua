-- filter (included): the console's text filter, one definition for what a filtered view shows
-- (peek_matching) and what "requeue this view" moves (requeue_many).

-- Whether a task matches the needles `needles[first..last]`: each is found as plain text in its result
-- document (`result`, false: none), else its stored payload (`data`), or in its read error (an
-- unreadable task's, false: none). No needles match every task.
local function filter_matches(data, result, read_error, needles, first, last)
  local text = (result or data or '') .. '\n' .. (read_error or '')
  for i = first, last do
    if not string.find(text, needles[i], 1, true) then
      return false
    end
  end
  return true
end
