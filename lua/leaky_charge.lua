-- leaky_charge.lua — charge a leaky-bucket queue with the slots one process released alone under
-- fail_mode = "local": its local schedule ends ahead_ms from now, and the shared schedule's theoretical arrival
-- time (TAT) moves to at least then, never back, so no slot reserved afterwards runs beside the local ones.
-- It sets a time rather than adding an amount: a charge applied twice (a retry of one that timed out after it
-- was applied) is applied once. The last reservation can no longer be handed back (tail is cleared), since
-- leaky_return.lua would move the TAT back into the charged slots.
--
-- KEYS[1]  the queue (the hash of leaky_bucket.lua)
-- ARGV[1]  rate      tokens per per_ms of the queue, integer ≥ 1 (the unit of tat_frac: 1/rate ms)
-- ARGV[2]  ahead_ms  how long after now the local schedule ends, integer ≥ 0 (ms)
-- ARGV[3]  now_ms    optional; when absent the Redis server's TIME is used
--
-- Reply: { charged, 0, 0, reset_after_ms }
--   charged         1 when the TAT moved to now + ahead_ms, 0 when the queue already ran at least that long
--   reset_after_ms  until the queue is empty (the TAT), ms
-- Mirrors src/algorithm/leaky_bucket.rs (LeakyBucket::charge).

local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return idiv(a + b - 1, b) end -- ceil(a / b) for integers, b ≥ 1
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'

local rate = tonumber(ARGV[1])
local ahead = tonumber(ARGV[2])
local now_arg = 3
if not (rate and ahead) or rate < 1 or ahead < 0 then
  return redis.error_reply('ERR leaky_charge: bad arguments (rate, ahead_ms)')
end
local now = tonumber(ARGV[now_arg]) -- now_ms when given, else the Redis server's TIME
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end

-- The TAT relative to now, in units of 1/rate ms (tat_frac converted from the rate it was counted in).
local state = redis.call('HMGET', KEYS[1], 'tat_ms', 'tat_frac', 'rate')
local tat_ms, tat_frac, old_rate = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3])
if old_rate and old_rate ~= rate and old_rate > 0 then tat_frac = idiv(tat_frac * rate, old_rate) end
local wait = 0
if tat_ms and (tat_ms > now or (tat_ms == now and tat_frac > 0)) then
  wait = (tat_ms - now) * rate + tat_frac
end

if ahead * rate <= wait then
  if tat_ms then redis.call('HSET', KEYS[1], 'tail', '') end
  return { 0, 0, 0, cdiv(wait, rate) }
end
redis.call('HSET', KEYS[1], 'tat_ms', int(now + ahead), 'tat_frac', '0', 'rate', int(rate), 'tail', '')
redis.call('PEXPIRE', KEYS[1], int(ahead + 1))
return { 1, 0, 0, ahead }
