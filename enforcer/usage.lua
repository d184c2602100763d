-- sluice: one rule's state for one entity, read without writing anything.
-- The limiter runs it with EVALSHA_RO (Redis 7), so Redis itself refuses any
-- write: reading a customer's usage can never charge, refill, extend a TTL
-- or take a lease. The arithmetic is decide.lua's for a cost of 0.
--
-- KEYS[1]  the rule's state key, as decide.lua names it
-- ARGV[1]  now in ms since the epoch; 0 = use Redis TIME
-- ARGV[2]  algorithm (0 token bucket, 1 sliding window, 2 fixed window,
--          3 concurrency, 4 g_counter), limit, period_ms, burst, x
--          (ARGV[2..6]); x is the ms left in a fixed window or g_counter window
--
-- Returns "rem reset now": whole units left, ms until the rule is back to its
-- full capacity (concurrency: until a slot frees, 0 while one is free; fixed
-- windows: until the window ends), and the time used, ms.
local now = tonumber(ARGV[1])
if not now or now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local alg, limit, period = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local burst, x = tonumber(ARGV[5]), tonumber(ARGV[6]) or 0
local key = KEYS[1]
local function ceildiv(a, b) return math.floor((a + b - 1) / b) end
local rem, reset = 0, 0
if alg == 0 then
  local cap = burst * period
  local t, ts, pd
  local v = redis.call('GET', key)
  if v then
    local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
    t, ts, pd = tonumber(a), tonumber(b), tonumber(c)
  end
  if t == nil then t, ts = cap, now end
  if pd and pd ~= period then t = math.floor(t * period / pd) end
  if t > cap then t = cap end
  if now > ts then
    t = math.min(cap, t + (now - ts) * limit)
    ts = now
  end
  rem, reset = math.floor(t / period), ceildiv(cap - t, limit) + (ts - now)
elseif alg == 1 then
  local ws, c, p, ts
  local v = redis.call('GET', key)
  if v then
    local a, b, cc, d = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$')
    ws, c, p, ts = tonumber(a), tonumber(b), tonumber(cc), tonumber(d)
  end
  if ws == nil then c, p, ts = 0, 0, now end
  local t = math.max(now, ts)
  local cur = t - t % period
  if ws == nil or ws < cur - period then
    c, p = 0, 0
  elseif ws == cur - period then
    p = c
    c = 0
  end
  local e, lag = t - cur, t - now
  rem = math.max(0, math.floor((limit * period - p * (period - e) - c * period) / period))
  if c > 0 then reset = 2 * period - e + lag elseif p > 0 then reset = period - e + lag end
elseif alg == 2 or alg == 4 then
  local c = 0
  if alg == 2 then
    c = tonumber(redis.call('GET', key)) or 0
  else
    local counts = redis.call('HVALS', key)
    for j = 1, #counts do c = c + tonumber(counts[j]) end
  end
  rem, reset = math.max(0, limit - c), x
else
  -- Leases not yet expired; decide.lua removes the expired ones, this
  -- script only skips them.
  local c = redis.call('ZCOUNT', key, '(' .. string.format('%d', now), '+inf')
  rem = math.max(0, limit - c)
  if rem == 0 then
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] then reset = math.max(1, tonumber(first[2]) - now) end
  end
end
return string.format('%d %d %d', rem, reset, now)
