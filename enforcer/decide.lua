-- sluice: decide one request against every matching rule held in this Redis
-- slot, atomically: check them all, then commit them all only if every
-- enforced rule allows. A deny consumes nothing from any rule.
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
-- KEYS[i]   state of rule i
-- ARGV[1]   now in ms since the epoch; 0 = use Redis TIME
-- ARGV[2]   N, the number of rules; then 7 values per rule i at 3+7*(i-1):
--           algorithm, limit, period_ms, burst, cost, shadow (1 = shadow
--           mode), x (fixed window: ms left in the window; concurrency: the
--           lease id; token bucket: x > 0 is a lease block, extra whole
--           tokens to take, as many as there are up to x, when the request
--           is allowed; x < 0 gives -x leased tokens back before deciding;
--           sliding window: unused)
-- ARGV[3+7N] this region's name: the field a g_counter rule adds to
-- ARGV[4+7N] the caller's deadline, in µs since the epoch on the caller's
--           clock; 0 = none. Past it (by Redis TIME) the caller has given up
--           and the script commits nothing: it returns "late <now µs>".
--
-- Returns one string of space-separated integers (one allocation for the
-- caller to parse), written by one string.format of '%d's: Lua's own number
-- to string conversion is a '%.14g' sprintf per number, and was a fifth of
-- this script's cost in Redis:
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
local n = tonumber(ARGV[2])
-- A call that reached Redis after its caller gave up (a stall, a slow
-- network) must not commit: the caller has answered by the failure mode, and
-- a lease or count taken now would belong to nobody.
local deadline = tonumber(ARGV[4 + 7 * n]) or 0
local clock = nil
if deadline > 0 then
  clock = redis.call('TIME')
  local us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  if us > deadline then return 'late ' .. string.format('%d', us) end
end
local now = tonumber(ARGV[1])
-- TTL slack. With Redis TIME the TTL runs on the same clock as the state: 1 s.
-- A caller's clock (replays, tests) can stand still while Redis's runs, so its
-- keys get 60 s. Fixed windows always get 60 s: a late write must find its
-- window still there, never recreate one that has passed and been deleted.
local slack = 60000
if not now or now <= 0 then
  local t = clock or redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  slack = 1000
end
local TB, SW, FW, CC, GC = 0, 1, 2, 3, 4
local region = ARGV[3 + 7 * n]
local st = {}  -- per rule: state read in phase 1 for phase 2 (see the field indices below)
local deny, wait, shadow, swait = 0, 0, 0, 0
local function ceildiv(a, b) return math.floor((a + b - 1) / b) end
-- State is one string of space-separated integers, written with SET ... PX:
-- one call to read and one to write and expire it.
-- Per-rule state is an array (one allocation, no hash part): its fields by index.
local ALG, LIM, PER, BUR, COST, TAKE, T, TS, CAP, LAG, C, P, W, E, LEFT, DEN, RET =
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17
local function unpack3(v)
  if not v then return nil end
  local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
  return tonumber(a), tonumber(b), tonumber(c)
end
local function unpack4(v)
  if not v then return nil end
  local a, b, c, d = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$')
  return tonumber(a), tonumber(b), tonumber(c), tonumber(d)
end

