"""Signed tokens on the real component: ``sign``, ``check_signed`` over every
transport (the core module's single-check export, a one-item check-packed
batch on it, the typed ``auth.check-signed``), ``grant_message``, the packed codec's auth fields,
and the text forms (signed tokens, key sets) as host/runtime/src/text.rs."""

import hashlib
import hmac

import pytest

import fencecheck as fc
from fencecheck import _packed

SCOPE = "report/july"
K3 = fc.GrantKey(3, bytes(range(0x30, 0x50)))
K4 = fc.GrantKey(4, bytes(range(0x80, 0xA0)))
TOKEN = fc.Token(0, 1, 42)
LEASE = "lease-7f3a9c2e-0001"


def both(guest, state, request, keys):
    """The outcome through each transport (a FenceError returned); they must
    agree: the single-check export (check_signed's default), check-packed on
    the core module, and the typed auth.check-signed."""
    outcomes = []
    packed = lambda s, r, k: guest._check_signed(s, r, k, single=False)  # noqa: E731
    for call in (guest.check_signed, packed, guest._check_signed_typed):
        try:
            outcomes.append(call(state, request, keys))
        except fc.FenceError as e:
            outcomes.append(e)
    one, core, typed = outcomes
    for other in (core, typed):
        assert type(one) is type(other) and repr(one) == repr(other), (one, other)
    return one


def refusal(outcome):
    return (outcome.name, outcome.reason) if isinstance(outcome, fc.FenceError) else outcome.name


def test_the_core_transport_is_under_test(runtime):
    """The packaged component has the core shape, the single-check export and signed tokens."""
    assert runtime._core is not None and runtime._one and runtime.supports_signing


def test_a_signed_grant_applies_and_every_forgery_is_refused(guest):
    """The grant signed by key 3 applies on both transports; each tampered
    part, a replay into another scope, an unknown key, no signature and a
    malformed one are refused with their reason, before the state is read
    (a garbage state is never reported)."""
    sig = guest.sign(SCOPE, TOKEN, LEASE, K3)
    good = fc.Request(SCOPE, TOKEN, signature=sig)
    applied = both(guest, None, good, [K3])
    assert isinstance(applied, fc.Applied) and applied.version == 1 and applied.highest == TOKEN
    assert both(guest, applied.state, good, [K3, K4]) == fc.StaleFence(TOKEN, TOKEN)

    def req(scope=SCOPE, token=TOKEN, **changes):
        s = sig
        for field, value in changes.items():
            s = fc.GrantSignature(**{**{"key_id": s.key_id, "lease_id": s.lease_id, "tag": s.tag}, field: value})
        return fc.Request(scope, token, signature=s)

    flipped = bytes([sig.tag[0] ^ 1]) + sig.tag[1:]
    relabelled = fc.GrantKey(4, K3.secret)  # same secret under another id: the id is in the message
    cases = [
        (req(token=fc.Token(0, 1, 43)), [K3], ("unauthenticated", "bad-signature")),
        (req(token=fc.Token(0, 2, 42)), [K3], ("unauthenticated", "bad-signature")),
        (req(token=fc.Token(9, 1, 42)), [K3], ("unauthenticated", "bad-signature")),
        (req(scope="report/june"), [K3], ("unauthenticated", "bad-signature")),
        (req(lease_id="lease-2"), [K3], ("unauthenticated", "bad-signature")),
        (req(tag=flipped), [K3], ("unauthenticated", "bad-signature")),
        (req(key_id=4), [K3, relabelled], ("unauthenticated", "bad-signature")),
        (req(), [K4], ("unauthenticated", "unknown-key")),
        (good.with_signature(None), [K3], ("unauthenticated", "unsigned")),
        (req(tag=sig.tag[:31]), [K3], ("unauthenticated", "malformed-signature")),
        (req(tag=sig.tag + b"\0"), [K3], ("unauthenticated", "malformed-signature")),
        (req(tag=b"\0" * 300), [K3], ("unauthenticated", "malformed-signature")),  # cut to 255 on the wire
        (req(lease_id=""), [K3], ("unauthenticated", "malformed-signature")),
        (req(lease_id="l" * 257), [K3], ("unauthenticated", "malformed-signature")),
    ]
    for request, keys, want in cases:
        outcome = both(guest, b"garbage", request, keys)
        assert refusal(outcome) == want, (request, outcome)
        assert isinstance(outcome, fc.FenceError) and not outcome.retryable
    # Authenticated, the garbage state is the state's own error.
    assert refusal(both(guest, b"garbage", good, [K3])) == ("corrupt-state", "truncated")


