-- lua/leaky_return.lua: GENERATED from lua/lib/common.lua and lua/src/leaky_return.lua,
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

-- leaky_return.lua — hand back a reserved leaky-bucket slot that will not be used (a caller gave up waiting),
-- when that is possible: only while the slot is still the last one reserved (nobody queued behind it), so
-- that no later caller's slot moves. Otherwise nothing changes and the slot leaks unused.
--
-- KEYS[1]  the queue (the hash of leaky_bucket.lua)
-- ARGV[1]  rate         tokens per per_ms, integer ≥ 1
-- ARGV[2]  per_ms       integer ≥ 1
-- ARGV[3]  cost         tokens of the reservation, integer ≥ 1
-- ARGV[4]  member       the reservation's member, as given to leaky_bucket.lua
-- ARGV[5]  now_ms       optional; when absent the Redis server's TIME is used
--
-- Reply: { returned, 0, 0, reset_after_ms }: returned = cost when handed back, 0 when someone queued behind.
-- Mirrors src/algorithm/leaky_bucket.rs.

local rate, per, cost = numbers(1, 3)
local member = ARGV[4]
local now_arg = 5
if not (rate and per and cost and member) or rate < 1 or per < 1 or cost < 1 then
  return redis.error_reply('ERR leaky_return: bad arguments (rate, per_ms, cost, member)')
end
local now = now_of(now_arg)

local state = redis.call('HMGET', KEYS[1], 'tat_ms', 'tat_frac', 'tail')
local tat_ms, tat_frac = tonumber(state[1]), tonumber(state[2])
if state[3] ~= member or not tat_ms then
  local reset = 0
  if tat_ms and tat_ms > now then reset = tat_ms - now end
  return { 0, 0, 0, reset }
end
-- Move the TAT back by the reservation, never before now.
local tat = (tat_ms - now) * rate + tat_frac - cost * per
if tat <= 0 then
  redis.call('DEL', KEYS[1])
  return { cost, 0, 0, 0 }
end
redis.call('HSET', KEYS[1], 'tat_ms', int(now + idiv(tat, rate)), 'tat_frac', int(tat - idiv(tat, rate) * rate), 'tail', '')
redis.call('PEXPIRE', KEYS[1], int(cdiv(tat, rate) + 1))
return { cost, 0, 0, cdiv(tat, rate) }
