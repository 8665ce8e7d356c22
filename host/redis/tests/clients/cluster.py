"""redis-py's RedisCluster against a cluster whose nodes load the module.

Run by host/redis/tests/cluster/redis_py.rs with one seed port. On every
primary: FENCE.SET/CHECK/DEL and FENCE.ACQUIRE routed by key, a command
sent with target_nodes, MOVED followed from a stale slot cache (the cache
is corrected), FENCE.EXEC on a hash-tagged scope, and a cross-slot
FENCE.EXEC refused with CROSSSLOT and nothing written. Prints one line per
primary; any surprise is an assertion error (exit status 1).
"""

import sys

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ClusterCrossSlotError, MovedError, ResponseError


def refused(fn, code):
    """The error line of fn(), which must be refused with `code`."""
    try:
        reply = fn()
    except ResponseError as e:
        assert str(e).startswith(code), f"expected {code}, got {e!r}"
        return str(e)
    raise AssertionError(f"expected {code}, got the reply {reply!r}")


def named(rc, prefix, node):
    """The first `prefix<i>` whose slot `node` serves."""
    for i in range(100_000):
        name = f"{prefix}{i}"
        if rc.get_node_from_key(name).name == node.name:
            return name
    raise AssertionError(f"no name for {node.name}")


def main():
    rc = RedisCluster(host="127.0.0.1", port=int(sys.argv[1]), decode_responses=True)
    primaries = sorted(rc.get_primaries(), key=lambda n: n.port)
    assert len(primaries) == 3, primaries
    for i, node in enumerate(primaries):
        other = primaries[(i + 1) % 3]

        # Routed by key: the module's commands declare their first key.
        scope = named(rc, f"py/{i}/", node)
        r = rc.execute_command("FENCE.SET", scope, "0.5", "v5")
        assert r[0] == "applied", r
        refused(lambda: rc.execute_command("FENCE.SET", scope, "0.4", "v4"), "STALEFENCE")
        assert rc.execute_command("FENCE.CHECK", scope, "0.6")[0] == "applied"
        assert rc.get(scope) == "v5"
        direct = redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True)
        assert direct.exists(f"fencecheck:{{{scope}}}") == 1, "state not next to the data"

        # Explicit target: the owner, named by the caller.
        r = rc.execute_command("FENCE.SET", scope, "0.7", "v7", target_nodes=node)
        assert r[0] == "applied", r

        # MOVED: the other primary refuses, and a client whose slot cache
        # names it follows the redirection and corrects its cache.
        wrong = redis.Redis(host="127.0.0.1", port=other.port, decode_responses=True)
        try:
            wrong.execute_command("FENCE.SET", scope, "0.8", "v8")
            raise AssertionError("a primary not serving the slot applied")
        except MovedError as e:
            assert (e.slot_id, e.node_addr) == (rc.keyslot(scope), ("127.0.0.1", node.port)), e
        slot = rc.keyslot(scope)
        rc.nodes_manager.slots_cache[slot] = [other]
        r = rc.execute_command("FENCE.SET", scope, "0.8", "v8")
        assert r[0] == "applied", r
        assert rc.nodes_manager.slots_cache[slot][0].name == node.name, "cache not corrected"
        assert rc.get(scope) == "v8"

        assert rc.execute_command("FENCE.DEL", scope, "0.9")[0] == "applied"
        assert rc.exists(scope) == 0
        refused(lambda: rc.execute_command("FENCE.SET", scope, "0.8", "again"), "STALEFENCE")

        # A lease on this shard; its token fences a scope.
        lock = named(rc, f"pylock/{i}/", node)
        grant = rc.execute_command("FENCE.ACQUIRE", lock, "a7", "60000")
        assert grant[0] == "acquired", grant
        tagged = "{" + named(rc, f"pyacct/{i}/", node) + "}"

        # FENCE.EXEC: keys in the scope's slot (one hash tag) apply;
        # a key of another slot is refused and nothing is written.
        owner = tagged + ":owner"
        r = rc.execute_command(
            "FENCE.EXEC", tagged, grant[1], "--", "HSET", owner, "name", "a7"
        )
        assert r[0] == "applied", r
        assert rc.hget(owner, "name") == "a7"
        # A later token, so only the key's slot can be the reason to refuse.
        head, counter = grant[1].rsplit(".", 1)
        later = f"{head}.{int(counter) + 1}"
        far = named(rc, f"pyfar/{i}/", other)
        # redis-py raises its class for the CROSSSLOT code (the code itself
        # is stripped from the message).
        try:
            rc.execute_command("FENCE.EXEC", tagged, later, "--", "HSET", far, "n", "x")
            raise AssertionError("cross-slot FENCE.EXEC applied")
        except ClusterCrossSlotError as e:
            line = f"CROSSSLOT {e}"
        assert rc.exists(far) == 0, "a cross-slot key was written"
        r = rc.execute_command("FENCE.EXEC", tagged, later, "--", "HSET", owner, "name", "b9")
        assert r[0] == "applied" and rc.hget(owner, "name") == "b9", r
        print(f"primary {i}: routed, target_nodes, MOVED followed, EXEC, refused: {line}")


if __name__ == "__main__":
    main()