def test_the_request_is_validated_first_then_the_key_set(guest):
    """Rule 1 (the request) before the key set, the key set before the
    signature: each problem with its reason, on both transports."""
    r = fc.Request(SCOPE, TOKEN)
    assert refusal(both(guest, None, fc.Request(SCOPE, fc.Token(0, 0, 0)), [])) == ("invalid-request", "missing-token")
    assert refusal(both(guest, None, fc.Request("", TOKEN), [K3])) == ("invalid-request", "empty-scope")
    sixteen = [fc.GrantKey(i, bytes([i]) * 16) for i in range(16)]
    for keys, problem in [
        ([], "no-keys"),
        ([fc.GrantKey(1, b"x" * 15)], "short-secret"),
        ([fc.GrantKey(1, b"x" * 65)], "long-secret"),
        ([fc.GrantKey(1, b"x" * 300)], "long-secret"),  # cut to 255 on the wire
        ([K3, fc.GrantKey(3, K4.secret)], "duplicate-key-id"),
        (sixteen + [fc.GrantKey(99, K3.secret)], "too-many-keys"),
        ([fc.GrantKey(i, K3.secret) for i in range(300)], "too-many-keys"),  # more than a u8 counts
    ]:
        outcome = both(guest, None, r, keys)
        assert isinstance(outcome, fc.InvalidKeys) and outcome.reason == problem, (problem, outcome)
        assert fc.key_problem(keys) == problem
    assert fc.key_problem(sixteen) is None
    assert refusal(both(guest, None, r, sixteen)) == ("unauthenticated", "unsigned")


def test_check_ignores_a_signature(guest):
    """A scope not opted in (plain check, both transports) ignores the
    signature, even a forged one."""
    forged = fc.Request(SCOPE, TOKEN, signature=fc.GrantSignature(1, "x", b"\0" * 32))
    assert guest.check(None, forged).name == "applied"
    assert [o.name for o in guest.check_batch([(None, forged)])] == ["applied"]


def test_sign_is_hmac_sha256_of_the_grant_message(guest):
    """The tag is HMAC-SHA256 (the standard library's) of grant_message, whose
    layout is pinned byte for byte; the signature names its key and lease."""
    m = guest.grant_message("ab", fc.Token(1, 2, 3), 7, "L")
    assert m == (
        b"fencecheck-grant-v1\0" + (2).to_bytes(4, "little") + b"ab"
        + b"".join(v.to_bytes(8, "little") for v in (1, 2, 3))
        + (7).to_bytes(4, "little") + (1).to_bytes(4, "little") + b"L"
    )
    token = fc.Token(7, 1, 43)
    sig = guest.sign("日本/報告", token, LEASE, K4)
    assert (sig.key_id, sig.lease_id) == (4, LEASE) and len(sig.tag) == fc.TAG_BYTES
    message = guest.grant_message("日本/報告", token, 4, LEASE)
    assert sig.tag == hmac.new(K4.secret, message, hashlib.sha256).digest()


@pytest.mark.parametrize(
    "args, name, reason",
    [
        (("", TOKEN, "l", K3), "empty-scope", None),
        (("x" * 1025, TOKEN, "l", K3), "scope-too-long", None),
        (("s", fc.Token(0, 0, 0), "l", K3), "missing-token", None),
        (("s", TOKEN, "", K3), "empty-lease-id", None),
        (("s", TOKEN, "l" * 257, K3), "lease-id-too-long", None),
        (("s", TOKEN, "l", fc.GrantKey(1, b"x" * 15)), "invalid-key", "short-secret"),
        (("s", TOKEN, "l", fc.GrantKey(1, b"x" * 65)), "invalid-key", "long-secret"),
    ],
)
def test_sign_errors(guest, args, name, reason):
    """Each sign-error case, typed, deterministic, never retryable."""
    with pytest.raises(fc.SignError) as e:
        guest.sign(*args)
    assert (e.value.name, e.value.reason) == (name, reason) and not e.value.retryable
    assert isinstance(e.value, fc.FencecheckError) and not isinstance(e.value, fc.HostError)


def test_bad_inputs_are_refused_before_the_guest(guest):
    """Wrong types and out-of-range ids fail in Python; keys count toward
    Limits.call_bytes (TooLarge, nothing sent)."""
    with pytest.raises(ValueError):
        fc.GrantKey(2**32, b"x" * 16)
    with pytest.raises(ValueError):
        fc.GrantSignature(-1, "l", b"")
    with pytest.raises(TypeError):
        fc.GrantKey(1, "not bytes")
    with pytest.raises(TypeError):
        fc.Request(SCOPE, TOKEN, signature=b"tag")
    with pytest.raises(TypeError):
        guest.check_signed(None, fc.Request(SCOPE, TOKEN), [b"key"])
    with pytest.raises(TypeError):
        guest.check_signed(None, fc.Request(SCOPE, TOKEN), K3)  # one key, not a list of them
    small = fc.Runtime(limits=fc.Limits(call_bytes=100)).instance()
    for call in (small.check_signed, small._check_signed_typed):
        with pytest.raises(fc.TooLarge):
            call(None, fc.Request("s", TOKEN), [fc.GrantKey(i, b"x" * 32) for i in range(3)])
        assert refusal(both(small, None, fc.Request("s", TOKEN), [K3])) == ("unauthenticated", "unsigned")


