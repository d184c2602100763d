-- sluice: decide a batch of requests ("checks"), one after the other, each
-- against every matching rule held in this Redis slot (every key, on a
-- single node), atomically: a check's rules are all checked, then all
-- committed only if every enforced rule allows. A deny consumes nothing from
-- any rule. The checks are independent: each has its own time, deadline and
-- outcome, and a later check sees what the earlier ones committed, exactly as
-- if each had been its own script call, in the batch's order.
--
-- All arithmetic is in integers, exact to 2^53 in Lua's doubles (the rules
-- package rejects limits whose products would exceed 2^52):
--   token_bucket (0)   one token is `period` units; the bucket gains `limit`
--                      units per ms, up to burst*period units. Lazy refill.
--                      State "t ts pd": units, ms of the last refill, period.
--   sliding_window (1) the sliding-window counter: the previous window's count
--                      weighted by its overlap plus the current count, in
--                      count*ms units, against limit*period.
--                      State "w c p ts": window start, current and previous
--                      counts, ms of the last decision.
--   fixed_window (2)   a counter per window; the caller names the window in
--                      the key and passes the ms left in it.
--   concurrency (3)    a sorted set of leases scored by expiry time.
--   g_counter (4)      a fixed window whose count is a G-Counter (Shapiro et
--                      al. 2011): a hash of per-region counts; this region
--                      adds to its own field only, the others are merged in
--                      by element-wise maximum (merge.lua), and the rule
--                      allows while the sum of the fields stays within the
--                      limit. The caller names the window in the key and
--                      passes the ms left in it, as for fixed_window.
--
-- Arguments. A rule's constants (its algorithm, limit, period, burst, shadow
-- mode and the cost a check takes from it) are sent once per call for each
-- distinct rule in it, as a table the checks' rules point into by an id: a
-- batch of checks of the same rules parses each rule's constants once, and
-- each check names its rules by id (a table lookup by an interned string,
-- about a tenth of a tonumber):
--   KEYS      the checks' rule states, check after check, rule after rule
--   ARGV[1]   this region's name: the field a g_counter rule adds to
--   ARGV[2]   R, the number of distinct rules; then 8 values per rule at
--             3+8*(j-1): its id (any text), algorithm, limit, period_ms,
--             burst, shadow (1 = shadow mode), cost, has_x (1: each check's
--             entry for the rule is followed by x)
--   then, per check: now (ms since the epoch; 0 = Redis TIME), deadline (µs
--             since the epoch on the caller's clock; 0 = none: past it, by
--             Redis TIME, the caller has given up and the check commits
--             nothing), N (its number of rules), then per rule its id and,
--             if the rule has x, x (fixed window and g_counter: ms left in the
--             window; concurrency: the lease id; token bucket: x > 0 is a
--             lease block, extra whole tokens to take, as many as there are up
--             to x, when the check is allowed; x < 0 gives -x leased tokens
--             back before deciding)
--
-- Returns an array of integers, check after check (RESP integers: no number
-- is formatted as text). A check past its deadline is one value, -1. Any
-- other is 6 + 4N values:
--   allowed deny_index wait_ms shadow_index now shadow_wait, then per rule:
--   rem reset took window
--   allowed      1 or 0 (shadow rules never make it 0)
--   deny_index   1-based index of the enforced rule that denied, 0 if none;
--                of several, the one that blocks longest
--   wait_ms      ms until every denying rule can take this cost; -1 when the
--                cost exceeds a rule's capacity and waiting cannot help
--   shadow_index 1-based index of a shadow rule that would have denied, 0 if none
--   now          the time used, ms
--   shadow_wait  ms until the shadow rule at shadow_index could take the cost
--   rem          whole units left in the rule after the decision
--   reset        ms until the rule is back to its full capacity (concurrency:
--                until a slot frees, 0 if one is free)
--   took         1 if the decision consumed from this rule (for refunds), 2 if
--                this rule denied (or, in shadow mode, would have), else 0
--   window       sliding window: the start of the window charged; token
--                bucket: the extra tokens taken for a lease block; else 0
local region = ARGV[1]
local nr = tonumber(ARGV[2])
local floor, min, max = math.floor, math.min, math.max
local function ceildiv(a, b) return floor((a + b - 1) / b) end
-- The rules' constants, by the id the checks name them with (a string: a
-- table lookup by an interned string is about a tenth of a tonumber).
-- K[id] is a rule's constants: algorithm, limit, period, burst, shadow,
-- cost, has_x, the period as text (the state's third field), the TTL base
-- (ms), and the TTL as text with 1 s and 60 s of slack, made on first use (a
-- number passed to redis.call is formatted with '%.14g' on every call).
local K = {}
for j = 1, nr do
  local a = 3 + 8 * (j - 1)
  local alg, limit, period, burst = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local ttl = 0
  if alg == 0 then ttl = ceildiv(burst * period, limit) elseif alg == 1 then ttl = 2 * period end
  K[ARGV[a]] = {alg, limit, period, burst, ARGV[a + 5] == '1', tonumber(ARGV[a + 6]), ARGV[a + 7] == '1', ARGV[a + 3], ttl, false, false, false, false}
end
local function ttl(kt, slack)
  local i = 11
  if slack == 1000 then i = 10 end
  local v = kt[i]
  if not v then
    v = string.format('%d', kt[9] + slack)
    kt[i] = v
  end
  return v
end
local NUM = {}
local function num(s)
  local v = NUM[s]
  if v == nil then v = tonumber(s); NUM[s] = v end
  return v
end
local nargs = #ARGV
local TB, SW, FW, CC, GC = 0, 1, 2, 3, 4
local match, format = string.match, string.format
local call = redis.call
-- Redis TIME, read once for the whole batch (the checks run at one instant).
local clockUs, clockMs
local function clock()
  if not clockUs then
    local t = call('TIME')
    local s, us = tonumber(t[1]), tonumber(t[2])
    clockUs, clockMs = s * 1000000 + us, s * 1000 + floor(us / 1000)
  end
end
-- Per-rule state of the check being decided: an array per rule (no hash
-- part), reused from one check to the next; its fields by index.
local ALG, LIM, PER, COST, TAKE, T, TS, CAP, LAG, C, P, W, E, LEFT, DEN, RET, X, ID, KEEP =
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19
local st = {}
local out, o = {}, 0
-- Reads and writes of the string states (token bucket, sliding window, fixed
-- window), once per key per batch. V holds each key's value as the checks
-- so far left it (false: none), read with one MGET per 1 000 keys (a
-- redis.call costs about as much as a MGET of three keys). MGET answers nil
-- for a key of another type too: a key it found missing is read again by GET
-- on first use (get below), which fails the batch with WRONGTYPE, as a
-- foreign key must, rather than overwrite it. WV holds the value
-- to write, WT how to set its expiry: false keeps the key's TTL (KEEPTTL),
-- else the PX argument, or PXAT's where WA[key] is true. The writes are made once, after the last check: a
-- key that several checks in the batch take from is written once.
local V, WV, WT, WA = {}, {}, {}, {}
do
  local nk, i0 = #KEYS, 1
  while i0 <= nk do
    local i1 = min(nk, i0 + 999)
    local vs = call('MGET', unpack(KEYS, i0, i1))
    for q = i0, i1 do
      local kk = KEYS[q]
      if V[kk] == nil then V[kk] = vs[q - i0 + 1] end
    end
    i0 = i1 + 1
  end
end
-- get returns key's value as the batch's checks so far left it, or false.
local function get(key)
  local v = V[key]
  if v == false then -- missing, or of another type: GET tells which
    v = call('GET', key) or ''
    V[key] = v
  end
  if v == '' then return false end
  return v
end
-- write records key's new value. px is its expiry (PX, ms, as text; with
-- at true PXAT, Unix ms), or false when the key's TTL already covers the
-- new state (see keepTTL). The batch's first write of a key decides from
-- the value the batch read; a later write can only ask for an expiry, never
-- take one back.
local function write(key, v, px, at)
  V[key] = v
  if WV[key] == nil or px then WT[key], WA[key] = px, at end
  WV[key] = v
