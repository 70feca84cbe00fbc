-- sliding_window.lua — sliding-window counter of sub-buckets (e.g. 60 s as 6 × 10 s): at most `limit`
-- tokens in the last `sub_buckets` sub-buckets (the current one included). Memory O(sub_buckets) per key.
-- Approximate: the counted span is between (N − 1) and N sub-buckets long, so a grant is forgotten up to one
-- sub-bucket early (see the README for the bound against the exact log).
--
-- KEYS[1]  the counters (a hash: field = sub-bucket index floor(now_ms / sub_ms), value = tokens granted in it)
-- KEYS[2]  the ban (a string: ms until which the key is banned)
-- ARGV[1]  window_ms    integer ≥ 1, a multiple of sub_buckets
-- ARGV[2]  sub_buckets  integer ≥ 1
-- ARGV[3]  limit        tokens per window, integer ≥ 1
-- ARGV[4]  cost         tokens asked, integer ≥ 0 (0: a peek, which answers as for 1 and changes nothing)
-- ARGV[5]  ban_ms       after a refusal, refuse the key this long (0 = no ban)
-- ARGV[6]  now_ms       optional; when absent the Redis server's TIME is used
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         tokens: cost or 0
--   remaining       tokens still grantable in the window after this call
--   retry_after_ms  0 when granted; else ms until enough sub-buckets have left (the ban's rest when banned);
--                   -1 when cost > limit
--   reset_after_ms  ms until every counted sub-bucket has left
-- Mirrors SlidingWindow in src/algorithm/window.rs and Ban in src/algorithm/ban.rs.

local window, n, limit, cost, ban_ms = numbers(1, 5)
local now_arg = 6
if not (window and n and limit and cost and ban_ms) or n < 1 or window < n or window % n ~= 0 or limit < 1 or cost < 0 or ban_ms < 0 then
  return redis.error_reply('ERR sliding_window: bad arguments (window_ms, sub_buckets, limit, cost, ban_ms)')
end
local now = now_of(now_arg)

local sub = window / n
local cur = idiv(now, sub)
-- Live sub-buckets (index > cur − n), oldest first; older fields are deleted.
local live, count = {}, 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local idx, c = tonumber(fields[i]), tonumber(fields[i + 1])
  if idx <= cur - n then
    redis.call('HDEL', KEYS[1], fields[i])
  elseif idx <= cur then
    live[#live + 1] = { idx, c }
    count = count + c
  end
end
table.sort(live, function(a, b) return a[1] < b[1] end)
local reset_after = 0
if #live > 0 then reset_after = (live[#live][1] + n) * sub - now end

local answer = window_gate(KEYS[2], now, limit, count, cost, reset_after)
if answer then return answer end

-- A peek that does not fit is told what a call of one token would wait, and bans nothing.
local peek = cost == 0
if peek then cost = 1 end
if count + cost <= limit then
  redis.call('HINCRBY', KEYS[1], int(cur), cost)
  redis.call('PEXPIRE', KEYS[1], int((cur + n) * sub - now))
  return { cost, limit - count - cost, 0, (cur + n) * sub - now }
end

local retry_after = -1
if cost <= limit then
  -- Oldest sub-buckets leave first: sub-bucket idx leaves at (idx + n) × sub.
  local need = count + cost - limit
  for _, b in ipairs(live) do
    need = need - b[2]
    if need <= 0 then
      retry_after = (b[1] + n) * sub - now
      break
    end
  end
end
return refuse_window(KEYS[2], now, ban_ms, peek, limit, count, retry_after, reset_after)
