-- lua/fixed_window.lua: GENERATED from lua/lib/common.lua and lua/src/fixed_window.lua,
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

-- fixed_window.lua — fixed window counter: at most `limit` tokens per window; rolling or calendar-aligned.
-- The per-user INCR + EXPIRE counter of community sites (posts, comments, likes per window) and a daily upload
-- quota reset at local midnight, with the window start kept as a timestamp so replays with now_ms work, and a
-- ban after a breach (a 'like' limit that refuses the user for an hour once exceeded).
--
-- KEYS[1]  the counter (a hash: start = ms the window opened, count = tokens granted in it)
-- KEYS[2]  the ban (a string: ms until which the key is banned)
-- ARGV[1]  window_ms  integer ≥ 1
-- ARGV[2]  limit      tokens per window, integer ≥ 1
-- ARGV[3]  cost       tokens asked, integer ≥ 0 (0: a peek, which answers as for 1 and changes nothing)
-- ARGV[4]  ban_ms     after a refusal, refuse the key this long (0 = no ban)
-- ARGV[5]  align_ms   -1: rolling, the first hit opens the window; ≥ 0: calendar windows start where
--                     (now_ms + align_ms) is a multiple of window_ms (local midnight in UTC+08:00: 86400000, 28800000);
--                     -2: a time zone's calendar windows, whose lengths vary (a 23- or 25-hour day): ARGV[6] to
--                     ARGV[9] are b0 < b1 < b2 < b3, the boundaries in ms of three windows in a row [b0, b1),
--                     [b1, b2), [b2, b3), as the client's tz database cuts them around the client's clock
--                     (src/rule/zone.rs); the window holding now_ms is used, so the Redis server's clock still
--                     decides and a clock skew below a window changes nothing; outside [b0, b3) an error
-- ARGV[6]  now_ms     optional; when absent the Redis server's TIME is used (with align_ms = -2: b0)
-- ARGV[7]  b1         only with align_ms = -2
-- ARGV[8]  b2         only with align_ms = -2
-- ARGV[9]  b3         only with align_ms = -2
-- ARGV[10] now_ms     only with align_ms = -2: optional, as ARGV[6] without it
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         tokens: cost or 0
--   remaining       tokens still grantable in the window after this call
--   retry_after_ms  0 when granted; else ms until the window ends (the ban's rest when banned); -1 when cost > limit
--   reset_after_ms  ms until the window ends (0 when no window is open)
-- Mirrors FixedWindow in src/algorithm/window.rs and Ban in src/algorithm/ban.rs.

local window, limit, cost, ban_ms, align = numbers(1, 5)
local now_arg = 6
if not (window and limit and cost and ban_ms and align) or window < 1 or limit < 1 or cost < 0 or ban_ms < 0 or align < -2 then
  return redis.error_reply('ERR fixed_window: bad arguments (window_ms, limit, cost, ban_ms, align_ms)')
end
local b = nil -- a time zone's boundaries
if align == -2 then
  b = { numbers(6, 9) }
  if not (b[1] and b[2] and b[3] and b[4]) or b[1] >= b[2] or b[2] >= b[3] or b[3] >= b[4] then
    return redis.error_reply('ERR fixed_window: bad window boundaries (b0 < b1 < b2 < b3)')
  end
  now_arg = 10
end
local now = now_of(now_arg)

local state = redis.call('HMGET', KEYS[1], 'start', 'count')
local start, count = tonumber(state[1]), tonumber(state[2]) or 0
local ends_at = nil
if b then
  local s = nil
  for i = 1, 3 do
    if now >= b[i] and now < b[i + 1] then s, ends_at = b[i], b[i + 1] end
  end
  if not s then
    return redis.error_reply('ERR fixed_window: the server clock is outside the windows sent (clock skew above a window)')
  end
  if start ~= s then start, count = s, 0 end
elseif align >= 0 then
  local s = idiv(now + align, window) * window - align
  if start ~= s then start, count = s, 0 end
elseif start == nil or now >= start + window or now < start then
  start, count = now, 0
end
local ends_in = (ends_at or (start + window)) - now

local reset_after = 0
if count > 0 then reset_after = ends_in end
local answer = window_gate(KEYS[2], now, limit, count, cost, reset_after)
if answer then return answer end

-- A peek that does not fit is told what a call of one token would wait, and bans nothing.
local peek = cost == 0
if peek then cost = 1 end
if count + cost <= limit then
  count = count + cost
  redis.call('HSET', KEYS[1], 'start', int(start), 'count', int(count))
  redis.call('PEXPIRE', KEYS[1], int(ends_in))
  return { cost, limit - count, 0, ends_in }
end

local retry_after = ends_in
if cost > limit then retry_after = -1 end
return refuse_window(KEYS[2], now, ban_ms, peek, limit, count, retry_after, reset_after)