end
-- keepTTL tells whether a token bucket's or sliding window's key, last
-- written at ts (its state's time) and now written again at now, can keep
-- its TTL. Every write on Redis's clock sets an expiry of at least the start
-- of the next second after it plus the rule's TTL (epochTTL below; older
-- sidecars set now + TTL + 1 s, which is as much), so a key written before
-- in the same second of Redis's clock already lives long enough: the TTL is
-- set at most once per key per second however hot the key. sec is the start
-- of now's second on Redis's clock, false on a caller's clock (replays,
-- tests), which always sets its own TTL.
local function keepTTL(ts, now, sec)
  return sec and ts >= sec and ts <= now or false
end
-- epochTTL is the PXAT of a write on Redis's clock in the second that
-- starts at sec: the TTL base plus 1 s of slack from the start of the next
-- second, as text, made once per rule per batch (the batch's checks on
-- Redis's clock share one now). An absolute time, not a PX from the TIME
-- read: Redis adds a PX to its clock at the SET, which a loaded machine
-- can run a millisecond or more after the TIME (found by a loaded make
-- test: the expiry 1 ms past its bound).
local function epochTTL(kt, sec)
  local v = kt[12]
  if not v or kt[13] ~= sec then
    v = format('%d', kt[9] + 2000 + sec)
    kt[12], kt[13] = v, sec
  end
  return v
end
-- expiry is the PX of a token bucket's or sliding window's write, and true
-- when it is a PXAT (false: keep the key's TTL): see keepTTL and epochTTL.
local function expiry(s, now, sec)
  if s[KEEP] then return false end
  if sec then return epochTTL(s[ID], sec), true end
  return ttl(s[ID], 60000)
end
local p, k = 3 + 8 * nr, 0 -- the next check's first argument; keys used so far

while p <= nargs do
  local now, deadline, n = num(ARGV[p]), tonumber(ARGV[p + 1]), num(ARGV[p + 2])
  p = p + 3
  local late, a = false, p
  -- A check that reached Redis after its caller gave up (a stall, a slow
  -- network) must not commit: the caller has answered by the failure mode,
  -- and a lease or count taken now would belong to nobody.
  if deadline > 0 then
    clock()
    late = clockUs > deadline
  end
  if late then
    o = o + 1
    out[o] = -1
    for i = 1, n do
      if K[ARGV[a]][7] then a = a + 2 else a = a + 1 end
    end
  else
    -- TTL slack. With Redis TIME the TTL runs on the same clock as the state:
    -- 1 s. A caller's clock (replays, tests) can stand still while Redis's
    -- runs, so its keys get 60 s. Fixed windows always get 60 s: a late write
    -- must find its window still there, never recreate one that has passed.
    local slack, sec = 60000, false
    if now <= 0 then
      clock()
      now, slack = clockMs, 1000
      sec = now - now % 1000 -- keepTTL: the start of Redis's current second
    end
    local deny, wait, shadow, swait = 0, 0, 0, 0
    for i = 1, n do
      local kt = K[ARGV[a]]
      local alg, limit, period, burst, cost = kt[1], kt[2], kt[3], kt[4], kt[6]
      local x = 0
      if kt[7] then x = ARGV[a + 1]; a = a + 2 else a = a + 1 end
      local key = KEYS[k + i]
      if alg == CC then cost = 1 end
      local s = st[i]
      if not s then
        s = {0, 0, 0, 0, true, 0, 0, 0, 0, 0, 0, false, 0, 0, false, false, 0, false, false}
        st[i] = s
      end
      -- Every field a later step reads is set here or by the rule's algorithm.
      s[ALG], s[LIM], s[PER], s[COST], s[TAKE], s[W], s[DEN], s[RET], s[X], s[ID], s[KEEP] =
        alg, limit, period, cost, true, false, false, false, x, kt, false
      local ok, w = true, 0
      if alg == TB then
        local cap = burst * period
        local t, ts, pd
        -- get(key) and keepTTL, written out: this is the default algorithm's
        -- path, and a Lua function call costs about as much as ten operations.
        local v = V[key]
        if v == false then v = call('GET', key) or ''; V[key] = v end
        if v ~= '' then
          local a1, a2, a3 = match(v, '^(%d+) (%d+) (%d+)$')
          t, ts = tonumber(a1), tonumber(a2)
          if a3 ~= kt[8] then pd = tonumber(a3)
          elseif sec and ts and ts >= sec and ts <= now then s[KEEP] = true end
        end
        if t == nil then t, ts = cap, now end
        -- The period changed: re-express the stored units in the new period's,
        -- rounding down, which keeps every whole token and mints no fraction.
        if pd and pd ~= period then t = floor(t * period / pd) end
        local xn = 0
        if x ~= 0 then xn = tonumber(x) end
        if xn < 0 then -- leased tokens given back: as if never taken
          t = t - xn * period
          s[RET] = true
        end
        if t > cap then t = cap end -- capacity lowered: clamp, never mint
        if now > ts then -- time never moves backwards: a stale now refills nothing
          t = t + (now - ts) * limit
          if t > cap then t = cap end
          ts = now
        end
        -- A stale now (a caller's clock behind the stored time) waits from the
        -- stored time: the lag is part of every wait it is told.
        local lag = ts - now
        s[T], s[TS], s[CAP], s[LAG] = t, ts, cap, lag
        local need = cost * period
        if t < need then ok, w = false, ceildiv(min(need, cap) - t, limit) + lag end
      elseif alg == SW then
        local ws, c, pc, ts
        local v = get(key)
        if v then
          local a1, a2, a3, a4 = match(v, '^(%d+) (%d+) (%d+) (%d+)$')
          ws, c, pc, ts = tonumber(a1), tonumber(a2), tonumber(a3), tonumber(a4)
          if ts then s[KEEP] = keepTTL(ts, now, sec) end
        end
        if ws == nil then c, pc, ts = 0, 0, now end
        local t = max(now, ts) -- time never moves backwards
        local cur = t - t % period
        if ws == nil or ws < cur - period then c, pc = 0, 0
        elseif ws == cur - period then
          -- two statements: gopher-lua (the in-process Redis) assigns `c, p = 0, c`
          -- left to right (yuin/gopher-lua#440)
          pc = c
          c = 0
        end
        local e = t - cur -- ms elapsed in the current window
        s[C], s[P], s[W], s[TS], s[E], s[LAG] = c, pc, cur, t, e, t - now
        local avail = (limit - c - cost) * period -- units left for the previous window's weight
        if cost <= limit and pc * (period - e) > avail then
          ok = false
          if avail >= 0 and pc > 0 then
            w = period - floor(avail / pc) - e
          else -- wait for the next window, where this window's count is the previous one
            local e2 = 0
            if c > 0 then e2 = max(0, period - floor((limit - cost) * period / c)) end
            w = period - e + e2
          end
          w = w + s[LAG]
        end
      elseif alg == FW then
        local v = get(key)
        local c = 0
        if v then c = tonumber(v) or 0 end
        s[KEEP] = v and true or false -- the window's key: its expiry is the window's end + 60 s
        local left = tonumber(x)
        s[C], s[LEFT] = c, left
        if c + cost > limit and cost <= limit then ok, w = false, left end
      elseif alg == GC then
        local c = 0
        local counts = call('HVALS', key)
        for q = 1, #counts do c = c + tonumber(counts[q]) end
        local left = tonumber(x)
        s[C], s[LEFT] = c, left
        if c + cost > limit and cost <= limit then ok, w = false, left end
      else -- concurrency
        call('ZREMRANGEBYSCORE', key, '-inf', now) -- leases of crashed requests
        local c = call('ZCARD', key)
        s[C] = c
        if c + 1 > limit then
          ok = false
          local first = call('ZRANGE', key, 0, 0, 'WITHSCORES')
          w = max(1, tonumber(first[2]) - now)
        end
      end
      if cost > burst then ok, w = false, -1 end -- waiting can never satisfy it
      if not ok then
        s[DEN] = true
        if kt[5] then
          if shadow == 0 then shadow, swait = i, w end
          s[TAKE] = false -- a shadow rule that would deny consumes nothing
        elseif deny == 0 or (wait >= 0 and (w < 0 or w > wait)) then
          -- Report the rule that blocks longest: a cost beyond capacity (never
          -- satisfiable), else the longest wait, so that a retry after it is allowed.
          deny, wait = i, w
        end
      end
    end

    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] =
      deny == 0 and 1 or 0, deny, wait, shadow, now, swait
    o = o + 6
    local commit = deny == 0
    for i = 1, n do
      local s, key = st[i], KEYS[k + i]
      local take = commit and s[TAKE]
      local rem, reset = 0, 0
      local alg, limit, period, cost = s[ALG], s[LIM], s[PER], s[COST]
      if alg == TB then
        local t = s[T]
        if take then
          t = t - cost * period
          local block = 0
          if s[X] ~= 0 then block = tonumber(s[X]) end
          if block > 0 then
            s[W] = min(block, floor(t / period))
            t = t - s[W] * period
          end
        end
        if take or s[RET] then -- write(key, v, expiry(s, now, sec)), written out
          local kt, px, at = s[ID], false, false
          local v = format('%d %d %s', t, s[TS], kt[8])
          if not s[KEEP] then
            if sec then
              px, at = kt[12], true
              if kt[13] ~= sec then px = epochTTL(kt, sec) end
            else
              px = ttl(kt, slack)
            end
          end
          V[key] = v
          if px or WV[key] == nil then WT[key], WA[key] = px, at end
          WV[key] = v
        end
        -- floor(t / period) and ceildiv(cap - t, limit), in operators
        local d = s[CAP] - t + limit - 1
        rem, reset = (t - t % period) / period, (d - d % limit) / limit + s[LAG]
      elseif alg == SW then
        local c, pc, e, lag = s[C], s[P], s[E], s[LAG]
        if take then
          c = c + cost
          write(key, format('%d %d %d %d', s[W], c, pc, s[TS]), expiry(s, now, sec))
        end
        rem = max(0, floor((limit * period - pc * (period - e) - c * period) / period))
        if c > 0 then reset = 2 * period - e + lag elseif pc > 0 then reset = period - e + lag end
      elseif alg == FW then
        local c = s[C]
        if take then
          -- The count was read above and the script is atomic: one SET writes
          -- the new count and its expiry (INCRBY then PEXPIRE was two calls).
          c = c + cost
          local px = false
          if not s[KEEP] then px = format('%d', s[LEFT] + 60000) end
          write(key, format('%d', c), px)
        end
        rem, reset = max(0, limit - c), s[LEFT]
      elseif alg == GC then
        local c = s[C]
        if take then
          call('HINCRBY', key, region, cost)
          c = c + cost
          call('PEXPIRE', key, s[LEFT] + 60000)
        end
        rem, reset = max(0, limit - c), s[LEFT]
      else
        local c = s[C]
        if take then
          c = c + 1
          call('ZADD', key, now + period, s[X])
          call('PEXPIRE', key, period + slack)
        end
        rem = max(0, limit - c)
        if rem == 0 then
          local first = call('ZRANGE', key, 0, 0, 'WITHSCORES')
          if first[2] then reset = max(1, tonumber(first[2]) - now) end
        end
      end
      out[o + 1], out[o + 2], out[o + 4] = rem, reset, s[W] or 0
      if take then out[o + 3] = 1 elseif s[DEN] then out[o + 3] = 2 else out[o + 3] = 0 end
      o = o + 4
    end
  end
  p = a
  k = k + n
end
for key, v in pairs(WV) do
  local px = WT[key]
  if not px then
    call('SET', key, v, 'KEEPTTL')
  elseif WA[key] then
    call('SET', key, v, 'PXAT', px)
  else
    call('SET', key, v, 'PX', px)
  end
end
return out
