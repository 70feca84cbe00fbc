-- window_charge.lua — writes back what one process admitted alone under fail_mode = "local" to a window rule's
-- shared state, so the window counts it and refuses accordingly (invariant 16): a count added to the fixed
-- window or to the sliding window's sub-buckets at the times the tokens were admitted, entries (unique members,
-- the admission times as scores) in the sliding log. Admissions whose window has passed are not written.
-- A charge carries an id: a charge run again (a retry after a timeout that Redis had already applied) writes
-- nothing more.
--
-- KEYS[1]  the window's state, as its algorithm's script keeps it: fixed_window.lua's counter (hash start,
--          count), sliding_window.lua's counters (hash of sub-buckets) or sliding_log.lua's log (ZSET)
-- KEYS[2]  the charges applied to it (a set of charge ids, kept 2 × window_ms after the last charge)
-- ARGV[1]  algorithm    'fixed_window', 'sliding_window' or 'sliding_log'
-- ARGV[2]  window_ms    integer ≥ 1 (sliding_window: a multiple of sub_buckets)
-- ARGV[3]  limit        tokens per window, integer ≥ 1 (for the reply's remaining)
-- ARGV[4]  sub_buckets  sliding_window: integer ≥ 1; otherwise ignored (0)
-- ARGV[5]  align_ms     fixed_window: as fixed_window.lua's (-1 rolling, ≥ 0 calendar, -2 a time zone's windows
--                       ARGV[6..9]); otherwise ignored (0)
-- ARGV[6]  b0    fixed_window with align_ms = -2: the time zone's window bounds, as fixed_window.lua's;
-- ARGV[7]  b1    otherwise ignored (0)
-- ARGV[8]  b2
-- ARGV[9]  b3
-- ARGV[10] id           the charge's id, unique (process id, a start-time seed, a counter)
-- ARGV[11] n            admissions that follow, integer ≥ 0
-- ARGV[12] age_ms, ARGV[13] tokens: the first admission, then ARGV[12 + 2i], ARGV[13 + 2i] for i in 1 .. n − 1:
--          tokens (≥ 0) admitted age_ms (≥ 0) before now: at now − age_ms on this server's clock, so the client's
--          and the server's clocks need not agree
-- ARGV[12 + 2 * n]  now_ms  optional; when absent the Redis server's TIME is used
--
-- Reply: { written, remaining, 0, reset_after_ms }
--   written         tokens written now (0 when the charge id was already applied, or every admission's window
--                   has passed)
--   remaining       tokens still grantable in the window after the charge (0 when over the limit)
--   retry_after_ms  0
--   reset_after_ms  ms until the window ends, as the algorithm's script says it (0 when nothing is counted)
-- Mirrors charge of SlidingLog, FixedWindow and SlidingWindow in src/algorithm/window.rs.

local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'

local algo = ARGV[1]
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local n_subs = tonumber(ARGV[4])
local align = tonumber(ARGV[5])
local id = ARGV[10]
local n = tonumber(ARGV[11])
local bad = 'ERR window_charge: bad arguments (algorithm, window_ms, limit, sub_buckets, align_ms, b0..b3, id, n, age_ms, tokens...)'
if not (window and limit and n_subs and align and id and n) or window < 1 or limit < 1 or n < 0 or align < -2 then
  return redis.error_reply(bad)
end
if not (algo == 'fixed_window' or algo == 'sliding_window' or algo == 'sliding_log') then
  return redis.error_reply(bad)
end
if algo == 'sliding_window' and (n_subs < 1 or window < n_subs or window % n_subs ~= 0) then
  return redis.error_reply(bad)
