"""Signed tokens on SQLite (as host/sqlite/tests/signed.rs): scopes opted in
with ``set_keys`` (the shared ``fencecheck_keys`` table, read with keys.sql
inside the write transaction) refuse every token their authority did not
sign, and nothing changes when they do."""

import sqlite3
import threading
import time

import pytest

import fencecheck as fc
from fencecheck.sqlite import (
    UnreadableKeys,
    fenced_write,
    install,
    key_prefixes,
    remove_keys,
    scope_keys,
    set_keys,
)

JULY = "report/july"
U64 = 2**64 - 1


def key(key_id: int, fill: int) -> fc.GrantKey:
    return fc.GrantKey(key_id, bytes([fill]) * 32)


def signed(guest, scope: str, counter: int, k: fc.GrantKey) -> fc.Request:
    """A request for ``scope`` with token 0.1.counter, signed by ``k`` through
    the component (what the authority attaches)."""
    token = fc.Token(0, 1, counter)
    return fc.Request(scope, token, signature=guest.sign(scope, token, "lease-1", k))


def unsigned(scope: str, epoch: int, counter: int) -> fc.Request:
    return fc.Request(scope, fc.Token(0, epoch, counter))


def write(conn, guest, request):
    """A fenced write that logs the counter it was applied under; a FenceError
    is returned (it is the write's definitive answer), not raised."""
    try:
        return fenced_write(
            conn, guest, request,
            lambda c, applied: c.execute("INSERT INTO log VALUES (?)", (applied.highest.counter % 2**63,)),
        )
    except fc.FenceError as e:
        assert not conn.in_transaction
        return e


def outcome(o):
    return (o.name, o.reason) if isinstance(o, fc.FenceError) else o.name


def snapshot(conn):
    return (
        conn.execute("SELECT scope, fence_state, version FROM fencecheck_scopes ORDER BY scope").fetchall(),
        conn.execute("SELECT counter FROM log").fetchall(),
    )


@pytest.fixture()
def conn(tmp_path):
    c = sqlite3.connect(tmp_path / "signed.sqlite", timeout=5)
    install(c)
    c.execute("CREATE TABLE log (counter INTEGER)")
    c.commit()
    yield c
    c.close()


def test_a_forged_maximum_token_locks_out_unsigned_scopes_only(conn, guest):
    """The lock-out attack: without keys a forged u64::MAX token applies and
    the honest signed grant is then stale, for good. With the scope opted in
    (set_keys) the forger is refused, unsigned and with a signature copied
    from an honest grant, nothing changes, and the honest grant applies."""
    k = key(3, 0x33)
    assert write(conn, guest, unsigned(JULY, U64, U64)).name == "applied"
    stale = write(conn, guest, signed(guest, JULY, 42, k))
    assert stale == fc.StaleFence(fc.Token(0, 1, 42), fc.Token(0, U64, U64))

    august = "report/august"
    set_keys(conn, "report/", [k])
    forged = unsigned(august, U64, U64)
    before = snapshot(conn)
    assert outcome(write(conn, guest, forged)) == ("unauthenticated", "unsigned")
    copied = forged.with_signature(signed(guest, august, 42, k).signature)
    assert outcome(write(conn, guest, copied)) == ("unauthenticated", "bad-signature")
    assert snapshot(conn) == before
    applied = write(conn, guest, signed(guest, august, 42, k))
    assert isinstance(applied, fc.Applied) and applied.version == 1
    assert conn.execute("SELECT counter FROM log").fetchall() == [(U64 % 2**63,), (42,)]
    # The forger's state on July is still there: keys never rewrite a state,
    # and July (now keyed too) refuses the forger's unsigned token.
    assert outcome(write(conn, guest, unsigned(JULY, U64, U64))) == ("unauthenticated", "unsigned")


