"""check-packed: the byte codec against hand-built bytes (wit/fence.wit), and
random batches that must decide identically through typed check-batch,
check-packed and single checks; the single-check export (guest/src/one.rs)
against the component API's typed check, and what the core transports make
of a guest that answers off the ABI."""

import ctypes
import importlib.resources
import json
import random
import struct

import pytest
import wasmtime

import fencecheck as fc
from fencecheck import _core, _packed
from fencecheck.vectors import parse_request

from conftest import PACKAGED, VECTORS

U64 = 2**64 - 1


def le(n: int, width: int) -> bytes:
    return n.to_bytes(width, "little")


def tok(a: int, e: int, c: int) -> bytes:
    return le(a, 8) + le(e, 8) + le(c, 8)


# -- encoder ----------------------------------------------------------------


def test_encode_matches_the_spec_byte_for_byte():
    """Flags, field order, optional fields and lengths as in the WIT docs."""
    items = [
        (None, fc.Request("s", fc.Token(0, 0, 1))),
        (
            b"\xaa\xbb",
            fc.Request("ü", fc.Token(U64, 2, 3), fc.Policy.ALLOW_EQUAL, op_id="op", expected_version=7),
        ),
        (b"", fc.Request("t", fc.Token(1, 0, 5), expected_version=0)),
    ]
    want = (
        le(3, 4)
        + b"\x00" + tok(0, 0, 1) + le(1, 4) + b"s"
        + bytes([0b1111]) + tok(U64, 2, 3) + le(7, 8) + le(2, 4) + "ü".encode() + le(2, 4) + b"op"
        + le(2, 4) + b"\xaa\xbb"
        + bytes([0b0101]) + tok(1, 0, 5) + le(0, 8) + le(1, 4) + b"t" + le(0, 4)
    )
    batch, n, size = _packed.encode(items)
    assert (batch, n) == (want, 3)
    assert size == 1 + (2 + 2 + 2) + 1  # scopes, op-ids, states: what call_bytes bounds


def test_encode_empty_batch_and_refusals():
    """An empty batch is a zero count; wrong types fail before any byte is sent."""
    assert _packed.encode([]) == (le(0, 4), 0, 0)
    with pytest.raises(TypeError):
        _packed.encode([(None, {"scope": "s"})])
    with pytest.raises(TypeError):
        _packed.encode([("text", fc.Request("s", fc.Token(0, 0, 1)))])


# -- decoder ----------------------------------------------------------------

# Case order of the WIT enums, spelled out here rather than taken from the codec.
REASONS = ["missing-token", "empty-scope", "scope-too-long", "empty-op-id", "op-id-too-long", "equal-token-unguarded"]
DAMAGE = ["truncated", "length-mismatch", "checksum-mismatch", "malformed"]

EVERY_TAG = [
    (b"\x00" + le(3, 8) + tok(0, 1, 2) + le(3, 4) + b"xyz", fc.Applied(3, fc.Token(0, 1, 2), b"xyz")),
    (b"\x00" + le(1, 8) + tok(U64, U64, U64) + le(0, 4), fc.Applied(1, fc.Token(U64, U64, U64), b"")),
    (b"\x01" + le(U64, 8), fc.Duplicate(U64)),
    (b"\x02" + tok(1, 2, 3) + tok(1, 2, 4), fc.StaleFence(fc.Token(1, 2, 3), fc.Token(1, 2, 4))),
    (b"\x03" + le(5, 8) + le(6, 8), fc.VersionConflict(5, 6)),
    *[(bytes([128, i]), fc.InvalidRequest(r)) for i, r in enumerate(REASONS)],
    *[(bytes([129, i]), fc.CorruptState(r)) for i, r in enumerate(DAMAGE)],
    (bytes([130, 255]), fc.UnsupportedStateVersion(255)),
    (bytes([131]) + le(9, 4) + "ledger/ü".encode(), fc.ScopeMismatch("ledger/ü")),
    (bytes([131]) + le(0, 4), fc.ScopeMismatch("")),
    (bytes([132]) + le(0, 8) + le(U64, 8), fc.ForeignAuthority(0, U64)),
    (bytes([133]), fc.Exhausted()),
]


