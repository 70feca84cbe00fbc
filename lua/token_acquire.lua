-- token_acquire.lua — a token bucket for callers that wait instead of being refused, with Guava's "consume now,
-- pay later" (its SmoothBursty RateLimiter): a caller not behind a debt takes its tokens at once, even more than
-- are there, and the bucket goes into debt; a caller behind a debt waits until it is repaid, then takes its
-- tokens, deepening the debt for the next one. Same hash as token_bucket.lua, whose callers are refused while
-- the bucket is in debt.
--
-- KEYS[1]  the bucket (a hash: level = tokens × per_ms, negative in debt; ts; per, capacity, rate)
-- ARGV[1]  capacity     tokens, integer ≥ 1
-- ARGV[2]  rate         tokens added per per_ms, integer ≥ 0
-- ARGV[3]  per_ms       integer ≥ 1
-- ARGV[4]  cost         tokens, integer ≥ 1
-- ARGV[5]  max_wait_ms  the longest the caller may wait
-- ARGV[6]  now_ms       optional; when absent the Redis server's TIME is used
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms }
--   granted         cost, or 0 when the wait would exceed max_wait_ms (or never ends: cost > capacity, or rate 0
--                   and too few tokens)
--   remaining       whole tokens left (0 in debt)
--   retry_after_ms  granted: how long to wait before using the tokens (the debt ahead); refused: until the
--                   wait would fit in max_wait_ms, -1 never
--   reset_after_ms  until the bucket is full again
-- The time since the last call refills (or repays the debt) at the parameters the hash records, then the level is
-- converted to this call's, as in token_bucket.lua (invariant 11): a debt taken at the old rate is repaid at it until
-- the change (Guava's testBurstyAndUpdate). A refusal writes nothing unless that conversion happened.
-- Mirrors TokenBucket::acquire in src/algorithm/token_bucket.rs, which gives the same replies and stores the same
-- state.

local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return idiv(a + b - 1, b) end -- ceil(a / b) for integers, b ≥ 1
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'
local function gcd(a, b) -- greatest common divisor of integers ≥ 1
  while b > 0 do a, b = b, a - idiv(a, b) * b end
  return a
end
-- `level` in 1/`from` token as 1/`to` token, rounded down: with g = gcd(from, to), o = from / g, p = to / g
-- and level = q·o + r, it is q·p + floor(r·p / o), exact; where o·p reaches 2^53 the second term (under a token)
-- is dropped.
local function rescale(level, from, to)
  if from == to then return level end
  local g = gcd(from, to)
  local o, p = idiv(from, g), idiv(to, g)
  local q = idiv(level, o)
  if o * p < 9007199254740992 then return q * p + idiv((level - q * o) * p, o) end
  return q * p
end
-- The bucket at `now` in this call's parameters (invariant 11): nil when missing (full); else the stored level
-- refilled since ts at the parameters it was computed with, capped at that capacity, then rescaled to this per and
-- capped at this capacity. A key written before capacity and rate were recorded reads them as this call's. The third
-- value says whether it was computed with this call's parameters (a call that changes nothing then writes nothing).
-- The fourth is `pend`: tokens that paced leases were granted and have not released yet (token_lease.lua), an
-- upper bound kept as `pend` tokens at `pend_ts` falling linearly to 0 at `pend_end` (ms). The level refills to at
-- most capacity − pend: the level and the tokens still to be released never hold more than the capacity together.
-- The fifth says whether the bucket keeps notes of room (note_room: a lease since it was last full or reloaded).
local function load_bucket(key, capacity, rate, per, now)
  local s = redis.call('HMGET', key, 'level', 'ts', 'per', 'capacity', 'rate', 'pend', 'pend_ts', 'pend_end',
    'rooms_from')
  local level, ts = tonumber(s[1]), tonumber(s[2])
  if level == nil or ts == nil then return nil, now, true, 0, false end
  local was_per, was_capacity = tonumber(s[3]) or per, tonumber(s[4]) or capacity
  local was_rate = tonumber(s[5]) or rate
  if was_per < 1 then was_per = per end
  if now > ts then
    level = level + (now - ts) * was_rate
    ts = now
  end
  if level > was_capacity * was_per then level = was_capacity * was_per end
  level = rescale(level, was_per, per)
  if level > capacity * per then level = capacity * per end
  local same = was_per == per and was_capacity == capacity and was_rate == rate
  -- Rooms noted under other parameters mean nothing under these (note_room): a reload forgets them. Every caller
  -- that gets `same = false` saves the bucket.
  if not same then redis.call('HDEL', key, 'rooms_from', 'stamps', 'rooms') end
  local noted = same and tonumber(s[9]) ~= nil
  local pend, pend_end = tonumber(s[6]) or 0, tonumber(s[8]) or 0
  if pend <= 0 or now >= pend_end then return level, ts, same, 0, noted end
  local from = tonumber(s[7]) or now
  if now > from then pend = cdiv(pend * (pend_end - now), pend_end - from) end
  if level > (capacity - pend) * per then level = (capacity - pend) * per end
  return level, ts, same, pend, noted
end
-- Stores the bucket with the parameters it is computed with, and with `pace` = { pend, pend_end } the tokens a
-- paced lease left to release (token_lease.lua; pend_ts = ts). A full bucket is deleted (it equals a missing key)
-- unless paced; any other expires when it would be full again and no pace is left, never at rate 0 (expiring
-- would refill a stock).
local function save_bucket(key, level, ts, capacity, rate, per, pace)
  local full = capacity * per
  -- A paced bucket keeps its hash, full or not, until its leases have released everything.
  local pend_end = redis.call('HGET', key, 'pend_end')
  local paced = (tonumber(pend_end or '0') or 0) - ts
  if pace then paced = pace[2] - ts end
  if level >= full and paced <= 0 then
    redis.call('DEL', key)
    return
  end
  if level > full then level = full end
  -- Pending fields whose line has ended go: the hash then reads as one no paced lease has written.
  if not pace and paced <= 0 and pend_end then redis.call('HDEL', key, 'pend', 'pend_ts', 'pend_end') end
  local f = { 'level', int(level), 'ts', int(ts), 'per', int(per), 'capacity', int(capacity), 'rate', int(rate) }
  if pace then
    for _, v in ipairs({ 'pend', int(pace[1]), 'pend_ts', int(ts), 'pend_end', int(pace[2]) }) do f[#f + 1] = v end
  end
  redis.call('HSET', key, unpack(f))
  if rate == 0 then
    redis.call('PERSIST', key)
    return
  end
  local ttl = cdiv(full - level, rate)
  if paced > ttl then ttl = paced end
  redis.call('PEXPIRE', key, int(ttl))
end

-- Notes a change of the bucket's level (src/algorithm/room.rs), after save_bucket (a bucket deleted full keeps
-- no notes): its stamp (ms × 1000 plus a count within the ms, only growing) and `room`, the whole tokens the level
-- could take up to the top just before the change, in the staircase `rooms` ("stamp:room,...", stamps and rooms
-- increasing; a new step removes the earlier ones with as much room; beyond 16 steps the two neighbours whose
-- rooms differ least merge into the later stamp with the lower room). A lease's grant starts the notes
-- (`rooms_from`, its stamp); any other change is noted only once they have started. A give-back that added
-- `added` tokens from the lease stamped `since` first lowers every room noted after that stamp by them (the level
-- would have been that much higher there). Returns the stamp, 0 when nothing is noted.
local function note_room(key, room, lease, now, since, added)
  local s = redis.call('HMGET', key, 'level', 'rooms_from', 'stamps', 'rooms')
  local from, last = tonumber(s[2]) or 0, tonumber(s[3]) or 0
  if not s[1] or (from == 0 and not lease) then return 0 end
  local stamp = last + 1
  if now * 1000 > stamp then stamp = now * 1000 end
  if from == 0 then from = stamp end
  local steps = {}
  for m, r in string.gmatch(s[4] or '', '(%d+):(%d+)') do
    steps[#steps + 1] = { tonumber(m), tonumber(r) }
    if since and steps[#steps][1] > since then steps[#steps][2] = steps[#steps][2] - added end
  end
  while #steps > 0 and steps[#steps][2] >= room do steps[#steps] = nil end
  if #steps == 16 then
    local i, least = 1, nil
    for j = 1, 15 do
      local rise = steps[j + 1][2] - steps[j][2]
      if rise < 0 then rise = 0 end
      if least == nil or rise < least then i, least = j, rise end
    end
    if steps[i][2] < steps[i + 1][2] then steps[i + 1][2] = steps[i][2] end
    table.remove(steps, i)
  end
  steps[#steps + 1] = { stamp, room }
  local f = {}
  for i, step in ipairs(steps) do f[i] = int(step[1]) .. ':' .. int(step[2]) end
  redis.call('HSET', key, 'rooms_from', int(from), 'stamps', int(stamp), 'rooms', table.concat(f, ','))
  return stamp
end

local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local per = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local max_wait = tonumber(ARGV[5])
local now_arg = 6
if not (capacity and rate and per and cost and max_wait) or capacity < 1 or rate < 0 or per < 1 or cost < 1 or max_wait < 0 then
  return redis.error_reply('ERR token_acquire: bad arguments (capacity, rate, per_ms, cost, max_wait_ms)')
end
local now = tonumber(ARGV[now_arg]) -- now_ms when given, else the Redis server's TIME
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end

local full = capacity * per
local level, ts, same, pend, noted = load_bucket(KEYS[1], capacity, rate, per, now)
if level == nil then level = full end
local function reset_after_of(l)
  if l >= full then return 0 elseif rate == 0 then return -1 else return cdiv(full - l, rate) end
end
local function left(l) if l < 0 then return 0 end return idiv(l, per) end

if cost > capacity or (rate == 0 and level < cost * per) then
  if not same then save_bucket(KEYS[1], level, ts, capacity, rate, per) end
  return { 0, left(level), -1, reset_after_of(level) }
end
local wait = 0
if level < 0 then wait = cdiv(-level, rate) end
if wait > max_wait then
  if not same then save_bucket(KEYS[1], level, ts, capacity, rate, per) end
  return { 0, left(level), wait - max_wait, reset_after_of(level) }
end
local room = idiv((capacity - pend) * per - level, per)
level = level - cost * per
save_bucket(KEYS[1], level, ts, capacity, rate, per)
if noted then note_room(KEYS[1], room, false, now) end
return { cost, left(level), wait, reset_after_of(level) }