def test_every_unauthenticated_token_is_refused(conn, guest):
    """Tampered, replayed into another scope, unknown key, unsigned and
    malformed: each refused with its own reason, none changes anything, and
    the honest grant then applies."""
    k3 = key(3, 0x33)
    set_keys(conn, "report/", [k3])
    assert write(conn, guest, signed(guest, JULY, 1, k3)).name == "applied"
    good = signed(guest, JULY, 2, k3)
    tampered = fc.Request(JULY, fc.Token(0, 1, 3), signature=good.signature)
    replayed = fc.Request(JULY, fc.Token(0, 1, 2), signature=signed(guest, "report/june", 2, k3).signature)
    by_unknown_key = signed(guest, JULY, 2, key(9, 0x99))
    s = good.signature
    malformed = good.with_signature(fc.GrantSignature(s.key_id, s.lease_id, s.tag[:16]))
    for request, reason in [
        (tampered, "bad-signature"),
        (replayed, "bad-signature"),
        (by_unknown_key, "unknown-key"),
        (unsigned(JULY, 1, 2), "unsigned"),
        (malformed, "malformed-signature"),
    ]:
        before = snapshot(conn)
        refused = write(conn, guest, request)
        assert isinstance(refused, fc.Unauthenticated) and refused.reason == reason
        assert not refused.retryable and not isinstance(refused, fc.HostError)
        assert snapshot(conn) == before, reason
    assert write(conn, guest, good).version == 2


def test_the_longest_prefix_decides(conn, guest):
    """The longest prefix decides; removing it hands its scopes to the next
    shorter one, removing every prefix makes scopes take unsigned tokens,
    and a signature on a scope not opted in is ignored."""
    k1, k2 = key(1, 0x11), key(2, 0x22)
    set_keys(conn, "", [k1])
    set_keys(conn, "report/", [k2])
    assert scope_keys(conn, JULY) == [k2]
    assert scope_keys(conn, "invoice/9") == [k1] and scope_keys(conn, "repor") == [k1]
    assert key_prefixes(conn) == [("", [1]), ("report/", [2])]
    by_k1 = signed(guest, JULY, 1, k1)
    assert outcome(write(conn, guest, by_k1)) == ("unauthenticated", "unknown-key")
    assert remove_keys(conn, "report/") and not remove_keys(conn, "report/")
    assert write(conn, guest, by_k1).name == "applied"
    assert remove_keys(conn, "")
    assert scope_keys(conn, JULY) is None and key_prefixes(conn) == []
    assert write(conn, guest, unsigned(JULY, 1, 2)).name == "applied"
    stray = signed(guest, JULY, 3, k1)
    stray = stray.with_signature(fc.GrantSignature(1, "lease-1", b"\0" * 32))
    assert write(conn, guest, stray).name == "applied"


def test_prefixes_match_by_characters_of_utf8_scopes(conn, guest):
    """keys.sql compares prefixes of non-ASCII scopes as the component's
    scopes are (a prefix in characters is a prefix in bytes)."""
    k = key(5, 0x55)
    set_keys(conn, "日本/", [k])
    assert scope_keys(conn, "日本/報告") == [k] and scope_keys(conn, "日/報告") is None
    assert outcome(write(conn, guest, unsigned("日本/報告", 1, 1))) == ("unauthenticated", "unsigned")
    assert write(conn, guest, signed(guest, "日本/報告", 1, k)).name == "applied"


def test_keys_rotate_without_rewriting_states(conn, guest):
    """With {3} then {3, 4} grants of both keys apply; with {4} a grant still
    signed by 3 is unknown-key and its holder must re-acquire."""
    k3, k4 = key(3, 0x33), key(4, 0x44)
    set_keys(conn, JULY, [k3])
    assert write(conn, guest, signed(guest, JULY, 1, k3)).name == "applied"
    set_keys(conn, JULY, [k3, k4])
    assert key_prefixes(conn) == [(JULY, [3, 4])]
    assert write(conn, guest, signed(guest, JULY, 2, k3)).name == "applied"
    assert write(conn, guest, signed(guest, JULY, 3, k4)).name == "applied"
    set_keys(conn, JULY, [k4])
    assert outcome(write(conn, guest, signed(guest, JULY, 4, k3))) == ("unauthenticated", "unknown-key")
    assert write(conn, guest, signed(guest, JULY, 4, k4)).version == 4


