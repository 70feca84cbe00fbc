-- lua/token_return.lua: GENERATED from lua/lib/common.lua, lua/lib/bucket.lua and lua/src/token_return.lua,
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

-- token_return.lua — give leased but unused tokens back to a token bucket, capped at its capacity.
--
-- KEYS[1]  the bucket (same hash as token_bucket.lua: level = tokens × per_ms, ts, per, capacity, rate)
-- KEYS[2]  optional: the call's mark, `<bucket>:return:<id>` with an id unique to this call. A call whose mark
--          exists was applied already (its reply was lost, say, to a connection dropped after the script ran and
--          retried) and is not applied again: the reply gives what it added then, and the bucket as it is now. A
--          give-back applied sets its mark to the tokens it added for mark_ms (its retries).
-- ARGV[1]  capacity   tokens, integer ≥ 1
-- ARGV[2]  rate       tokens per `per_ms`, integer ≥ 0
-- ARGV[3]  per_ms     integer ≥ 1
-- ARGV[4]  tokens     tokens given back, integer ≥ 0
-- ARGV[5]  now_ms     optional; when absent the Redis server's TIME is used
-- With the mark:
-- ARGV[5]  mark_ms    integer ≥ 0: how long the mark is kept, longer than the call and its retries may take; 0:
--                     10 s (until 2026-11-28 this argument was a debit's hold, when a negative count charged the
--                     bucket with what fail_mode "local" sold alone; nothing is sold on credit any more)
-- ARGV[6]  since      the leases the tokens given back came from, each named by its stamp (token_lease.lua's
--                     fifth integer): `stamp:tokens` pairs joined by commas, their tokens summing to ARGV[4]; or
--                     one stamp, all the tokens that lease's; -1 when none (a caller that keeps no stamps)
-- ARGV[7]  now_ms     optional, as above
-- ARGV[6], or ARGV[8] with the mark: adopted_ms, optional, after now_ms (then given, or empty for TIME): when the
--          caller adopted these parameters, ms since the Unix epoch (absent: 0); lib/bucket.lua's load_bucket
--          decides a call adopted before the hash's `adopted` with the hash's parameters
--
-- Reply: { accepted, remaining, 0, reset_after_ms }
--   accepted        whole tokens actually added (what would overflow the capacity, less the tokens paced leases
--                   have yet to release, is dropped; with `since`, each lease's tokens at most the lowest room
--                   the bucket had at a change after its stamp, note_room: tokens the refill replaced while they
--                   were out count once)
--   remaining       whole tokens in the bucket afterwards (0 in debt)
--   reset_after_ms  ms until the bucket is full again; -1 when never (rate 0)
-- A missing key is a full bucket: nothing can be added to it. The time since the last call refills at the
-- parameters the hash records, then the level is converted to this call's, as in token_bucket.lua (invariant 11).
-- Mirrors src/algorithm/token_bucket.rs, which gives the same replies and stores the same state.

local capacity, rate, per, n = numbers(1, 4)
local mark_ms, since = 0, '-1'
local now_arg = 5
if KEYS[2] then mark_ms, since, now_arg = numbers(5, 5), ARGV[6] or '-1', 7 end
-- `lent`: { stamp, tokens } of each lease named, nil when none.
local lent, sum = nil, n
if tonumber(since) then
  if tonumber(since) >= 0 then lent = { { tonumber(since), n } } end
else
  lent, sum = {}, 0
  for m, k in string.gmatch(since, '(%d+):(%d+)') do
    lent[#lent + 1] = { tonumber(m), tonumber(k) }
    sum = sum + tonumber(k)
  end
end
if not (capacity and rate and per and n and mark_ms) or capacity < 1 or rate < 0 or per < 1 or n < 0
    or mark_ms < 0 or sum ~= n or (lent and #lent == 0) then
  return redis.error_reply('ERR token_return: bad arguments (capacity, rate, per_ms, tokens, [mark_ms, since])')
end
if mark_ms == 0 then mark_ms = 10000 end
local mark = KEYS[2]
local now, level, ts, pend, noted, held, adopted, full, missing, _
now, level, ts, _, pend, noted, held, capacity, rate, per, adopted, full, missing =
  open_bucket(KEYS[1], capacity, rate, per, now_arg)
local added = mark and tonumber(redis.call('GET', mark))
if missing then
  -- Nothing to add to a full bucket; the mark still says so, or a retry after a take would add.
  if mark and not added then redis.call('SET', mark, '0', 'PX', int(mark_ms)) end
  return { added or 0, capacity, 0, 0 }
end
local function reply(accepted) -- remaining: 0 still in debt
  return { accepted, whole_tokens(level, per), 0, refill_ms(level, full, rate) }
end
if added then return reply(added) end -- applied already: nothing is written

local room = room_of(level, per, capacity, pend, held)
local before = idiv(level, per)
-- A give-back of leases' tokens lowers the rooms noted after each stamp by what that lease's tokens added.
local fills = nil
if lent then
  -- Each lease's tokens: at most the room now (less what the others added) and the lowest noted after its stamp
  -- (note_room); nothing when the notes do not reach back to it. The rooms noted after the stamp are then lower
  -- by what they added, so no other lease's tokens, in this give-back or a later one, fill the same room.
  local s = redis.call('HMGET', KEYS[1], 'rooms_from', 'rooms')
  local from = tonumber(s[1]) or 0
  local notes = {}
  for m, r in string.gmatch(s[2] or '', '(%d+):(%d+)') do notes[#notes + 1] = { tonumber(m), tonumber(r) } end
  fills, n = {}, 0
  for _, l in ipairs(lent) do
    local add = l[2]
    if add > room - n then add = room - n end
    if add < 0 or from == 0 or l[1] < from then add = 0 end
    for _, note in ipairs(notes) do
      if note[1] > l[1] and note[2] < add then add = note[2] end
    end
    for _, note in ipairs(notes) do
      if note[1] > l[1] then note[2] = note[2] - add end
    end
    n = n + add
    fills[#fills + 1] = { l[1], add }
  end
end
level = level + n * per
-- Up to the capacity, less what paced leases have yet to release (load_bucket).
if level > full - (pend + held) * per then level = full - (pend + held) * per end
local accepted = idiv(level, per) - before

save_bucket(KEYS[1], level, ts, capacity, rate, per, adopted)
if noted then note_room(KEYS[1], room, false, now, fills) end
-- A give-back's mark need only outlive the retries of one call (a connection dropped after the script ran).
if mark then redis.call('SET', mark, int(accepted), 'PX', int(mark_ms)) end
return reply(accepted)