def test_malformed_guest_output_of_a_signed_check_is_a_host_error(guest, monkeypatch):
    """A signed check's output the decoder cannot read (cut short, or a
    count other than one) raises PackedFormatError and replaces the
    instance; no decision is returned, and the next call works."""
    from fencecheck import _core

    sig = guest.sign(SCOPE, TOKEN, LEASE, K3)
    r = fc.Request(SCOPE, TOKEN, signature=sig)
    for way in ("call_one", "call"):  # the single-check export, and check-packed
        real = getattr(_core.Packed, way)
        for damage in (lambda out: out[:-1], lambda out: b"\x02" + out[1:], lambda out: out + b"\0"):
            monkeypatch.setattr(_core.Packed, way, lambda self, batch, d=damage, f=real: d(f(self, batch)))
            with pytest.raises(fc.PackedFormatError) as e:
                guest._check_signed(None, r, [K3], single=way == "call_one")
            assert e.value.side == "output" and not e.value.retryable
        monkeypatch.setattr(_core.Packed, way, real)
        assert guest.check_signed(None, r, [K3]).name == "applied"


def test_secrets_are_not_printed():
    """repr of a key never shows its secret."""
    assert "0123" not in repr(fc.GrantKey(1, b"0123" * 8)) and repr(fc.GrantKey(1, b"0" * 16)) == "GrantKey(key_id=1)"


# -- the packed codec ---------------------------------------------------------


def test_packed_auth_fields_are_encoded_as_the_format_says():
    """Flag 4 (keys), flag 5 (signature, only with keys), then key-count,
    keys and the signature; without keys a signature is not sent."""
    sig = fc.GrantSignature(9, "L1", b"\xaa" * 32)
    r = fc.Request("s", fc.Token(0, 0, 1), signature=sig)
    plain, _, _ = _packed.encode([(None, r)])
    assert plain[4] == 0 and len(plain) == 4 + 1 + 24 + 4 + 1
    batch, n, size = _packed.encode([(None, r)], [K3])
    head = 4 + 1 + 24 + 4 + 1
    assert batch[4] == _packed.KEYS | _packed.SIGNATURE
    assert batch[head:] == (
        b"\x01" + (3).to_bytes(4, "little") + b"\x20" + K3.secret
        + (9).to_bytes(4, "little") + (2).to_bytes(4, "little") + b"L1" + b"\x20" + b"\xaa" * 32
    )
    assert n == 1 and size == 1 + (32 + 5) + 2 + 32
    unsigned, _, _ = _packed.encode([(None, r.with_signature(None))], [])
    assert unsigned[4] == _packed.KEYS and unsigned[head:] == b"\x00"


def test_auth_outcomes_decode_only_in_a_signed_batch():
    """Tags 134 and 135 with every case index decode in a signed batch; in an
    unsigned one, or with an unknown case, they are off the format."""
    for tag, names, cls in ((134, fc.AUTH_FAILURES, fc.Unauthenticated), (135, fc.KEY_PROBLEMS, fc.InvalidKeys)):
        for i, name in enumerate(names):
            out = b"\x01\0\0\0" + bytes([tag, i])
            [o] = _packed.decode(out, 1, signed=True)
            assert isinstance(o, cls) and o.reason == name
            with pytest.raises(fc.PackedFormatError):
                _packed.decode(out, 1)
        with pytest.raises(fc.PackedFormatError):
            _packed.decode(b"\x01\0\0\0" + bytes([tag, len(names)]), 1, signed=True)
        with pytest.raises(fc.PackedFormatError):
            _packed.decode(b"\x01\0\0\0" + bytes([tag]), 1, signed=True)


# -- text forms ---------------------------------------------------------------