def test_unusable_key_sets_are_refused(conn, guest):
    """set_keys refuses unusable sets and prefixes and changes nothing; a short
    secret stored behind the adapter's back is the invalid-keys refusal (never
    an unsigned write); the layout's constraints refuse what no key can be;
    a row that is no key anyway is UnreadableKeys, not a decision."""
    short = fc.GrantKey(1, b"\1" * 15)
    for keys, why in [([], "no-keys"), ([short], "short-secret"), ([key(1, 1), key(1, 2)], "duplicate-key-id")]:
        with pytest.raises(fc.KeySetError) as e:
            set_keys(conn, "report/", keys)
        assert e.value.reason == why
    with pytest.raises(ValueError, match="1025 bytes"):
        set_keys(conn, "x" * 1025, [key(1, 1)])
    with pytest.raises(TypeError):
        set_keys(conn, "report/", [b"\1" * 32])
    assert key_prefixes(conn) == [] and not conn.in_transaction

    conn.execute("INSERT INTO fencecheck_keys VALUES ('report/', 1, ?)", (short.secret,))
    conn.commit()
    request = unsigned(JULY, 1, 1).with_signature(fc.GrantSignature(1, "l", b"\0" * 32))
    refused = write(conn, guest, request)
    assert isinstance(refused, fc.InvalidKeys) and refused.reason == "short-secret"
    assert snapshot(conn) == ([], [])
    for bad in (
        "INSERT INTO fencecheck_keys VALUES ('p', -1, x'00')",
        "INSERT INTO fencecheck_keys VALUES ('p', 4294967296, x'00')",
        "INSERT INTO fencecheck_keys VALUES ('p', 1, 'text')",
        "INSERT INTO fencecheck_keys VALUES (x'00', 1, x'00')",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(bad)
        conn.rollback()
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute("INSERT INTO fencecheck_keys VALUES ('x/', 1, 'text')")
    conn.commit()
    with pytest.raises(UnreadableKeys) as e:
        fenced_write(conn, guest, unsigned("x/1", 1, 1), lambda c, a: None)
    assert not e.value.retryable and "'x/1'" in str(e.value) and not conn.in_transaction
    assert snapshot(conn) == ([], [])


def test_key_changes_need_their_own_transaction(conn):
    """set_keys and remove_keys will not join the caller's transaction."""
    conn.execute("INSERT INTO log VALUES (1)")
    assert conn.in_transaction
    with pytest.raises(sqlite3.ProgrammingError):
        set_keys(conn, "report/", [key(1, 1)])
    with pytest.raises(sqlite3.ProgrammingError):
        remove_keys(conn, "report/")
    conn.rollback()
    assert key_prefixes(conn) == []


def test_a_key_change_in_flight_orders_before_a_waiting_write(tmp_path, runtime):
    """A write that waits for the write lock behind an uncommitted key change
    decides with the new keys once it commits: the keys are read after BEGIN
    IMMEDIATE, with the state, never before it."""
    path = tmp_path / "order.sqlite"
    admin = sqlite3.connect(path, timeout=10)
    install(admin)
    admin.execute("BEGIN IMMEDIATE")  # a set_keys in flight: the write lock, its rows not yet committed
    admin.execute("INSERT INTO fencecheck_keys VALUES ('', 1, ?)", (b"\1" * 32,))
    result = {}

    def write_unsigned():
        try:
            writer = sqlite3.connect(path, timeout=10)
            result["w"] = fenced_write(writer, runtime.instance(), unsigned(JULY, 1, 1), lambda c, a: None)
        except fc.FencecheckError as e:
            result["w"] = e

    t = threading.Thread(target=write_unsigned)
    t.start()
    time.sleep(0.3)  # the writer is queued on BEGIN IMMEDIATE (SQLite's busy wait)
    admin.commit()
    t.join(20)
    assert isinstance(result["w"], fc.Unauthenticated) and result["w"].reason == "unsigned"
    assert admin.execute("SELECT count(*) FROM fencecheck_scopes").fetchone() == (0,)


def test_a_component_without_signed_tokens_never_writes_a_keyed_scope(conn):
    """With the released 0.1.0 (no auth interface) a keyed scope is refused
    with UnsupportedFeature (a HostError, rolled back), never written
    unsigned; scopes without keys are written as before."""
    from conftest import REPO

    old = fc.Runtime(REPO / "tests" / "fixtures" / "fencecheck-0.1.0.wasm", precompiled=False).instance()
    set_keys(conn, "report/", [key(3, 0x33)])
    with pytest.raises(fc.UnsupportedFeature):
        fenced_write(conn, old, unsigned(JULY, 1, 1), lambda c, a: c.execute("INSERT INTO log VALUES (1)"))
    assert snapshot(conn) == ([], []) and not conn.in_transaction
    assert write(conn, old, unsigned("invoice/9", 1, 1)).name == "applied"
