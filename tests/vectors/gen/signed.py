#!/usr/bin/env python3
"""Write the signed-token vectors (tests/vectors/signed-*.json).

The tags are computed here with Python's own hmac and hashlib from the
message layout in wit/fence.wit (`auth.grant-message`), not by the
component: every runner then checks that the component computes exactly
these bytes. Run from the repository root; it rewrites the files.
"""
import hashlib
import hmac
import json
import struct
from pathlib import Path

OUT = Path("tests/vectors")
K3 = bytes(range(0x30, 0x50))  # 32 bytes
K4 = bytes(range(0x80, 0xA0))
K3_SPEC = {"id": 3, "secret": K3.hex()}
K4_SPEC = {"id": 4, "secret": K4.hex()}


def message(scope, authority, epoch, counter, key_id, lease_id):
    s, l = scope.encode(), lease_id.encode()
    return (b"fencecheck-grant-v1\0" + struct.pack("<I", len(s)) + s
            + struct.pack("<QQQ", authority, epoch, counter)
            + struct.pack("<II", key_id, len(l)) + l)


def tag(secret, key_id, scope, token, lease_id, authority=0):
    return hmac.new(secret, message(scope, authority, token[0], token[1], key_id, lease_id),
                    hashlib.sha256).hexdigest()


def sig(secret, key_id, scope, token, lease_id, authority=0):
    return {"key_id": key_id, "lease_id": lease_id,
            "tag": tag(secret, key_id, scope, token, lease_id, authority)}


def check(scope, token, keys, signature=None, expect=None, **extra):
    step = {"check": {"scope": scope, "token": list(token), **extra, "keys": keys}}
    if signature is not None:
        step["check"]["signature"] = signature
    step["expect"] = expect
    return step


def applied(version, highest=None):
    e = {"outcome": "applied", "version": version}
    if highest:
        e["highest"] = list(highest)
    return e


def refused(reason):
    return {"outcome": "error", "error": "unauthenticated", "reason": reason}


def bad_keys(reason):
    return {"outcome": "error", "error": "invalid-keys", "reason": reason}


def write(name, description, steps):
    path = OUT / f"{name}.json"
    body = ",\n".join("    " + json.dumps(s, ensure_ascii=False) for s in steps)
    path.write_text(
        "{\n"
        f'  "name": {json.dumps(name)},\n'
        f'  "description": {json.dumps(description)},\n'
        f'  "steps": [\n{body}\n  ]\n'
        "}\n", encoding="utf-8")


S = "report/july"
T = (1, 42)
L = "lease-7f3a9c2e-0001"
good = sig(K3, 3, S, T, L)

write("signed-grant-is-applied",
      "A grant signed by key 3 is applied on a scope that requires signed tokens; the sign step pins the tag (the message layout) in every runner, and the same grant again is stale under strict, as unsigned.",
      [
          {"sign": {"scope": S, "token": list(T), "lease_id": L, "key": K3_SPEC},
           "expect": {"outcome": "signed", "tag": good["tag"]}},
          check(S, T, [K3_SPEC], good, applied(1, T)),
          check(S, T, [K3_SPEC], good, {"outcome": "stale-fence", "presented": list(T), "highest": list(T)}),
          {"sign": {"scope": S, "token": [1, 43], "authority": 7, "lease_id": L, "key": K4_SPEC},
           "expect": {"outcome": "signed", "tag": tag(K4, 4, S, (1, 43), L, authority=7)}},
      ])

tampered = []
for token, authority, what in [((1, 43), 0, "counter"), ((2, 42), 0, "epoch"), ((1, 42), 9, "authority")]:
    extra = {"authority": authority} if authority else {}
    tampered.append(check(S, token, [K3_SPEC], good, refused("bad-signature"), **extra))