def test_signed_token_text_round_trips():
    """TOKEN~KEY-ID~LEASE~TAG round-trips (full u32 key id, any authority);
    plain token text has no signature."""
    signed = fc.SignedToken(fc.Token(7, 2, 41), fc.GrantSignature(2**32 - 1, "lease-7f3a9c2e-0001", bytes(range(32))))
    text = str(signed)
    assert fc.SignedToken.parse(text) == signed
    assert fc.SignedToken.parse("7:2.41") == fc.SignedToken(fc.Token(7, 2, 41))
    l1 = fc.SignedToken(fc.Token(0, 2, 41), fc.GrantSignature(3, "L1", b"\xff" * 32))
    assert str(l1).startswith("2.41~3~TDE~__")
    assert str(fc.SignedToken(fc.Token(0, 0, 42))) == "0.42" == fc.format_token(fc.Token(0, 0, 42))
    u = 2**64 - 1
    assert fc.parse_token(f"{u}:{u}.{u}") == fc.Token(u, u, u)
    assert fc.SignedToken.parse("2.41~3~~") == fc.SignedToken(fc.Token(0, 2, 41), fc.GrantSignature(3, "", b""))


@pytest.mark.parametrize(
    "bad",
    [
        "2.41~", "2.41~3~TDE", "2.41~3~TDE~AA~x", "2.41~4294967296~TDE~AA", "2.41~+3~TDE~AA",
        "2.41~3~TDE=~AA", "2.41~3~TD+~AA", "2.41~3~TDF~AA", "2.41~3~_w~AA", "x~3~TDE~AA", "~3~TDE~AA",
        "2.41~3~TDE~A", "2.41~3~TD/~AA", "2.41~ 3~TDE~AA", "2.41~٣~TDE~AA",
    ],
)
def test_signed_token_text_refusals(bad):
    """Every departure from the form (host/runtime/src/text.rs's list and a
    few more: a lone base64 character, '/', a space, a non-ASCII digit)."""
    with pytest.raises(fc.TokenTextError) as e:
        fc.SignedToken.parse(bad)
    assert e.value.text == bad and isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "bad",
    ["", "41", ".41", "0.", "+0.41", "0.-1", "0 .41", "0.41 ", "1:2:0.3", "0.1.2", "18446744073709551616.0",
     "a.b", "0x1.2", ":0.1", "0_1.2", "١.٢"],
)
def test_token_text_refusals(bad):
    """Everything outside the unsigned grammar is refused."""
    with pytest.raises(fc.TokenTextError):
        fc.parse_token(bad)
    with pytest.raises(fc.TokenTextError):
        fc.SignedToken.parse(bad)


def test_key_set_text():
    """Commas or lines, '#' comments, blank entries; upper- or lower-case hex;
    prints back; signing_key takes exactly one key."""
    text = (
        "# rotation\n3:00112233445566778899aabbccddeeff\n\n"
        "  4:FFEEDDCCBBAA99887766554433221100ffee ,5:000102030405060708090a0b0c0d0e0f\r\n"
    )
    keys = fc.parse_keys(text)
    assert [k.key_id for k in keys] == [3, 4, 5] and len(keys[1].secret) == 18
    assert fc.parse_keys(fc.format_keys(keys)) == keys
    assert fc.signing_key(fc.parse_keys("7:" + "ab" * 32)).key_id == 7
    with pytest.raises(fc.KeySetError) as e:
        fc.signing_key(keys)
    assert e.value.reason == "3 keys; an authority signs with one"


SIXTEEN = "00112233445566778899aabbccddeeff"


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("", "no-keys"),
        ("# only a comment", "no-keys"),
        ("3:0011", "short-secret"),
        (f"3:{'00' * 65}", "long-secret"),
        (f"3:{SIXTEEN},3:{SIXTEEN}", "duplicate-key-id"),
        (",".join(f"{i}:{SIXTEEN}" for i in range(17)), "too-many-keys"),
        (f"x:{SIXTEEN}", "entry 1 is not KEY-ID:SECRET-HEX"),
        (f"4294967296:{SIXTEEN}", "entry 1 is not KEY-ID:SECRET-HEX"),
        (f"3:{SIXTEEN},4:{SIXTEEN}0", "entry 2 is not KEY-ID:SECRET-HEX"),
        (f"3:{SIXTEEN},4-{SIXTEEN}", "entry 2 is not KEY-ID:SECRET-HEX"),
        (f"3:{SIXTEEN[2:]}zz", "entry 1 is not KEY-ID:SECRET-HEX"),
        (f"3:{SIXTEEN[:-2]} f", "entry 1 is not KEY-ID:SECRET-HEX"),
        (f"+3:{SIXTEEN}", "entry 1 is not KEY-ID:SECRET-HEX"),
    ],
)
def test_key_set_text_refusals(bad, reason):
    """Each malformed or unusable set is refused naming the problem, never a secret."""
    with pytest.raises(fc.KeySetError) as e:
        fc.parse_keys(bad)
    assert e.value.reason == reason
    assert SIXTEEN[4:] not in str(e.value)