end
local admitted = {} -- { age_ms, tokens }
for i = 0, n - 1 do
  local age, tokens = tonumber(ARGV[12 + 2 * i]), tonumber(ARGV[13 + 2 * i])
  if not (age and tokens) or age < 0 or tokens < 0 then return redis.error_reply(bad) end
  admitted[#admitted + 1] = { age, tokens }
end
local now_arg = 12 + 2 * n
local now = tonumber(ARGV[now_arg]) -- now_ms when given, else the Redis server's TIME
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end

-- A charge already applied writes nothing more; the window is still reported. Its id is recorded once its writes
-- are done (`applied`), so a charge stopped on the way by an error is written when it is sent again.
if redis.call('SISMEMBER', KEYS[2], id) == 1 then admitted = {} end
local function applied(reply)
  redis.call('SADD', KEYS[2], id)
  redis.call('PEXPIRE', KEYS[2], int(2 * window))
  return reply
end

local written = 0
if algo == 'sliding_log' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now - window))
  for j, a in ipairs(admitted) do
    local at = now - a[1]
    if a[2] > 0 and at > now - window then
      for i = 1, a[2] do
        local m = id .. '.' .. j
        if i > 1 then m = m .. ':' .. i end
        redis.call('ZADD', KEYS[1], int(at), m)
      end
      written = written + a[2]
    end
  end
  local count = redis.call('ZCARD', KEYS[1])
  local reset_after = 0
  if count > 0 then
    local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    reset_after = tonumber(newest[2]) + window - now
  end
  if written > 0 then redis.call('PEXPIRE', KEYS[1], int(reset_after)) end
  local left = limit - count
  if left < 0 then left = 0 end
  return applied({ written, left, 0, reset_after })
end

if algo == 'sliding_window' then
  local sub = window / n_subs
  local cur = idiv(now, sub)
  local live, count, newest = {}, 0, nil
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    local idx, c = tonumber(fields[i]), tonumber(fields[i + 1])
    if idx <= cur - n_subs then
      redis.call('HDEL', KEYS[1], fields[i])
    elseif idx <= cur then
      count = count + c
      if not newest or idx > newest then newest = idx end
    end
  end
  for _, a in ipairs(admitted) do
    local at = now - a[1]
    local idx = idiv(at, sub)
    if a[2] > 0 and idx > cur - n_subs then
      redis.call('HINCRBY', KEYS[1], int(idx), a[2])
      written = written + a[2]
      count = count + a[2]
      if not newest or idx > newest then newest = idx end
    end
  end
  local reset_after = 0
  if newest then reset_after = (newest + n_subs) * sub - now end
  if written > 0 then redis.call('PEXPIRE', KEYS[1], int(reset_after)) end
  local left = limit - count
  if left < 0 then left = 0 end
  return applied({ written, left, 0, reset_after })
end

-- fixed_window: only the window holding now is stored; grants of windows that have passed are dropped.
local state = redis.call('HMGET', KEYS[1], 'start', 'count')
local start, count = tonumber(state[1]), tonumber(state[2]) or 0
local ends_at = nil
if align == -2 then
  local b = { tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]) }
  if not (b[1] and b[2] and b[3] and b[4]) or b[1] >= b[2] or b[2] >= b[3] or b[3] >= b[4] then
    return redis.error_reply('ERR window_charge: bad window boundaries (b0 < b1 < b2 < b3)')
  end
  local s = nil
  for i = 1, 3 do
    if now >= b[i] and now < b[i + 1] then s, ends_at = b[i], b[i + 1] end
  end
  if not s then
    return redis.error_reply('ERR window_charge: the server clock is outside the windows sent (clock skew above a window)')
  end
  if start ~= s then start, count = s, 0 end
elseif align >= 0 then
  local s = idiv(now + align, window) * window - align
  if start ~= s then start, count = s, 0 end
elseif start == nil or now >= start + window or now < start then
  -- A rolling window that has ended opens again at the first grant still less than a window old.
  local first = nil
  for _, a in ipairs(admitted) do
    local at = now - a[1]
    if a[2] > 0 and at + window > now and (not first or at < first) then first = at end
  end
  if not first then return applied({ 0, limit, 0, 0 }) end
  start, count = first, 0
end
local ends_in = (ends_at or (start + window)) - now
for _, a in ipairs(admitted) do
  local at = now - a[1]
  if a[2] > 0 and at >= start then
    written = written + a[2]
  end
end
count = count + written
if written > 0 then
  redis.call('HSET', KEYS[1], 'start', int(start), 'count', int(count))
  redis.call('PEXPIRE', KEYS[1], int(ends_in))
end
local reset_after = 0
if count > 0 then reset_after = ends_in end
local left = limit - count
if left < 0 then left = 0 end
return applied({ written, left, 0, reset_after })
