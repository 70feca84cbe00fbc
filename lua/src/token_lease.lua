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
