#!/usr/bin/env python3
"""Write the fuzz targets' seed corpora from the conformance vectors.

Each tests/vectors/*.json file becomes one input per target that can use it,
in the input format documented in fuzz/src/lib.rs and each target's header:
its check steps and fence damage for `check`, its lease steps and lease
damage for `lease`, its check steps as one packed batch for `check_packed`,
and every state it writes with `replace` for `state_decode`. `token_text`
gets the token texts of the runtime's own tests. Files are named by the
SHA-1 of their bytes, as libFuzzer names corpus files.

Usage: fuzz/seeds.py OUT_DIR   (writes OUT_DIR/<target>/...)
"""
import glob
import hashlib
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def u8(v):
    return struct.pack("<B", v & 0xFF)


def u16(v):
    return struct.pack("<H", v & 0xFFFF)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def blob(b):
    return u16(len(b)) + b[:0xFFFF]


def text(s):
    return blob(s.encode())


def token(step):
    epoch, counter = step["token"]
    return step.get("authority", 0), epoch, counter


def request(c):
    flags = (c.get("policy") == "allow-equal") | (("op_id" in c) << 1) | (
        ("expected_version" in c) << 2
    )
    authority, epoch, counter = token(c)
    out = u8(flags) + u64(authority) + u64(epoch) + u64(counter) + text(c["scope"])
    if "op_id" in c:
        out += text(c["op_id"])
    if "expected_version" in c:
        out += u64(c["expected_version"])
    return out


def damage(d):
    kind = d["damage"]
    if kind == "flip-bit":
        return u8(0) + u16(d["bit"])
    if kind == "truncate":
        return u8(1) + u16(d["len"])
    if kind == "append":
        return u8(2) + blob(bytes.fromhex(d["hex"]))
    if kind == "replace":
        return u8(3) + blob(bytes.fromhex(d["hex"]))
    return u8(4)


def lease_token(r):
    epoch, counter = r["token"]
    return u8(0) + u64(r.get("authority", 0)) + u64(epoch) + u64(counter)


def lease_step(step):
    if "acquire" in step:
        a = step["acquire"]
        return (u8(0) + text(a["lock"]) + text(a["lease_id"]) + u64(a.get("authority", 0))
                + u64(a.get("epoch_floor", 0)) + u64(a["now"]) + u64(a["ttl"]))
    if "renew" in step:
        r = step["renew"]
        return u8(1) + text(r["lease_id"]) + lease_token(r) + u64(r["now"]) + u64(r["ttl"])
    if "release" in step:
        r = step["release"]
        return u8(2) + text(r["lease_id"]) + lease_token(r)
    if "restore" in step:
        return u8(3)
    return None


def packed(items):
    out = u32(len(items))
    for state, c in items:
        keyed = "keys" in c
        signed = keyed and "signature" in c
        flags = (state is not None) | (("op_id" in c) << 1) | (("expected_version" in c) << 2) | (
            (c.get("policy") == "allow-equal") << 3
        ) | (keyed << 4) | (signed << 5)
        authority, epoch, counter = token(c)
        out += u8(flags) + u64(authority) + u64(epoch) + u64(counter)
        if "expected_version" in c:
            out += u64(c["expected_version"])
        scope = c["scope"].encode()
        out += u32(len(scope)) + scope
        if "op_id" in c:
            op = c["op_id"].encode()
            out += u32(len(op)) + op
        if state is not None:
            out += u32(len(state)) + state
        if keyed:
            out += u8(len(c["keys"]))
            for k in c["keys"]:
                secret = bytes.fromhex(k["secret"])
                out += u32(k["id"]) + u8(len(secret)) + secret
        if signed:
            sig = c["signature"]
            lease = sig["lease_id"].encode()
            tag = bytes.fromhex(sig["tag"])
            out += u32(sig["key_id"]) + u32(len(lease)) + lease + u8(len(tag)) + tag
    return out


def write(out_dir, target, data):
    os.makedirs(os.path.join(out_dir, target), exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(out_dir, target, name), "wb") as f:
        f.write(data)


def main():
    out_dir = sys.argv[1]
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/vectors/*.json"))):
        with open(path) as f:
            steps = json.load(f)["steps"]
        check, lease, items = b"", b"", []
        fence_state = None
        for step in steps:
            if "damage" in step:
                if step.get("state", "fence") == "lease":
                    lease += u8(4) + damage(step)
                else:
                    check += u8(0) + damage(step)
                    if step["damage"] == "replace":
                        fence_state = bytes.fromhex(step["hex"])
                    elif step["damage"] == "clear":
                        fence_state = None
                if step["damage"] == "replace":
                    write(out_dir, "state_decode", u8(0) + bytes.fromhex(step["hex"]))
            elif "check" in step:
                check += u8(1) + request(step["check"])
                items.append((fence_state, step["check"]))
            elif "sign" in step:
                pass  # no fuzz target signs: check_packed covers verification
            else:
                lease += lease_step(step)
        if check:
            write(out_dir, "check", u8(0) + check)
            write(out_dir, "check_packed", u8(0) + packed(items))
        if lease:
            write(out_dir, "lease", u8(0) + lease)
    max64 = str(2**64 - 1)
    for t in ["0.41", "7:2.41", "0.1", f"{max64}:{max64}.{max64}", "1:0.1", "0:1.2", "+0.41",
              "0.-1", "1:2:0.3", "0.1.2", "18446744073709551616.0", "0x1.2", ":0.1", "007.010"]:
        write(out_dir, "token_text", t.encode())


if __name__ == "__main__":
    main()
