-- sliding_log.lua — sliding-window log: at most `limit` tokens granted in any window (now − window_ms, now].
-- The per-user ZSET log of community sites (e.g. reply at most 5 times in any 60 s; no boundary burst, unlike
-- INCR + EXPIRE), done atomically: refused attempts are not recorded, members are unique even within one
-- millisecond, and the log of a cold user expires after the window.
--
-- KEYS[1]  the log (a ZSET: member = a unique id per granted token, score = ms of the grant)
-- KEYS[2]  the ban (a string: ms until which the key is banned)
-- ARGV[1]  window_ms  integer ≥ 1
-- ARGV[2]  limit      tokens per window, integer ≥ 1
-- ARGV[3]  cost       tokens asked, integer ≥ 0 (0: a peek, which answers as for 1 and changes nothing)
-- ARGV[4]  member     a unique id for this call (a token i > 1 of one call is stored as member..':'..i)
-- ARGV[5]  ban_ms     after a refusal, refuse the key this long (0 = no ban)
-- ARGV[6]  now_ms     optional; when absent the Redis server's TIME is used
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         cost or 0
--   remaining       tokens still grantable in the window after this call
--   retry_after_ms  0 when granted; else ms until enough grants have left the window (the ban's rest when
--                   banned); -1 when cost > limit
--   reset_after_ms  ms until every grant has left the window
-- Mirrors SlidingLog in src/algorithm/window.rs and Ban in src/algorithm/ban.rs.

local window, limit, cost = numbers(1, 3)
local member = ARGV[4]
local ban_ms = numbers(5, 5)
local now_arg = 6
if not (window and limit and cost and member and ban_ms) or window < 1 or limit < 1 or cost < 0 or ban_ms < 0 then
  return redis.error_reply('ERR sliding_log: bad arguments (window_ms, limit, cost, member, ban_ms)')
end
local now = now_of(now_arg)

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now - window))
local count = redis.call('ZCARD', KEYS[1])
local reset_after = 0
if count > 0 then
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  reset_after = tonumber(newest[2]) + window - now
end

local answer = window_gate(KEYS[2], now, limit, count, cost, reset_after)
if answer then return answer end

-- A peek that does not fit is told what a call of one token would wait, and bans nothing.
local peek = cost == 0
if peek then cost = 1 end
if count + cost <= limit then
  for i = 1, cost do
    local m = member
    if i > 1 then m = member .. ':' .. i end
    redis.call('ZADD', KEYS[1], int(now), m)
  end
  redis.call('PEXPIRE', KEYS[1], int(window))
  return { cost, limit - count - cost, 0, window }
end

local retry_after = -1
if cost <= limit then
  -- The (count + cost − limit)-th oldest grant must leave: it does at its score + window.
  local k = count + cost - limit
  local oldest = redis.call('ZRANGE', KEYS[1], k - 1, k - 1, 'WITHSCORES')
  retry_after = tonumber(oldest[2]) + window - now
end
return refuse_window(KEYS[2], now, ban_ms, peek, limit, count, retry_after, reset_after)
