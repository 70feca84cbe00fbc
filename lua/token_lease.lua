-- lua/token_lease.lua: GENERATED from lua/lib/common.lua, lua/lib/bucket.lua and lua/src/token_lease.lua,
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

-- lib/bucket.lua — the token bucket's hash, read, converted and written alike by every token script
-- (token_bucket.lua, token_lease.lua, token_acquire.lua, token_return.lua): src/store/script.rs puts it, after
-- lib/common.lua, in front of each of them, since Redis runs every script on its own. Mirrors
-- src/algorithm/token_bucket.rs and src/algorithm/room.rs.

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
-- The bucket at `now` (invariant 11): nil when missing (full); else the stored level refilled since ts and
-- converted to the parameters in force. Those are the call's (capacity, rate, per, adopted), unless the hash records
-- parameters adopted later (`adopted`: ms since the Unix epoch at which a process took them, at its start or at the
-- reload that changed them): then the hash's, so a call of a process that has not reloaded yet, or a late give-back
-- of a lease taken before a reload, converts the bucket and never overwrites its parameters. Across a change of
-- parameters the time since ts refills at the lower rate (tokens per ms): a reload that lowers the rate applies from
-- the bucket's last write, one that raises it from this call. The level is capped at the capacity it was computed
-- with, rescaled to the per in force and capped at that capacity. A key written before capacity and rate were
-- recorded reads them as this call's. The third value says whether the bucket was computed with the parameters in
-- force (a call that changes nothing then writes nothing; a call adopted later than the hash says with the same
-- parameters writes its `adopted` alone). The fourth is `pend`: tokens that paced leases were granted and have not
-- released yet (token_lease.lua), an upper bound kept as `pend` tokens at `pend_ts` falling linearly to 0 at
-- `pend_end` (ms). The fifth says whether the bucket keeps notes of room (note_room: a lease since it was last full
-- or reloaded). The sixth is { capacity, rate, per, adopted } in force. The seventh is `held`: the tokens processes
-- hold for an outage (`h:{holder}` = "tokens:until_ms:seq", their sum `held`; src/algorithm/hold.rs). The level
-- refills to at most capacity − pend − held: the level, the tokens still to be released and those held never make
-- more than the capacity together. Holds that ended by now leave (once now reaches `held_next`, the earliest end,
-- the records are read): the level is refilled up to each end, earliest first, under the top it had then, before
-- the refill to now; HOLDS keeps what save_bucket writes of them.
local HOLDS = nil
local function parse_hold(raw) -- a hold record "tokens:until_ms:seq" as three numbers (nil when malformed)
  local t, u, q = string.match(raw, '^(%d+):(%d+):(%d+)$')
  return tonumber(t), tonumber(u), tonumber(q)
end
local function pend_at(s, t) -- the pending line of load_bucket's HMGET `s` at t (ms)
  local pend, from, pend_end = tonumber(s[6]) or 0, tonumber(s[7]) or t, tonumber(s[8]) or 0
  if pend <= 0 or t >= pend_end then return 0 end
  if t > from then return cdiv(pend * (pend_end - t), pend_end - from) end
  return pend