flipped = dict(good, tag=good["tag"][:-1] + ("0" if good["tag"][-1] != "0" else "1"))
tampered.append(check(S, T, [K3_SPEC], dict(good, lease_id="lease-7f3a9c2e-0002"), refused("bad-signature")))
tampered.append(check(S, T, [K3_SPEC], flipped, refused("bad-signature")))
tampered.append(check(S, T, [K3_SPEC, {"id": 4, "secret": K3.hex()}], dict(good, key_id=4), refused("bad-signature")))
tampered.append(check(S, T, [K3_SPEC], good, applied(1, T)))
write("signed-tampered-grant-is-refused",
      "A signed grant whose counter, epoch, authority, lease id or tag was changed, or whose signature was relabelled to another key with the same secret, is unauthenticated/bad-signature and changes nothing: the untouched grant then applies at version 1.",
      tampered)

write("signed-replay-into-another-scope",
      "A grant signed for report/july presented on report/june is unauthenticated/bad-signature (the scope is in the message); on its own scope it applies.",
      [
          check("report/june", T, [K3_SPEC], good, refused("bad-signature")),
          check(S, T, [K3_SPEC], good, applied(1, T)),
      ])

write("signed-unsigned-and-unknown-key",
      "On a scope that requires signed tokens, a token without a signature is unauthenticated/unsigned and one signed by a key the host does not hold is unknown-key; a malformed signature (tag not 32 bytes, empty or 257-byte lease id) is malformed-signature. None changes anything.",
      [
          check(S, T, [K3_SPEC], None, refused("unsigned")),
          check(S, T, [K4_SPEC], good, refused("unknown-key")),
          check(S, T, [K3_SPEC], dict(good, tag=good["tag"][:-2]), refused("malformed-signature")),
          check(S, T, [K3_SPEC], dict(good, tag=good["tag"] + "00"), refused("malformed-signature")),
          check(S, T, [K3_SPEC], dict(good, lease_id=""), refused("malformed-signature")),
          check(S, T, [K3_SPEC], dict(good, lease_id="l" * 257), refused("malformed-signature")),
          check(S, T, [K3_SPEC], sig(K3, 3, S, T, "l" * 256), applied(1, T)),
      ])

MAX = 2**64 - 1
write("signed-forged-maximum-token-is-refused",
      "The lock-out attack: a client presents the largest token, (u64 max, u64 max), with a made-up tag. Unsigned it would hold the scope for good; on a scope that requires signed tokens it is refused, and the honest holder's signed grant applies.",
      [
          check(S, (MAX, MAX), [K3_SPEC], {"key_id": 3, "lease_id": "x", "tag": "00" * 32}, refused("bad-signature")),
          check(S, (MAX, MAX), [K3_SPEC], None, refused("unsigned")),
          check(S, T, [K3_SPEC], good, applied(1, T)),
          check(S, (1, 43), [K3_SPEC], sig(K3, 3, S, (1, 43), L), applied(2, (1, 43))),
      ])

write("signed-key-rotation",
      "Rotation: with keys {3} a grant signed by 3 applies; with {3, 4} both keys' grants apply; once 3 is dropped ({4}) a newer grant still signed by 3 is unknown-key and its holder must re-acquire.",
      [
          check(S, (1, 1), [K3_SPEC], sig(K3, 3, S, (1, 1), L), applied(1)),
          check(S, (1, 2), [K3_SPEC, K4_SPEC], sig(K3, 3, S, (1, 2), L), applied(2)),
          check(S, (1, 3), [K3_SPEC, K4_SPEC], sig(K4, 4, S, (1, 3), L), applied(3)),
          check(S, (1, 4), [K4_SPEC], sig(K3, 3, S, (1, 4), L), refused("unknown-key")),
          check(S, (1, 4), [K4_SPEC], sig(K4, 4, S, (1, 4), L), applied(4, (1, 4))),
      ])

