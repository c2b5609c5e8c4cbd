"""The key-value registry's atomic steps: Lua scripts that Redis runs whole.

Every key a script touches is one output's bookkeeping (pointer, registry, published, dropping,
bases, a version's meta), all under the output's hash tag, so each script runs in one slot on
Redis Cluster too. Publish switches only to a registered version (FLIP) and deletion first
moves a version out of the registry (CLAIM), so the two race safely (key_value_deletion.py).
"""

FLIP = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
return 1
"""
"""KEYS pointer, registry, published; ARGV version, time. Publish a version only while it is registered."""

CREATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if ARGV[4] ~= '' then
  if redis.call('HEXISTS', KEYS[1], ARGV[4]) == 0 then
    local held = false
    for _, base in ipairs(redis.call('HVALS', KEYS[3])) do
      if base == ARGV[4] then held = true end
    end
    if not held then return -1 end
  end
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3]) end
return 1
"""
"""KEYS registry, meta key, bases; ARGV version, entry, meta ('': the base's, key_value_meta.py),
base or ''. Register a version and its meta at once, or neither; an overlay only over a base
that is registered, or claimed by GC but still held by a registered overlay (so its buckets are
still there)."""

CLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
local entry = redis.call('HGET', KEYS[2], ARGV[1])
if not entry then return -1 end
redis.call('HSET', KEYS[3], ARGV[1], entry)
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return 1
"""
"""KEYS pointer, registry, dropping, published, bases; ARGV version. Move an unpublished version to
`dropping`: its entry stays there until its last key is gone, so an interrupted deletion is
finished later. A claimed overlay no longer holds its base."""
