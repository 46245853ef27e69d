"""The Redis store engine's group members (`store.members`: who consumes each group now, cluster-wide), each call
one script under the meta hash tag `{prefix}`:

    :gm:<group>  hash  member id -> "<exclusive 0|1>\n<node>\n<process>"
    :gmn:<node>  set   cjson [process, group, member] of every member the node's processes hold (`release_members`)

An exclusive member is alone in its group, so a join looks at one member at most (O(1)).
"""

from __future__ import annotations

from tidewire.store.redis.conn import RedisConn, Script

# KEYS: 1 the group's members. ARGV: 1 group, 2 member, 3 node, 4 process, 5 exclusive (0|1), 6 node set prefix.
_JOIN = Script("join_group", """
local n = redis.call('HLEN', KEYS[1])
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then return n end
if n > 0 then
  if ARGV[5] == '1' then return -1 end
  if n == 1 and string.sub(redis.call('HVALS', KEYS[1])[1], 1, 1) == '1' then return -1 end
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[5] .. '\\n' .. ARGV[3] .. '\\n' .. ARGV[4])
redis.call('SADD', ARGV[6] .. ARGV[3], cjson.encode({ARGV[4], ARGV[1], ARGV[2]}))
return n + 1
""")

# KEYS: 1 the group's members. ARGV: 1 group, 2 member, 3 node set prefix. Returns the members left.
_LEAVE = Script("leave_group", """
local v = redis.call('HGET', KEYS[1], ARGV[2])
if v then
  local _, node, process = string.match(v, '^(%d)\\n([^\\n]*)\\n(.*)$')
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('SREM', ARGV[3] .. node, cjson.encode({process, ARGV[1], ARGV[2]}))
end
return redis.call('HLEN', KEYS[1])
""")

# KEYS: 1 the node's set. ARGV: 1 process ('': every process of the node), 2 members key prefix. Returns the
# groups left without members.
_RELEASE = Script("release_members", """
local emptied, seen = {}, {}
for _, e in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local t = cjson.decode(e)
  if ARGV[1] == '' or t[1] == ARGV[1] then
    local key = ARGV[2] .. t[2]
    if redis.call('HDEL', key, t[3]) == 1 and not seen[t[2]] and redis.call('HLEN', key) == 0 then
      seen[t[2]] = true
      emptied[#emptied + 1] = t[2]
    end
    redis.call('SREM', KEYS[1], e)
  end
end
return emptied
""")

# KEYS: 1 the group's members. ARGV: 1 group, 2 node set prefix. (The group is deleted.)
_DROP = Script("drop_members", """
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local _, node, process = string.match(all[i + 1], '^(%d)\\n([^\\n]*)\\n(.*)$')
  redis.call('SREM', ARGV[2] .. node, cjson.encode({process, ARGV[1], all[i]}))
end
redis.call('DEL', KEYS[1])
return 0
""")


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class RedisMembers:
    """The member calls of `store.base.Store` on Redis: a mixin of `RedisStore`, over its connection `_conn`."""

    _conn: RedisConn

    def _init_members(self, prefix: str) -> None:
        k = f"{{{prefix}}}:"
        self._gm, self._gmn = k + "gm:", k + "gmn:"

    async def join_group(self, group: str, member: str, node: str, process: str, exclusive: bool) -> int:
        return int(await self._conn.run((_JOIN, [self._gm + group],
                                         [group, member, node, process, 1 if exclusive else 0, self._gmn])))

    async def leave_group(self, group: str, member: str) -> int:
        return int(await self._conn.run((_LEAVE, [self._gm + group], [group, member, self._gmn])))

    async def group_members(self, group: str) -> int:
        return int(await self._conn.command("HLEN", self._gm + group))

    async def release_members(self, node: str, process: str = "") -> list[str]:
        emptied = await self._conn.run((_RELEASE, [self._gmn + node], [process, self._gm]))
        return [_text(g) for g in emptied]

    async def _drop_members(self, group: str) -> None:
        await self._conn.run((_DROP, [self._gm + group], [group, self._gmn]))
