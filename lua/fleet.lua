-- lua/fleet.lua: GENERATED from lua/lib/common.lua and lua/src/fleet.lua,
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

-- fleet.lua — the roster of one rule: a member's beat and the live count, which divides a hot key's fair share of
-- the burst (invariant 17).
--
-- KEYS[1]  the roster (a sorted set: member → ms it was last heard)
-- ARGV[1]  member      unique to a limiter for the life of its process
-- ARGV[2]  live_ms     a member heard within this is live
-- ARGV[3]  keep_ms     a member unheard this long is forgotten
-- ARGV[4]  leave       1: this member leaves the fleet (it shut down)
-- ARGV[5]  now_ms      optional; when absent the Redis server's TIME is used
--
-- Reply: { processes, now_ms, 0, 0 }
--   processes       live members, this one included (unless it leaves)
--   now_ms          the time the script ran at (the server's TIME): a member compares it with its own clock, so
--                   that a step of the store's clock (a failover to a server whose clock differs) is seen
-- The roster expires keep_ms after the last beat it heard. (Until 2026-11-28 it also held the fleet after an
-- outage until every member had charged what it sold alone, in three more keys: `:hold`, `:owed`, `:counts`;
-- nothing is sold alone any more, and the keys an older process still writes expire by themselves.)
-- Mirrors Roster::beat in src/algorithm/fleet.rs, which gives the same replies and stores the same state.

local member = ARGV[1]
local live_ms, keep_ms = numbers(2, 3)
local leave = ARGV[4] == '1'
if not (member and live_ms and keep_ms) or member == '' or live_ms < 0 or keep_ms < 1 then
  return redis.error_reply('ERR fleet: bad arguments (member, live_ms, keep_ms, leave)')
end
local now_arg = 5
local now = now_of(now_arg)

local roster = KEYS[1]
redis.call('ZREMRANGEBYSCORE', roster, '-inf', '(' .. int(now - keep_ms))
if leave then
  redis.call('ZREM', roster, member)
else
  redis.call('ZADD', roster, int(now), member)
end
local processes = redis.call('ZCOUNT', roster, '(' .. int(now - live_ms), '+inf')
local top = redis.call('ZREVRANGE', roster, 0, 0, 'WITHSCORES')
if top[2] then
  local left = tonumber(top[2]) + keep_ms - now
  if left < 1 then left = 1 end
  redis.call('PEXPIRE', roster, int(left))
end
return { processes, now, 0, 0 }
