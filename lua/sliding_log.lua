-- lua/sliding_log.lua: GENERATED from lua/lib/common.lua and lua/src/sliding_log.lua,
-- whose header (below the libraries) describes KEYS, ARGV and the reply. Edit those files, then run
-- `TOKENLEASE_WRITE_LUA=1 cargo test --lib lua_files`. Load this file as it is (EVAL or SCRIPT LOAD).
-- lib/common.lua — the integer helpers, the ARGV reader, the clock and the bans every script of lua/ uses:
-- src/store/script.rs puts it in front of each script (Redis runs every script on its own, so the helpers cannot be
-- loaded once).

local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return idiv(a + b - 1, b) end -- ceil(a / b) for integers, b ≥ 1
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'
-- ARGV[from] to ARGV[to] as numbers, each nil where it is absent or not a number.
local function numbers(from, to)
  local out = {}
  for i = from, to do out[i - from + 1] = tonumber(ARGV[i]) end
  return unpack(out, 1, to - from + 1)
end
-- ms: ARGV[arg] when the caller passed now_ms there (tests replay sequences), else the Redis server's TIME.
local function now_of(arg)
  local now = tonumber(ARGV[arg])
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end
-- The ban key ban_key holds the ms until which its key is banned: what is left of it at now (0: none).
local function ban_left(ban_key, now)
  local until_ms = tonumber(redis.call('GET', ban_key) or '0') or 0
  if until_ms > now then return until_ms - now end
  return 0
end
-- Bans ban_key's key for ban_ms from now.
local function ban(ban_key, now, ban_ms) redis.call('SET', ban_key, int(now + ban_ms), 'PX', int(ban_ms)) end
-- A window's refusal, count of limit used: { 0, left (0 when over), retry_after, reset_after }.
local function refused(limit, count, retry_after, reset_after)
  local left = limit - count
  if left < 0 then left = 0 end
  return { 0, left, retry_after, reset_after }
end
-- A window's answer before it counts, count of limit used: when ban_key's key is banned at now, a refusal (the ban
-- is the wait, and reset_after at least it); for a peek (cost 0: the window as it is and what a call of one token
-- would get, nothing counted or banned) where one token fits, { 0, left, 0, reset_after }; else nil.
local function window_gate(ban_key, now, limit, count, cost, reset_after)
  local banned = ban_left(ban_key, now)
  if banned > 0 then return refused(limit, count, banned, math.max(reset_after, banned)) end
  if cost == 0 and count + 1 <= limit then return { 0, limit - count, 0, reset_after } end
  return nil
end
-- A window's refusal of a call that does not fit: with ban_ms > 0 (not for a peek) ban_key's key is banned for
-- ban_ms from now, which is then the wait.
local function refuse_window(ban_key, now, ban_ms, peek, limit, count, retry_after, reset_after)
  if ban_ms > 0 and not peek then
    ban(ban_key, now, ban_ms)
    retry_after, reset_after = ban_ms, math.max(reset_after, ban_ms)
  end
  return refused(limit, count, retry_after, reset_after)
end

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