def same(got, want) -> bool:
    """Decisions compare by value; errors by class, reason and payload."""
    if isinstance(want, fc.FenceError):
        fields = ("reason", "format_version", "stored_scope", "stored", "presented")
        return type(got) is type(want) and all(getattr(got, f, None) == getattr(want, f, None) for f in fields)
    return got == want


def test_decode_reads_every_tag():
    """Each output case, alone and all in one batch, decodes to the public type."""
    for raw, want in EVERY_TAG:
        [got] = _packed.decode(le(1, 4) + raw, 1)
        assert same(got, want), (raw.hex(), got)
    got = _packed.decode(le(len(EVERY_TAG), 4) + b"".join(r for r, _ in EVERY_TAG), len(EVERY_TAG))
    assert all(same(g, w) for g, (_, w) in zip(got, EVERY_TAG))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", 0),
        (le(1, 4), 1),  # count promises an item that is not there
        (le(2, 4) + bytes([133]), 1),  # count differs from the items sent
        (le(0, 4) + b"\x00", 0),  # trailing byte
        (le(1, 4) + bytes([133, 0]), 1),  # trailing byte after an item
        (le(1, 4) + bytes([4]), 1),  # unknown decision tag
        (le(1, 4) + bytes([134]), 1),  # unknown error tag
        (le(1, 4) + bytes([128, len(REASONS)]), 1),  # unknown invalid-reason
        (le(1, 4) + bytes([129, len(DAMAGE)]), 1),  # unknown corruption
        (le(1, 4) + bytes([131]) + le(2, 4) + b"\xc3\x28", 1),  # scope not UTF-8
        (le(1, 4) + bytes([131]) + le(5, 4) + b"abc", 1),  # scope runs past the end
        (le(1, 4) + b"\x00" + le(1, 8) + tok(0, 0, 1) + le(4, 4) + b"abc", 1),  # state runs past the end
        (le(1, 4) + b"\x00" + le(1, 8) + tok(0, 0, 1) + le(U64 & 0xFFFFFFFF, 4), 1),
    ],
)
def test_decode_refuses_malformed_output(raw, expected):
    """Anything off the format raises PackedFormatError (a HostError), never an outcome."""
    with pytest.raises(fc.PackedFormatError) as e:
        _packed.decode(raw, expected)
    assert isinstance(e.value, fc.HostError) and e.value.side == "output" and not e.value.retryable


def test_decode_refuses_every_truncation():
    """Every strict prefix of a valid output is refused."""
    full = le(len(EVERY_TAG), 4) + b"".join(r for r, _ in EVERY_TAG)
    for cut in range(len(full)):
        with pytest.raises(fc.PackedFormatError):
            _packed.decode(full[:cut], len(EVERY_TAG))


# -- against the component ----------------------------------------------------


def crafted_states() -> list[tuple[bytes, fc.Request]]:
    """The vector files' `replace` states, each with every check that follows
    it in its file: they reach unsupported-state-version, malformed and
    exhausted, which no state this test builds can."""
    found = []
    for path in sorted(VECTORS.glob("*.json")):
        steps = json.loads(path.read_text(encoding="utf-8")).get("steps", [])
        for i, step in enumerate(steps):
            if step.get("damage") == "replace" and step.get("state", "fence") == "fence":
                state = bytes.fromhex(step["hex"])
                found += [(state, parse_request(s["check"])) for s in steps[i + 1 :] if "check" in s]
    return found


SCOPES = ["report/july", "ledger/ü", "日本/報告", "a", "x" * 1024, "x" * 1025, "", "é" * 513]
OP_IDS = [None, None, "op-1", "op-2", "", "o" * 256, "ö" * 129]


def random_request(rng: random.Random, scope: str, around: int) -> fc.Request:
    if rng.random() < 0.15:
        scope = rng.choice(SCOPES)
    roll = rng.random()
    authority = 0 if roll < 0.9 else rng.choice([1, U64])
    epoch, counter = rng.choice(
        [(0, around + rng.randint(-2, 2))] * 4 + [(0, 0), (U64, U64), (rng.randint(0, 3), rng.randint(0, 9))]
    )
    ev = rng.choice([None, None, None, 0, 1, 2, U64])
    return fc.Request(
        scope, fc.Token(authority, epoch, min(max(counter, 0), U64)),
        rng.choice(list(fc.Policy)), op_id=rng.choice(OP_IDS), expected_version=ev,
    )