for i = 1, n do
  local a = 3 + 7 * (i - 1)
  local alg, limit, period = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local burst, cost, isShadow = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), ARGV[a + 5] == '1'
  local key = KEYS[i]
  if alg == CC then cost = 1 end
  -- Every field set up front, in the order of the indices above.
  local s = {alg, limit, period, burst, cost, true, 0, 0, 0, 0, 0, 0, false, 0, 0, false, false}
  local ok, w = true, 0
  if alg == TB then
    local cap = burst * period
    local t, ts, pd = unpack3(redis.call('GET', key))
    if t == nil then t, ts = cap, now end
    -- The period changed: re-express the stored units in the new period's,
    -- rounding down, which keeps every whole token and mints no fraction.
    if pd and pd ~= period then t = math.floor(t * period / pd) end
    local x = tonumber(ARGV[a + 6]) or 0
    if x < 0 then -- leased tokens given back: as if never taken
      t = t - x * period
      s[RET] = true
    end
    if t > cap then t = cap end -- capacity lowered: clamp, never mint
    if now > ts then -- time never moves backwards: a stale now refills nothing
      t = math.min(cap, t + (now - ts) * limit)
      ts = now
    end
    -- A stale now (a caller's clock behind the stored time) waits from the
    -- stored time: the lag is part of every wait it is told.
    local lag = ts - now
    s[T], s[TS], s[CAP], s[LAG] = t, ts, cap, lag
    local need = cost * period
    if t < need then ok, w = false, ceildiv(math.min(need, cap) - t, limit) + lag end
  elseif alg == SW then
    local ws, c, p, ts = unpack4(redis.call('GET', key))
    if ws == nil then c, p, ts = 0, 0, now end
    local t = math.max(now, ts) -- time never moves backwards
    local cur = t - t % period
    if ws == nil or ws < cur - period then c, p = 0, 0
    elseif ws == cur - period then
      -- two statements: gopher-lua (the in-process Redis) assigns `c, p = 0, c`
      -- left to right (yuin/gopher-lua#440)
      p = c
      c = 0
    end
    local e = t - cur -- ms elapsed in the current window
    s[C], s[P], s[W], s[TS], s[E], s[LAG] = c, p, cur, t, e, t - now
    local avail = (limit - c - cost) * period -- units left for the previous window's weight
    if cost <= limit and p * (period - e) > avail then
      ok = false
      if avail >= 0 and p > 0 then
        w = period - math.floor(avail / p) - e
      else -- wait for the next window, where this window's count is the previous one
        local e2 = 0
        if c > 0 then e2 = math.max(0, period - math.floor((limit - cost) * period / c)) end
        w = period - e + e2
      end
      w = w + s[LAG]
    end
  elseif alg == FW then
    local c = tonumber(redis.call('GET', key)) or 0
    local left = tonumber(ARGV[a + 6])
    s[C], s[LEFT] = c, left
    if c + cost > limit and cost <= limit then ok, w = false, left end
  elseif alg == GC then
    local c = 0
    local counts = redis.call('HVALS', key)
    for j = 1, #counts do c = c + tonumber(counts[j]) end
    local left = tonumber(ARGV[a + 6])
    s[C], s[LEFT] = c, left
    if c + cost > limit and cost <= limit then ok, w = false, left end
  else -- concurrency
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now) -- leases of crashed requests
    local c = redis.call('ZCARD', key)
    s[C] = c
    if c + 1 > limit then
      ok = false
      local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      w = math.max(1, tonumber(first[2]) - now)
    end
  end
  if cost > burst then ok, w = false, -1 end -- waiting can never satisfy it
  if not ok then
    s[DEN] = true
    if isShadow then
      if shadow == 0 then shadow, swait = i, w end
      s[TAKE] = false -- a shadow rule that would deny consumes nothing
    elseif deny == 0 or (wait >= 0 and (w < 0 or w > wait)) then
      -- Report the rule that blocks longest: a cost beyond capacity (never
      -- satisfiable), else the longest wait, so that a retry after it is allowed.
      deny, wait = i, w
    end
  end
  st[i] = s
end

local out = {deny == 0 and 1 or 0, deny, wait, shadow, now, swait}
local commit = deny == 0
for i = 1, n do
  local s, key = st[i], KEYS[i]
  local a = 3 + 7 * (i - 1)
  local take = commit and s[TAKE]
  local rem, reset = 0, 0
  local alg, limit, period, cost = s[ALG], s[LIM], s[PER], s[COST]
  if alg == TB then
    local t = s[T]
    if take then
      t = t - cost * period
      local block = tonumber(ARGV[a + 6]) or 0
      if block > 0 then
        s[W] = math.min(block, math.floor(t / period))
        t = t - s[W] * period
      end
    end
    local cap = s[CAP]
    if take or s[RET] then
      redis.call('SET', key, string.format('%d %d %d', t, s[TS], period), 'PX', ceildiv(cap, limit) + slack)
    end
    rem, reset = math.floor(t / period), ceildiv(cap - t, limit) + s[LAG]
  elseif alg == SW then
    local c, p, e, lag = s[C], s[P], s[E], s[LAG]
    if take then
      c = c + cost
      redis.call('SET', key, string.format('%d %d %d %d', s[W], c, p, s[TS]), 'PX', 2 * period + slack)
    end
    rem = math.max(0, math.floor((limit * period - p * (period - e) - c * period) / period))
    if c > 0 then reset = 2 * period - e + lag elseif p > 0 then reset = period - e + lag end
  elseif alg == FW then
    local c = s[C]
    if take then
      -- The count was read above and the script is atomic: one SET writes
      -- the new count and its expiry (INCRBY then PEXPIRE was two calls).
      c = c + cost
      redis.call('SET', key, string.format('%d', c), 'PX', s[LEFT] + 60000)
    end
    rem, reset = math.max(0, limit - c), s[LEFT]
  elseif alg == GC then
    local c = s[C]
    if take then
      redis.call('HINCRBY', key, region, cost)
      c = c + cost
      redis.call('PEXPIRE', key, s[LEFT] + 60000)
    end
    rem, reset = math.max(0, limit - c), s[LEFT]
  else
    local c = s[C]
    if take then
      c = c + 1
      redis.call('ZADD', key, now + period, ARGV[a + 6])
      redis.call('PEXPIRE', key, period + slack)
    end
    rem = math.max(0, limit - c)
    if rem == 0 then
      local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      if first[2] then reset = math.max(1, tonumber(first[2]) - now) end
    end
  end
  out[#out + 1] = rem
  out[#out + 1] = reset
  out[#out + 1] = take and 1 or (s[DEN] and 2 or 0)
  out[#out + 1] = s[W] or 0 -- sliding window: the window charged, for a refund
end
return string.format(string.rep('%d ', #out - 1) .. '%d', unpack(out))
