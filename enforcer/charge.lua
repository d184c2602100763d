-- sluice: charge a debt: units the local fallback granted for a key while
-- Redis did not answer, counted now as decide.lua would have counted them, so
-- that the limit holds over the outage and after it. A key Redis lost (a
-- restart) is charged from full: decide.lua reads the same state as if the
-- requests had reached it. A debt larger than what the key holds is kept
-- whole: a window's count passes its limit, and a token bucket, which cannot
-- hold fewer than 0 tokens, is left empty with its refill time moved ahead
-- by the rest (decide.lua reads a refill time ahead of now as a bucket that
-- refills nothing until then, and adds the lag to its waits), so the key
-- stays denied until the debt is paid by its refill.
--
-- KEYS[1]   the key's state, as decide.lua's
-- ARGV[1]   now in ms since the epoch; 0 = Redis TIME
-- ARGV[2]   algorithm: 0 token bucket, 1 sliding window, 2 fixed window
-- ARGV[3]   limit
-- ARGV[4]   period_ms
-- ARGV[5]   burst
-- ARGV[6]   units owed
-- ARGV[7]   fixed window: the key's TTL in ms, set if it has none (a Redis
--           that lost it)
-- ARGV[8..11] token bucket, optional: the grants at their times (the
--           enforcer's debtCurve): the level just after the last grant is
--           min(A, x + B) of the level x just before the first; A, B, then
--           the first and the last grant's ages (ms before now). Applied
--           where the key's state is no newer than the first grant (no one
--           wrote it since: the outage was everyone's): refilled to the
--           first grant, the curve, refilled from the last to now. A key
--           Redis lost is full at the first grant. Where the state is newer
--           (others decided on Redis meanwhile), or without them, the units
--           are charged at once at now, after its refill: never less.
-- Returns the units charged as text.
local key = KEYS[1]
local now = tonumber(ARGV[1])
local slack = 60000
if not now or now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  slack = 1000
end
local alg, limit, period = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local burst, units = tonumber(ARGV[5]), tonumber(ARGV[6])
local function ceildiv(a, b) return math.floor((a + b - 1) / b) end
if alg == 0 then
  local cap = burst * period
  local t, ts, pd
  local v = redis.call('GET', key)
  if v then t, ts, pd = string.match(v, '^(%d+) (%d+) (%d+)$') end
  t, ts, pd = tonumber(t), tonumber(ts), tonumber(pd)
  local ca, cb, t0, tl = tonumber(ARGV[8]), tonumber(ARGV[9]), nil, nil
  if ca and cb then
    t0, tl = now - (tonumber(ARGV[10]) or 0), now - (tonumber(ARGV[11]) or 0)
  end
  if t == nil then t, ts = cap, t0 or now end
  if pd and pd ~= period then t = math.floor(t * period / pd) end
  if t > cap then t = cap end
  local curve = t0 and ts <= t0
  if curve then
    t = math.min(ca, math.min(cap, t + (t0 - ts) * limit) + cb)
    ts = math.max(t0, tl)
  end
  if now > ts then
    t = math.min(cap, t + (now - ts) * limit)
    ts = now
  end
  if not curve then t = t - units * period end
  if t < 0 then -- in debt beyond empty: empty, refilling from later
    ts = ts + ceildiv(-t, limit)
    t = 0
  end
  redis.call('SET', key, string.format('%d %d %d', t, ts, period), 'PX', ceildiv(cap, limit) + (ts - now) + slack)
elseif alg == 1 then
  local ws, c, p, ts
  local v = redis.call('GET', key)
  if v then ws, c, p, ts = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$') end
  ws, c, p, ts = tonumber(ws), tonumber(c), tonumber(p), tonumber(ts)
  if ws == nil then c, p, ts = 0, 0, now end
  local t = math.max(now, ts)
  local cur = t - t % period
  if ws == nil or ws < cur - period then
    c, p = 0, 0
  elseif ws == cur - period then
    p = c
    c = 0
  end
  c = c + units
  redis.call('SET', key, string.format('%d %d %d %d', cur, c, p, t), 'PX', 2 * period + slack)
elseif alg == 2 then
  redis.call('INCRBY', key, units)
  local ttl = tonumber(ARGV[7]) or 0
  if redis.call('PTTL', key) < 0 then redis.call('PEXPIRE', key, math.max(ttl, 1000)) end
end
return tostring(units)