many = [{"id": i, "secret": K3.hex()} for i in range(17)]
write("signed-invalid-keys",
      "An unusable key set is invalid-keys (no keys, too many, a secret under 16 or over 64 bytes, a duplicate id), checked after the request and before the signature; secrets of 16 and 64 bytes are usable.",
      [
          check(S, T, [], good, bad_keys("no-keys")),
          check(S, T, many, good, bad_keys("too-many-keys")),
          check(S, T, [{"id": 3, "secret": "00" * 15}], good, bad_keys("short-secret")),
          check(S, T, [{"id": 3, "secret": "00" * 65}], good, bad_keys("long-secret")),
          check(S, T, [K3_SPEC, K3_SPEC], good, bad_keys("duplicate-key-id")),
          check(S, (0, 0), [], None, {"outcome": "error", "error": "invalid-request", "reason": "missing-token"}),
          check(S, T, [{"id": 9, "secret": "11" * 16}], sig(b"\x11" * 16, 9, S, T, L), applied(1)),
          check(S, (1, 43), [{"id": 9, "secret": "22" * 64}], sig(b"\x22" * 64, 9, S, (1, 43), L), applied(2)),
      ])

write("signed-authentication-before-state",
      "Authentication comes before the stored state is read: on a corrupt state a bad signature is unauthenticated (the caller learns nothing), a good one is corrupt-state.",
      [
          check(S, T, [K3_SPEC], good, applied(1, T)),
          {"damage": "flip-bit", "bit": 9},
          check(S, (1, 43), [K3_SPEC], good, refused("bad-signature")),
          check(S, (1, 43), [K3_SPEC], sig(K3, 3, S, (1, 43), L), {"outcome": "error", "error": "corrupt-state"}),
      ])

write("signed-sign-errors",
      "sign refuses what it cannot sign: an empty or 1025-byte scope, no token, an empty or 257-byte lease id, an unusable key.",
      [
          {"sign": {"scope": "", "token": [1, 1], "lease_id": L, "key": K3_SPEC}, "expect": {"outcome": "error", "error": "empty-scope"}},
          {"sign": {"scope": "s" * 1025, "token": [1, 1], "lease_id": L, "key": K3_SPEC}, "expect": {"outcome": "error", "error": "scope-too-long"}},
          {"sign": {"scope": S, "token": [0, 0], "lease_id": L, "key": K3_SPEC}, "expect": {"outcome": "error", "error": "missing-token"}},
          {"sign": {"scope": S, "token": [1, 1], "lease_id": "", "key": K3_SPEC}, "expect": {"outcome": "error", "error": "empty-lease-id"}},
          {"sign": {"scope": S, "token": [1, 1], "lease_id": "l" * 257, "key": K3_SPEC}, "expect": {"outcome": "error", "error": "lease-id-too-long"}},
          {"sign": {"scope": S, "token": [1, 1], "lease_id": L, "key": {"id": 1, "secret": "00" * 15}}, "expect": {"outcome": "error", "error": "invalid-key", "reason": "short-secret"}},
          {"sign": {"scope": "s" * 1024, "token": [1, 1], "lease_id": "l" * 256, "key": K3_SPEC},
           "expect": {"outcome": "signed", "tag": tag(K3, 3, "s" * 1024, (1, 1), "l" * 256)}},
      ])

write("signed-signature-ignored-when-not-opted-in",
      "On a scope that does not require signed tokens (no keys) the check ignores any signature, even a wrong one: clients may always send their signed tokens and resources opt in one by one; the same scope then opted in refuses that bad signature.",
      [
          {"check": {"scope": S, "token": list(T), "signature": {"key_id": 3, "lease_id": L, "tag": "00" * 32}},
           "expect": applied(1, T)},
          {"check": {"scope": S, "token": [1, 43], "signature": good}, "expect": applied(2, (1, 43))},
          check(S, (1, 44), [K3_SPEC], {"key_id": 3, "lease_id": L, "tag": "00" * 32}, refused("bad-signature")),
          check(S, (1, 44), [K3_SPEC], sig(K3, 3, S, (1, 44), L), applied(3, (1, 44))),
      ])
