-- limits (included): a limit as the scripts keep it, "concurrency|rate count|rate period s" (an empty part:
-- none of that kind; limits.encode writes it), and one partition's share of a limit. The share is this
-- rule here and `limits.share` in Python, for the tooling's reads that run no script; test_lua_lib.py
-- asserts the two agree.

-- The parts of a limit's text, each a string ('' for none): concurrency, rate count, rate period seconds;
-- nil for text of another shape.
local function limit_parts(text)
  return string.match(text, '^([^|]*)|([^|]*)|([^|]*)$')
end

-- The parts in force of limit text `base` with `over` on top (either false or nil: none): each
-- non-empty part of `over` wins, a rate's count and period together.
local function limit_overlay(base, over)
  local c, r, p = '', '', ''
  if base then
    c, r, p = limit_parts(base)
  end
  if over then
    local over_c, over_r, over_p = limit_parts(over)
    if over_c ~= '' then
      c = over_c
    end
    if over_r ~= '' then
      r, p = over_r, over_p
    end
  end
  return c, r, p
end

-- Partition p's share of a limit of `total` over P partitions: total // P, plus 1 when p < total % P,
-- so the shares add up to the total.
local function share(total, partition, partitions)
  local whole = math.floor(total / partitions)
  return partition < total - whole * partitions and whole + 1 or whole
end
