-- lua/leaky_bucket.lua: GENERATED from lua/lib/common.lua and lua/src/leaky_bucket.lua,
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

-- leaky_bucket.lua — a leaky-bucket queue (GCRA): callers reserve the next slot of a shared schedule that leaks
-- `rate` tokens every `per_ms`, and wait for it; a call whose wait would exceed max_wait_ms is refused.
-- It paces blocking background jobs (e.g. a reindex at 20 per second): one call per job, shared by every process.
--
-- KEYS[1]  the queue (a hash: the theoretical arrival time TAT = tat_ms + tat_frac / rate ms, kept exactly so
--          that rates above 1000 per second pace right; rate = the rate tat_frac was counted in; tail = the member
--          of the last reservation, so that leaky_return.lua can hand it back)
-- ARGV[1]  rate         tokens per per_ms, integer ≥ 1
-- ARGV[2]  per_ms       integer ≥ 1
-- ARGV[3]  cost         tokens, integer ≥ 0 (0: a peek at the queue, which reserves nothing)
-- ARGV[4]  max_wait_ms  the longest a caller may wait for its slot (0: only a free slot now)
-- ARGV[5]  member       a unique id of this reservation
-- ARGV[6]  now_ms       optional; when absent the Redis server's TIME is used
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         cost, or 0 when the wait would exceed max_wait_ms
--   remaining       tokens that could still be reserved now without waiting more than max_wait_ms
--   retry_after_ms  granted: how long to wait for the reserved slot; refused: until the wait fits in max_wait_ms
--   reset_after_ms  until the queue is empty (the TAT)
-- Mirrors src/algorithm/leaky_bucket.rs.

local rate, per, cost, max_wait = numbers(1, 4)
local member = ARGV[5]
local now_arg = 6
if not (rate and per and cost and max_wait and member) or rate < 1 or per < 1 or cost < 0 or max_wait < 0 then
  return redis.error_reply('ERR leaky_bucket: bad arguments (rate, per_ms, cost, max_wait_ms)')
end
local now = now_of(now_arg)

-- The slot starts at max(TAT, now); times are in units of 1/rate ms relative to now.
local state = redis.call('HMGET', KEYS[1], 'tat_ms', 'tat_frac', 'rate')
local tat_ms, tat_frac, old_rate = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3])
if old_rate and old_rate ~= rate and old_rate > 0 then tat_frac = idiv(tat_frac * rate, old_rate) end
local wait = 0
if tat_ms and (tat_ms > now or (tat_ms == now and tat_frac > 0)) then
  wait = (tat_ms - now) * rate + tat_frac
end
local limit = max_wait * rate
local step = cost * per

if wait > limit then
  return { 0, 0, cdiv(wait - limit, rate), cdiv(wait, rate) }
end

if cost == 0 then -- a peek: the queue as it is, nothing reserved
  return { 0, idiv(limit - wait, per) + 1, 0, cdiv(wait, rate) }
end
local tat = wait + step                      -- the new TAT, relative to now
local new_ms = now + idiv(tat, rate)
local new_frac = tat - idiv(tat, rate) * rate
redis.call('HSET', KEYS[1], 'tat_ms', int(new_ms), 'tat_frac', int(new_frac), 'rate', int(rate), 'tail', member)
redis.call('PEXPIRE', KEYS[1], int(cdiv(tat, rate) + 1))
local remaining = 0
if tat <= limit then remaining = idiv(limit - tat, per) + 1 end
return { cost, remaining, cdiv(wait, rate), cdiv(tat, rate) }