def damaged(rng: random.Random, state: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        b = bytearray(state)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 1:
        return state[: rng.randrange(len(state))]
    if kind == 2:
        return state + b"\x00"
    return bytes(rng.randrange(256) for _ in range(rng.randrange(80)))


def random_items(rng: random.Random, crafted, pool) -> list[tuple[bytes | None, fc.Request]]:
    items = []
    for _ in range(rng.randrange(0, 60)):
        roll = rng.random()
        if roll < 0.12:
            state, request = rng.choice(crafted)
            if rng.random() < 0.5:
                items.append((state, request))  # as the vector checks it
                continue
            scope, around = request.scope, request.token.counter
        else:
            state, scope, around = rng.choice(pool)
            if state and roll < 0.3:
                state = damaged(rng, state)
        items.append((state, random_request(rng, scope, around)))
    return items


def outcome(guest, state, request):
    try:
        return guest.check(state, request)
    except fc.FenceError as e:
        return e


def key(o) -> tuple:
    """Everything an outcome carries (state bytes included), comparable across paths."""
    if isinstance(o, fc.FenceError):
        return (type(o).__name__, o.reason, getattr(o, "format_version", None),
                getattr(o, "stored_scope", None), getattr(o, "stored", None), getattr(o, "presented", None))
    return (type(o).__name__, o)


def test_random_batches_agree_with_typed_batch_and_single_checks(guest):
    """Typed check-batch, check-packed (the public check_batch, through the core
    module; and through the component API) and single checks give identical
    decisions, errors and state bytes; every outcome and error kind is reached."""
    assert guest._runtime._core is not None, "the fast transport must be the one under test"
    rng = random.Random(20261130)
    crafted = crafted_states()
    # A pool of states: fresh, valid at several versions, damaged, crafted.
    pool: list[tuple[bytes | None, str, int]] = [(None, s, 0) for s in SCOPES[:5]]
    for scope in SCOPES[:5]:
        state = None
        for counter in range(1, 6):
            d = guest.check(state, fc.Request(scope, fc.Token(0, 0, counter), fc.Policy.ALLOW_EQUAL, op_id=f"op-{counter % 3}"))
            state = d.state
            pool.append((state, scope, counter))
    seen = set()
    for round_ in range(41):
        # The last batch: every crafted pair as its vector checks it.
        items = random_items(rng, crafted, pool) if round_ < 40 else list(crafted)
        packed = guest.check_batch(items)
        batch, n, _ = _packed.encode(items)
        via_component = _packed.decode(guest._check_packed(batch, n, component_api=True), n)
        typed = guest._check_batch_typed(items)
        single = [outcome(guest, s, r) for s, r in items]
        want = [key(o) for o in single]
        assert [key(o) for o in packed] == want
        assert [key(o) for o in via_component] == want
        assert [key(o) for o in typed] == want
        for o in packed:
            seen.add((type(o).__name__, getattr(o, "reason", None) if isinstance(o, fc.FenceError) else None))
        # Applied states feed later batches (deeper windows, later versions).
        pool += [(o.state, r.scope, o.highest.counter) for o, (_, r) in zip(packed, items) if isinstance(o, fc.Applied)][:4]
    every = {("Applied", None), ("Duplicate", None), ("StaleFence", None), ("VersionConflict", None),
             ("UnsupportedStateVersion", None), ("ScopeMismatch", None), ("ForeignAuthority", None), ("Exhausted", None)}
    every |= {("InvalidRequest", r) for r in REASONS}
    every |= {("CorruptState", r) for r in DAMAGE}
    assert every <= seen, f"not reached: {sorted(every - seen)}"


def every_way(guest, metered, state, request) -> list[tuple]:
    """One check through every way it can cross, each outcome as ``key``:
    the single-check export (``check``), a one-item check-packed batch on the
    core module, the typed ``check`` (the component API), and ``check`` on a
    metered runtime (the same bytes loaded from a path)."""
    batch, _, _ = _packed.encode([(state, request)])
    ways = (
        lambda: guest.check(state, request),
        lambda: guest._check_one("check", batch, signed=False, single=False),
        lambda: guest._check_typed(state, request),
        lambda: metered.check(state, request),
    )
    out = []
    for way in ways:
        try:
            out.append(key(way()))
        except fc.FenceError as e:
            out.append(key(e))
    return out


def test_the_single_check_export_agrees_with_the_component_api(guest):
    """``check`` through the core module's single-check export decides
    exactly as check-packed, the typed ``check`` and a metered runtime do
    (decision, error and state bytes), on random pairs (damaged states,
    every outcome and error kind), every crafted vector state, and inputs
    too large for the guest's static buffers (which take check-packed)."""
    assert guest._runtime._one, "the single-check export must be the one under test"
    metered = fc.Runtime(PACKAGED).instance()
    assert metered._runtime.metered and not guest._runtime.metered
    rng = random.Random(20261203)
    crafted = crafted_states()
    pool: list[tuple[bytes | None, str, int]] = [(None, s, 0) for s in SCOPES[:5]]
    for scope in SCOPES[:5]:
        state = None
        for counter in range(1, 6):
            r = fc.Request(scope, fc.Token(0, 0, counter), fc.Policy.ALLOW_EQUAL, op_id=f"op-{counter % 3}")
            state = guest.check(state, r).state
            pool.append((state, scope, counter))
    seen = set()
    items = list(crafted)
    for _ in range(30):
        items += random_items(rng, crafted, pool)
    # Larger than the 16 KiB input buffer: the guest answers -2 and check-packed decides.
    big_state = next(s for s, _, _ in pool if s is not None)
    items += [(big_state + bytes(20_000), fc.Request("report/july", fc.Token(0, 0, 9))),
              (None, fc.Request("x" * 17_000, fc.Token(0, 0, 1))),
              (big_state, fc.Request(pool[6][1], fc.Token(0, 0, 9), op_id="o" * 16_400))]
    for state, request in items:
        one, *others = every_way(guest, metered, state, request)
        assert all(o == one for o in others), (request, one, others)
        seen.add(one[0])
    assert {"Applied", "Duplicate", "StaleFence", "VersionConflict", "InvalidRequest", "CorruptState",
            "UnsupportedStateVersion", "ScopeMismatch", "ForeignAuthority", "Exhausted"} <= seen, seen


def test_the_guest_refuses_malformed_input_as_batch_error(guest, monkeypatch):
    """The component's side of the format: each malformation the WIT names is
    `batch-error malformed`, which the host raises as PackedFormatError."""
    good, n, _ = _packed.encode([(b"\x01", fc.Request("s", fc.Token(0, 0, 1), op_id="o"))])
    assert guest._check_packed(good, n)[:4] == le(1, 4)
    flags = 4  # offset of the first item's flags
    bad = {
        "truncated": good[:-1],
        "truncated count": good[:3],
        "trailing byte": good + b"\x00",
        "count above items": le(2, 4) + good[4:],
        "reserved flag bit": good[:flags] + bytes([good[flags] | 0x10]) + good[flags + 1 :],
        "scope not UTF-8": good.replace(b"\x01\x00\x00\x00s", b"\x01\x00\x00\x00\xff"),
        "op-id not UTF-8": good.replace(b"\x01\x00\x00\x00o", b"\x01\x00\x00\x00\xc3"),
    }
    for what, raw in bad.items():
        assert raw != good, what
        assert guest._check_packed(raw, 1) == "malformed", what
        assert guest._check_packed(raw, 1, single=True) == "malformed", what  # the single-check export's -1
        assert guest._check_packed(raw, 1, component_api=True) == "malformed", what
    assert guest._check_packed(le(0, 4), 0) == le(0, 4)
    # Through the public API: a broken encoder is a HostError, never an outcome.
    with monkeypatch.context() as m:
        m.setattr(_packed, "encode", lambda items: (bad["reserved flag bit"], 1, 0))
        with pytest.raises(fc.PackedFormatError) as e:
            guest.check_batch([(None, fc.Request("s", fc.Token(0, 0, 1)))])
        assert e.value.side == "input" and isinstance(e.value, fc.HostError)
    assert isinstance(guest.check_batch([(None, fc.Request("s", fc.Token(0, 0, 1)))])[0], fc.Applied)


def test_malformed_guest_output_is_a_host_error(guest, monkeypatch):
    """Output the decoder cannot read raises PackedFormatError and replaces the
    instance; no decision is returned."""
    one = [(None, fc.Request("s", fc.Token(0, 0, 1)))]
    real = _core.Packed.call
    monkeypatch.setattr(_core.Packed, "call", lambda self, batch: real(self, batch)[:-1])
    with pytest.raises(fc.PackedFormatError) as e:
        guest.check_batch(one)
    assert e.value.side == "output"
    monkeypatch.setattr(_core.Packed, "call", real)
    assert isinstance(guest.check_batch(one)[0], fc.Applied)


def fake_core(ret: int) -> str:
    """A stand-in core module with check-packed's exports whose result area is
    at ``ret``; the test writes what that area says."""
    return f"""(module
  (memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
  (func (export "{_core.EXPORT}") (param i32 i32) (result i32) i32.const {ret})
  (func (export "{_core.POST_RETURN}") (param i32)))"""


@pytest.mark.parametrize(
    ("ret", "area", "want"),
    [
        (64, (0, 100, 3), b"abc"),  # control: a well-formed ok result
        (64, (1, 0, 0), "malformed"),  # control: batch-error malformed
        (64, (0, 65536 - 2, 3), None),  # output runs past the end of memory
        (64, (0, 2**32 - 1, 2), None),  # pointer outside memory
        (64, (2, 0, 0), None),  # unknown result discriminant
        (64, (1, 1, 0), None),  # unknown batch-error case
        (66, (0, 0, 0), None),  # result area not 4-aligned
        (65536 - 8, (0, 0, 0), None),  # result area runs past the end of memory
    ],
)
def test_core_transport_checks_what_the_guest_returns(ret, area, want):
    """Pointers, lengths and discriminants from the core module are checked,
    never trusted: anything off is PackedFormatError, not a read."""
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    packed = _core.Packed(store, wasmtime.Module(engine, wasmtime.wat2wasm(fake_core(ret))))
    base = ctypes.addressof(packed._memory.data_ptr(store).contents)
    ctypes.memmove(base + 100, b"abc", 3)
    if ret + 12 <= 65536:
        ctypes.memmove(base + ret, struct.pack("<BxxxII", *area), 12)
    if want is not None:
        assert packed.call(b"x") == want
    else:
        with pytest.raises(fc.PackedFormatError) as e:
            packed.call(b"x")
        assert e.value.side == "output"


def fake_one(input_at: int, capacity: int, answer: int, pages: int = 1) -> str:
    """A stand-in core module with check-packed's exports (answering the
    ok result at 100, "abc") and the single-check exports: its input buffer
    at ``input_at`` of ``capacity`` bytes, and ``fencecheck-one`` answering
    ``answer`` whatever the input."""
    return f"""(module
  (memory (export "memory") {pages})
  (data (i32.const 64) "\\00\\00\\00\\00\\64\\00\\00\\00\\03\\00\\00\\00")
  (data (i32.const 100) "abc")
  (data (i32.const 200) "one")
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
  (func (export "{_core.EXPORT}") (param i32 i32) (result i32) i32.const 64)
  (func (export "{_core.POST_RETURN}") (param i32))
  (func (export "{_core.ONE_INPUT}") (result i64) i64.const {(input_at << 32) | capacity})
  (func (export "{_core.ONE}") (param i32) (result i64) i64.const {answer}))"""


@pytest.mark.parametrize(
    ("input_at", "capacity", "answer", "batch", "want"),
    [
        (4096, 256, (200 << 32) | 3, b"x", b"one"),  # control: a well-formed answer
        (4096, 256, -1, b"x", "malformed"),  # control: malformed
        (4096, 256, -2, b"x", b"abc"),  # does not fit the guest's buffers: check-packed answers
        (4096, 256, (200 << 32) | 3, b"x" * 257, b"abc"),  # larger than the input buffer: check-packed
        (65536 - 8, 256, (200 << 32) | 3, b"x", b"abc"),  # input buffer outside memory: never used
        (4096, 256, ((65536 - 2) << 32) | 3, b"x", None),  # answer runs past the end of memory
        (4096, 256, (2**31 - 1) << 32 | 2, b"x", None),  # answer outside memory
        (4096, 256, -3, b"x", None),  # a negative answer that is no case
        (4096, 256, -(2**63), b"x", None),  # the sign bit: outside a wasm32 memory
    ],
)
def test_single_check_export_checks_what_the_guest_returns(input_at, capacity, answer, batch, want):
    """The single-check export's buffer and answer are bounds-checked, never
    trusted: an input buffer outside memory disables the export, an answer
    outside memory is PackedFormatError, -1 is malformed, -2 (or a batch
    larger than the buffer) goes through check-packed."""
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    module = wasmtime.Module(engine, wasmtime.wat2wasm(fake_one(input_at, capacity, answer)))
    assert _core.has_one(module)
    packed = _core.Packed(store, module, one=True)
    assert packed.has_one == (input_at + capacity <= 65536)
    if want is not None:
        assert packed.call_one(batch) == want
    else:
        with pytest.raises(fc.PackedFormatError) as e:
            packed.call_one(batch)
        assert e.value.side == "output"
    if packed.has_one and len(batch) <= capacity:  # the batch was copied into the input buffer
        base = ctypes.addressof(packed._memory.data_ptr(store).contents)
        assert ctypes.string_at(base + input_at, len(batch)) == batch


def test_single_check_exports_of_another_type_are_not_used():
    """``fencecheck-one`` or its input export with another core type: the
    module keeps the three-call check-packed path (``has_one`` is false), as
    the Rust host's ``CoreModule::checked``."""
    engine = wasmtime.Engine()
    good = fake_one(4096, 256, 3)
    for bad in (
        good.replace("(param i32) (result i64) i64.const", "(param i64) (result i64) i64.const"),
        good.replace("(param i32) (result i64) i64.const", "(param i32) (result i32) i32.const"),
        good.replace("(result i64) i64.const 17592186044672", "(result i32) i32.const 256"),
        good.replace(f'(export "{_core.ONE}")', ""),
    ):
        assert bad != good
        module = wasmtime.Module(engine, wasmtime.wat2wasm(bad))
        assert _core.checked(module) is not None and not _core.has_one(module)
    assert _core.has_one(wasmtime.Module(engine, wasmtime.wat2wasm(good)))


def test_core_module_is_used_only_for_the_expected_shape():
    """Not a component, a truncated one, or a core module without the exports:
    no fast transport (the component API is used instead)."""
    engine = wasmtime.Engine()
    component = importlib.resources.files("fencecheck").joinpath("fencecheck.wasm").read_bytes()
    assert _core.core_module(engine, component) is not None
    assert _core.core_module(engine, component[:-10]) is None
    assert _core.core_module(engine, b"\0asm\x01\x00\x00\x00") is None  # a core module, not a component
    assert _core.core_module(engine, b"not wasm at all") is None
    # A component whose one core module lacks the post-return export.
    wat = fake_core(64).replace(f'(export "{_core.POST_RETURN}")', "")
    core = bytes(wasmtime.wat2wasm(wat))
    assert len(core) < 2**14
    wrapped = b"\0asm\x0d\x00\x01\x00\x01" + bytes([len(core) & 0x7F | 0x80, len(core) >> 7]) + core
    assert _core._modules(wrapped) == [core]
    assert _core.core_module(engine, wrapped) is None


def test_packed_batch_is_bounded_and_fuelled(runtime):
    """call_bytes bounds check-packed as it bounds check; fuel bounds it on a
    metered runtime (a component loaded from a path)."""
    small = fc.Runtime(limits=fc.Limits(call_bytes=16)).instance()
    with pytest.raises(fc.TooLarge):
        small.check_batch([(b"x" * 17, fc.Request("s", fc.Token(0, 0, 1)))])
    starving = fc.Runtime(PACKAGED, limits=fc.Limits(fuel_per_check=50, fuel_per_input_byte=0)).instance()
    with pytest.raises(fc.GuestTrapped) as e:
        starving.check_batch([(None, fc.Request("s", fc.Token(0, 0, 1)))])
    assert e.value.call == "check-packed"