end
local function load_bucket(key, capacity, rate, per, adopted, now)
  local s = redis.call('HMGET', key, 'level', 'ts', 'per', 'capacity', 'rate', 'pend', 'pend_ts', 'pend_end',
    'rooms_from', 'adopted', 'held', 'held_next', 'held_last')
  local level, ts = tonumber(s[1]), tonumber(s[2])
  HOLDS = { held = 0, next = 0, last = 0, ended = {} }
  if level == nil or ts == nil then return nil, now, true, 0, false, { capacity, rate, per, adopted }, 0 end
  local was_per, was_capacity = tonumber(s[3]) or per, tonumber(s[4]) or capacity
  local was_rate, was_adopted = tonumber(s[5]) or rate, tonumber(s[10]) or 0
  if was_per < 1 then was_per = per end
  if adopted < was_adopted then
    capacity, rate, per, adopted = was_capacity, was_rate, was_per, was_adopted
  end
  local same = was_per == per and was_capacity == capacity and was_rate == rate
  if same and adopted > was_adopted then redis.call('HSET', key, 'adopted', int(adopted)) end
  -- A lowered rate applies from the last write: the level is converted there, before anything refills.
  if not same and rate * was_per < was_rate * per then
    if level > was_capacity * was_per then level = was_capacity * was_per end
    level = rescale(level, was_per, per)
    if level > capacity * per then level = capacity * per end
    was_capacity, was_rate, was_per = capacity, rate, per
  end
  local held = tonumber(s[11]) or 0
  HOLDS = { held = held, had = held, next = tonumber(s[12]) or 0, last = tonumber(s[13]) or 0, ended = {} }
  if held > 0 and now >= HOLDS.next then
    local all, ended = redis.call('HGETALL', key), {}
    HOLDS.next, HOLDS.last = 0, 0
    for i = 1, #all, 2 do
      if string.sub(all[i], 1, 2) == 'h:' then
        local t, u = parse_hold(all[i + 1])
        if u <= now then
          ended[#ended + 1] = { u, all[i], t }
        else
          if HOLDS.next == 0 or u < HOLDS.next then HOLDS.next = u end
          if u > HOLDS.last then HOLDS.last = u end
        end
      end
    end
    table.sort(ended, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
    for _, e in ipairs(ended) do
      if e[1] > ts then
        local top = (was_capacity - pend_at(s, e[1]) - held) * was_per
        if level > was_capacity * was_per then level = was_capacity * was_per end
        level = level + (e[1] - ts) * was_rate
        if level > top then level = top end
        ts = e[1]
      end
      held = held - e[3]
    end
    HOLDS.held, HOLDS.ended = held, ended
  end
  local elapsed = 0
  if now > ts then
    elapsed = now - ts
    ts = now
  end
  if level > was_capacity * was_per then level = was_capacity * was_per end
  level = level + elapsed * was_rate
  if level > was_capacity * was_per then level = was_capacity * was_per end
  level = rescale(level, was_per, per)
  if level > capacity * per then level = capacity * per end
  -- Rooms noted under other parameters mean nothing under these (note_room): a reload forgets them. Every caller
  -- that gets `same = false` saves the bucket.
  if not same then redis.call('HDEL', key, 'rooms_from', 'stamps', 'rooms') end
  local noted = same and tonumber(s[9]) ~= nil
  local params = { capacity, rate, per, adopted }
  local pend = pend_at(s, now)
  if level > (capacity - pend - held) * per then level = (capacity - pend - held) * per end
  return level, ts, same, pend, noted, params, held
end
-- A token call's bucket: now (ARGV[now_arg], else TIME) and when the caller adopted its parameters (ARGV[now_arg + 1],
-- ms since the Unix epoch; absent: 0), then load_bucket's level (full when the hash is missing), ts, same, pend,
-- noted and held, the parameters in force (the hash's, when adopted later), full = capacity × per, and whether the
-- hash was missing.
local function open_bucket(key, capacity, rate, per, now_arg)
  local now = now_of(now_arg)
  local adopted = tonumber(ARGV[now_arg + 1]) or 0
  local level, ts, same, pend, noted, force, held = load_bucket(key, capacity, rate, per, adopted, now)
  capacity, rate, per, adopted = force[1], force[2], force[3], force[4]
  local full = capacity * per
  return now, level or full, ts, same, pend, noted, held, capacity, rate, per, adopted, full, level == nil
end
-- ms until a level l (in 1/per tokens) is full again at rate units a ms; -1: never (rate 0).
local function refill_ms(l, full, rate)
  if l >= full then return 0 elseif rate == 0 then return -1 else return cdiv(full - l, rate) end
end
-- The whole tokens of a level l (in 1/per tokens): 0 in debt.
local function whole_tokens(l, per) if l < 0 then return 0 end return idiv(l, per) end
-- The room below the top of a bucket at level l (in 1/per tokens), in whole tokens: its capacity less what is pending
-- and held, less the level.
local function room_of(l, per, capacity, pend, held) return idiv((capacity - pend - held) * per - l, per) end
-- Takes between need and max whole tokens of a level l (in 1/per tokens) of a bucket with pend pending and held
-- held: all there is up to max when need are there (max 0 takes none: a peek). Returns the tokens granted, the
-- level after, retry_after (0 when need are there; -1 never: need > capacity, or rate 0; else ms until they are)
-- and the room before the take (what note_room records).
local function take(l, per, capacity, rate, pend, held, need, max)
  local room = room_of(l, per, capacity, pend, held)
  local tokens = idiv(l, per)
  if need > capacity then return 0, l, -1, room end
  if tokens >= need then
    local granted = tokens
    if granted > max then granted = max end
    return granted, l - granted * per, 0, room
  end
  if rate == 0 then return 0, l, -1, room end
  return 0, l, cdiv(need * per - l, rate), room
end
-- Stores the bucket with the parameters it is computed with and when they were adopted (0: not said), and with
-- `pace` = { pend, pend_end } the tokens a paced lease left to release (token_lease.lua; pend_ts = ts), and its
-- holds (HOLDS). A full bucket is deleted (it equals a missing key) unless paced; any other expires when it would
-- be full again, no pace is left and its holds have ended and refilled, never at rate 0 (expiring would refill a
-- stock).
local function save_bucket(key, level, ts, capacity, rate, per, adopted, pace)
  local full = capacity * per
  -- The holds as load_bucket and a lease's hold step (token_lease.lua) left them.
  if HOLDS then
    for _, e in ipairs(HOLDS.ended) do redis.call('HDEL', key, e[2]) end
    local r = HOLDS.record
    if r and r[2] > 0 then
      redis.call('HSET', key, r[1], int(r[2]) .. ':' .. int(r[3]) .. ':' .. int(r[4]))
    elseif r then
      redis.call('HDEL', key, r[1])
    end
    if HOLDS.held > 0 then
      redis.call('HSET', key, 'held', int(HOLDS.held), 'held_next', int(HOLDS.next), 'held_last', int(HOLDS.last))
    elseif (HOLDS.had or 0) > 0 then
      redis.call('HDEL', key, 'held', 'held_next', 'held_last')
    end
  end
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
  if adopted > 0 then
    f[#f + 1] = 'adopted'
    f[#f + 1] = int(adopted)
  end
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
  -- Held tokens leave at their hold's end, then refill.
  if HOLDS and HOLDS.held > 0 and HOLDS.last > ts and HOLDS.last - ts + cdiv(full - level, rate) > ttl then
    ttl = HOLDS.last - ts + cdiv(full - level, rate)
  end
  redis.call('PEXPIRE', key, int(ttl))
end

-- Notes a change of the bucket's level (src/algorithm/room.rs), after save_bucket (a bucket deleted full keeps
-- no notes): its stamp (ms × 1000 plus a count within the ms, only growing) and `room`, the whole tokens the level
-- could take up to the top just before the change, in the staircase `rooms` ("stamp:room,...", stamps and rooms
-- increasing; a new step removes the earlier ones with as much room; beyond 16 steps the two neighbours whose
-- rooms differ least merge into the later stamp with the lower room). A lease's grant starts the notes
-- (`rooms_from`, its stamp); any other change is noted only once they have started. A give-back first lowers,
-- for each { stamp, added } of `fills` (the tokens it added from the lease so stamped), every room noted after
-- that stamp by them (the level would have been that much higher there). Returns the stamp, 0 when nothing is
-- noted.
local function note_room(key, room, lease, now, fills)
  local s = redis.call('HMGET', key, 'level', 'rooms_from', 'stamps', 'rooms')
  local from, last = tonumber(s[2]) or 0, tonumber(s[3]) or 0
  if not s[1] or (from == 0 and not lease) then return 0 end
  local stamp = last + 1
  if now * 1000 > stamp then stamp = now * 1000 end
  if from == 0 then from = stamp end
  local steps = {}
  for m, r in string.gmatch(s[4] or '', '(%d+):(%d+)') do
    steps[#steps + 1] = { tonumber(m), tonumber(r) }
    for _, f in ipairs(fills or {}) do
      if steps[#steps][1] > f[1] then steps[#steps][2] = steps[#steps][2] - f[2] end
    end
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

-- token_lease.lua — lease tokens from a token bucket, taking turns when it is saturated (invariant 18).
--
-- KEYS[1]  the bucket: the hash of token_bucket.lua (level, ts, per, capacity, rate), plus
--          turn = ms of the last turn handed out (absent: none)
-- ARGV[1]  capacity   tokens, integer ≥ 1 (the burst)
-- ARGV[2]  rate       tokens added per `per_ms`, integer ≥ 0 (0: a stock that never refills)
-- ARGV[3]  per_ms     integer ≥ 1
-- ARGV[4]  min        tokens, integer ≥ 1: grant nothing unless at least this many are there
-- ARGV[5]  max        tokens, integer ≥ min: grant at most this many
-- ARGV[6]  batch      tokens, integer ≥ 0: what the caller's leases are sized for, which spaces the turns (0: a
--                     probe, handed no turn)
-- ARGV[7]  chunk      tokens, integer ≥ 0: a paced lease (0: not paced) releases its grant to its callers in chunks
--                     of this many tokens,
-- ARGV[8]  chunk_ms   integer ≥ 0: one every this many ms from when it was sent, each spent within the lease TTL of
--                     its release (invariant 1)
-- ARGV[9]  now_ms     optional; when absent the Redis server's TIME is used (tests pass it to replay sequences)
-- ARGV[10] adopted_ms optional, after now_ms (then given, or empty for TIME): when the caller adopted these
--                     parameters, ms since the Unix epoch (absent: 0); lib/bucket.lua's load_bucket decides a call
--                     adopted before the hash's `adopted` with the hash's parameters
-- ARGV[11] holder     optional, after adopted_ms (then given, 0 when not said): a hold for an outage (the reserve of
--                     fail_mode "local", src/algorithm/hold.rs): who holds, a name unique per process; then
-- ARGV[12] seq        the holder's call number, growing: a call numbered at most its record's changes nothing
-- ARGV[13] held       tokens the holder still holds of what it was last told
-- ARGV[14] want       tokens it wants to hold
-- ARGV[15] hold_ms    how long from now the hold lasts
--
-- Reply: { granted, remaining, retry_after_ms, reset_after_ms, stamp, held }
--   granted         tokens granted: 0, or between min and max
--   remaining       whole tokens left after this call
--   retry_after_ms  0 when at least `min` tokens are left; else ms until the caller's turn (at least until `min` tokens
--                   are there on a refusal); -1 when never (min > capacity, or rate 0)
--   reset_after_ms  ms until the bucket is full again; -1 when never (rate 0)
--   stamp            a grant's stamp in the bucket's notes of room (note_room), 0 on a refusal: the give-back of its
--                   unspent tokens sends it (token_return.lua's `since`), so they add no more than the room the
--                   bucket had since
--   held            tokens the holder holds after this call (0 without a hold, or for a call applied already)
--
-- It takes as token_bucket.lua does (the same bucket, refill, reloads and expiry). A call that leaves fewer than
-- `min` tokens behind (the same call again would be refused) is handed the bucket's next turn:
-- turn = max(turn, now) + spacing, spacing = ceil(3 × ceil(batch × per_ms / rate) / 5) ms (three fifths of the
-- refill of a batch, at least 1; batch capped at capacity), and retry_after_ms is the wait for it. So the processes
-- of a saturated key call one after another, a turn's refill apart, however many they are. The turn lives in the
-- bucket's hash: a full bucket (deleted) has none. A call that finds the bucket within a batch of its top (its
-- refill is being lost), and a probe that is granted tokens, show that the turns handed are not being taken: the
-- line restarts from now.
--
-- Paced leases: a process that spends a saturated bucket's turn slowly (100 decisions a second in a fleet of 1000)
-- would bring a TTL's spending per call. A paced grant of n tokens is released in chunks, one every chunk_ms, so
-- one call brings a second's spending or more. It is taken from the level at once, and the bucket remembers it as
-- pending: n tokens falling linearly to 0 over ceil(n / chunk) × chunk_ms, merged with what is pending already
-- into one line from now to the later end (the line over a sum of such falls is above it, so it stays an upper
-- bound of the tokens not released yet). The level then refills to at most capacity − pending (load_bucket): the
-- level plus the tokens to be released is a token bucket that grants each token when its chunk is released, so
-- invariant 1's bound holds with the TTL counted from each chunk's release. Mirrors TokenBucket::lease in src/algorithm/token_bucket.rs,
-- which gives the same replies and stores the same state.

local capacity, rate, per, min, max, batch, chunk, chunk_ms = numbers(1, 8)
if not (capacity and rate and per and min and max and batch and chunk and chunk_ms) or capacity < 1 or rate < 0
    or per < 1 or min < 1 or max < min or batch < 0 or chunk < 0 or chunk_ms < 0 then
  return redis.error_reply('ERR token_lease: bad arguments (capacity, rate, per_ms, min, max, batch, chunk, chunk_ms)')
end
local now_arg = 9
local now, level, ts, same, pend, noted, held, adopted, full
now, level, ts, same, pend, noted, held, capacity, rate, per, adopted, full =
  open_bucket(KEYS[1], capacity, rate, per, now_arg)

local granted, retry_after, room
granted, level, retry_after, room = take(level, per, capacity, rate, pend, held, min, max)

-- The turns handed out are not being taken (their holders' demand fell, or they left) when the bucket is within a
-- batch of its top (its refill is being lost) or a probe (batch 0: a process whose demand fell and that no longer
-- waits for its turn) is granted what they left: the line of turns starts again from now.
local b = batch
if b > capacity then b = capacity end
if (b > 0 and room < b) or (b == 0 and granted > 0) then redis.call('HDEL', KEYS[1], 'turn') end
-- The caller drained the bucket (the same call again would be refused): it is handed the next turn.
local turn = nil
if rate > 0 and batch > 0 and retry_after ~= -1 and whole_tokens(level, per) < min then
  turn = tonumber(redis.call('HGET', KEYS[1], 'turn') or '0') or 0
  if turn < now then turn = now end
  local spacing = cdiv(3 * cdiv(b * per, rate), 5)
  if spacing < 1 then spacing = 1 end
  turn = turn + spacing
  if turn - now > retry_after then retry_after = turn - now end
end

-- A paced grant of more than one chunk is pending until its last chunk is released.
local pace = nil
if chunk > 0 and chunk_ms > 0 and granted > chunk then
  local pend_end = now + cdiv(granted, chunk) * chunk_ms
  local was_end = tonumber(redis.call('HGET', KEYS[1], 'pend_end') or '0') or 0
  if pend > 0 and was_end > pend_end then pend_end = was_end end
  pace = { pend + granted, pend_end }
end

-- Last, the caller's hold for an outage (src/algorithm/hold.rs): the lower of its record and what it says it still
-- holds, what is beyond `want` back to the level or topped up to `want` from it, until now + hold_ms. A call
-- numbered at most its record's (applied already) changes nothing and is told it holds nothing.
local hold, held_now = false, 0
local holder = ARGV[now_arg + 2]
if holder and holder ~= '' then
  local seq, says, want, hold_ms = numbers(now_arg + 3, now_arg + 6)
  if not (seq and says and want and hold_ms) or seq < 0 or says < 0 or want < 0 or hold_ms < 0 then
    return redis.error_reply('ERR token_lease: bad hold arguments (holder, seq, held, want, hold_ms)')
  end
  local field, rec_tokens, rec_seq = 'h:' .. holder, nil, nil
  local gone = false
  for _, e in ipairs(HOLDS.ended) do if e[2] == field then gone = true end end
  local raw = (not gone) and redis.call('HGET', KEYS[1], field)
  if raw then
    local t, _, q = parse_hold(raw)
    rec_tokens, rec_seq = t, q
  end
  if not (rec_seq and seq <= rec_seq) then
    local unspent = rec_tokens or 0
    if says < unspent then unspent = says end
    local kept = unspent
    if want < kept then kept = want end
    local taken = want - kept
    if taken > whole_tokens(level, per) then taken = whole_tokens(level, per) end
    held_now = kept + taken
    if rec_tokens or held_now > 0 then
      hold = true
      level = level - taken * per + (unspent - kept) * per
      HOLDS.held = HOLDS.held - (rec_tokens or 0) + held_now
      local ends = now + hold_ms
      HOLDS.record = { field, held_now, ends, seq }
      if HOLDS.held == 0 then
        HOLDS.next, HOLDS.last = 0, 0
      elseif held_now > 0 then
        if HOLDS.next == 0 or ends < HOLDS.next then HOLDS.next = ends end
        if ends > HOLDS.last then HOLDS.last = ends end
      end
    end
  end
end

if granted > 0 or not same or hold then save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted, pace) end
if turn and level < full then redis.call('HSET', KEYS[1], 'turn', int(turn)) end
local stamp = 0
if granted > 0 then stamp = note_room(KEYS[1], room, true, now) end
return { granted, whole_tokens(level, per), retry_after, refill_ms(level, full, rate), stamp, held_now }
