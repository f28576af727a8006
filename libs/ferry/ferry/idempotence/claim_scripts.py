"""The Redis Lua scripts behind the weak idempotence check (claim.py).

Kept apart from the client code that calls them: each script is the unit that
runs atomically in Redis, and its contract (ARGV, replies) is documented here.
"""
from __future__ import annotations

# The claims taken and confirmed in one turn of the event loop, as ONE script call:
# ARGV[1] the lease, ARGV[2] the done TTL, ARGV[3] one op character per item
# ("A" acquire, "F" confirm / finish), ARGV[4] the items' keys and ARGV[5] their
# tokens, each separated by NUL (two joined strings rather than 2N
# arguments: the client's packing of each argument was a fifth of a claim's
# cost). Returns one character per item, one string (one reply to parse):
#   acquire: "C" taken (stored "processing:<token>"), "D" done, "P" another
#            holder's processing (a key taken earlier in the batch is "P" for a
#            later duplicate);
#   confirm: "1" our processing claim became "done:<token>" (TTL), "0" it is
#            not ours any more (only our own claim may become done).
# Keys are not declared in KEYS, so this is for a single Redis, not Redis Cluster.
CLAIM_OPS = """
local function split(s, sep)
  local out, start = {}, 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then out[#out + 1] = string.sub(s, start); return out end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end
local keys, tokens = split(ARGV[4], '\\0'), split(ARGV[5], '\\0')
local ops, out = ARGV[3], {}
for i, key in ipairs(keys) do
  local token = tokens[i]
  if string.byte(ops, i) == 65 then  -- "A"
    if redis.call('SET', key, 'processing:' .. token, 'NX', 'PX', ARGV[1]) then
      out[i] = 'C'
    elseif string.sub(redis.call('GET', key) or '', 1, 5) == 'done:' then
      out[i] = 'D'
    else
      out[i] = 'P'
    end
  elseif redis.call('GET', key) == 'processing:' .. token then
    redis.call('SET', key, 'done:' .. token, 'PX', ARGV[2])
    out[i] = '1'
  else
    out[i] = '0'
  end
end
return table.concat(out)
"""
ACQUIRE, CONFIRM = "A", "F"
EXTEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""
