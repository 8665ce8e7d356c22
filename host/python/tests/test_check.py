"""The typed API over the real component: decisions are values, refusals and
infrastructure failures are two separate exception families."""

import pytest

import fencecheck as fc

from conftest import PACKAGED

U64 = 2**64 - 1


def req(counter, scope="report/july", **kw):
    return fc.Request(scope, fc.Token(0, 0, counter), **kw)


def test_first_check_applies_at_version_1(guest):
    """A fresh scope accepts its first token at version 1 and returns a state."""
    d = guest.check(None, req(41))
    assert isinstance(d, fc.Applied)
    assert (d.version, d.highest) == (1, fc.Token(0, 0, 41))
    assert isinstance(d.state, bytes) and d.state


def test_stale_fence_is_a_value_not_an_exception(guest):
    """An older token returns StaleFence (definitive), it does not raise."""
    state = guest.check(None, req(42)).state
    d = guest.check(state, req(41))
    assert d == fc.StaleFence(presented=fc.Token(0, 0, 41), highest=fc.Token(0, 0, 42))
    assert d.name == "stale-fence"


def test_refusals_are_never_retryable_and_infrastructure_errors_are_separate():
    """FenceError and HostError are disjoint families; only HostError is retryable."""
    assert not issubclass(fc.FenceError, fc.HostError) and not issubclass(fc.HostError, fc.FenceError)
    assert fc.FenceError.retryable is False and fc.InvalidRequest.retryable is False
    assert fc.GuestTrapped.retryable is True


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (fc.Request("s", fc.Token(0, 0, 0)), "missing-token"),
        (fc.Request("", fc.Token(0, 0, 1)), "empty-scope"),
        (fc.Request("x" * 1025, fc.Token(0, 0, 1)), "scope-too-long"),
        (fc.Request("s", fc.Token(0, 0, 1), op_id=""), "empty-op-id"),
        (fc.Request("s", fc.Token(0, 0, 1), op_id="ö" * 129), "op-id-too-long"),
    ],
)
def test_invalid_request_raises_with_reason(guest, request_, reason):
    """Malformed requests raise InvalidRequest naming the WIT reason."""
    with pytest.raises(fc.InvalidRequest) as e:
        guest.check(None, request_)
    assert (e.value.name, e.value.reason) == ("invalid-request", reason)


def test_damaged_state_raises_corrupt_state(guest):
    """A single flipped bit in a stored state is refused as corrupt-state."""
    state = bytearray(guest.check(None, req(1)).state)
    state[20] ^= 1
    with pytest.raises(fc.CorruptState) as e:
        guest.check(bytes(state), req(2))
    assert e.value.reason == "checksum-mismatch"


def test_scope_and_authority_errors_carry_their_fields(guest):
    """scope-mismatch names the stored scope; foreign-authority both authorities."""
    state = guest.check(None, req(1, scope="ledger/ü")).state
    with pytest.raises(fc.ScopeMismatch) as e:
        guest.check(state, req(2, scope="ledger/u"))
    assert e.value.stored_scope == "ledger/ü"
    with pytest.raises(fc.ForeignAuthority) as f:
        guest.check(state, fc.Request("ledger/ü", fc.Token(U64, 0, 2)))
    assert (f.value.stored, f.value.presented) == (0, U64)


def test_allow_equal_duplicate_and_version_conflict(guest):
    """Op-ids make a repeat a Duplicate; a stale expected version a VersionConflict."""
    s1 = guest.check(None, req(5, policy=fc.Policy.ALLOW_EQUAL, op_id="a")).state
    s2 = guest.check(s1, req(5, policy=fc.Policy.ALLOW_EQUAL, op_id="b")).state
    assert guest.check(s2, req(5, policy=fc.Policy.ALLOW_EQUAL, op_id="a")) == fc.Duplicate(1)
    assert guest.check(s2, req(6, expected_version=1)) == fc.VersionConflict(1, 2)


def test_u64_extremes_round_trip(guest):
    """u64::MAX survives lowering and lifting unchanged."""
    d = guest.check(None, fc.Request("m", fc.Token(U64, U64, U64), expected_version=0))
    assert d.highest == fc.Token(U64, U64, U64)
    info = guest.inspect(d.state)
    assert (info.scope, info.authority, info.version, info.highest) == ("m", U64, 1, d.highest)


def test_batch_matches_single_checks_in_order(guest):
    """check_batch returns, per item and in order, what check returns (errors as values)."""
    state = guest.check(None, req(10)).state
    items = [
        (None, req(1)),
        (state, req(9)),
        (state, req(11, op_id="x")),
        (b"", req(1)),
        (state, fc.Request("", fc.Token(0, 0, 1))),
        (state, req(12, expected_version=7)),
    ]
    batch = guest.check_batch(items)
    assert len(batch) == len(items)
    for (s, r), got in zip(items, batch):
        try:
            single = guest.check(s, r)
        except fc.FenceError as e:
            assert type(got) is type(e) and got.reason == e.reason
        else:
            assert got == single
    assert guest.check_batch([]) == []


def test_bad_python_values_are_refused_before_the_guest():
    """Out-of-range integers, bools and lone surrogates never reach the ABI."""
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(ValueError):
            fc.Token(0, 0, bad)
    with pytest.raises(ValueError):
        fc.Request("\ud800", fc.Token(0, 0, 1))
    with pytest.raises(ValueError):
        fc.Request("s", fc.Token(0, 0, 1), policy="loose")


STARVING = fc.Limits(fuel_per_check=50, fuel_per_input_byte=0)
"""A fuel budget no check fits in: traps any metered runtime."""


def test_a_trap_is_guest_trapped_and_the_instance_recovers():
    """Fuel exhaustion raises GuestTrapped, through each transport; the
    replaced instance then works. (A component loaded from a path is
    metered; the packaged one is not, below.)"""
    starving = fc.Runtime(PACKAGED, limits=STARVING).instance()
    assert starving._runtime._one, "the single-check export must be among the transports under test"
    for call in (starving.check, starving._check_typed):
        with pytest.raises(fc.GuestTrapped) as e:
            call(None, req(1))
        assert e.value.call == "check" and e.value.retryable
    with pytest.raises(fc.GuestTrapped):
        starving.check_batch([(None, req(1))])
    starving._runtime.limits = fc.Limits()
    assert isinstance(starving.check(None, req(1)), fc.Applied)


def test_only_the_packaged_component_runs_without_fuel():
    """The Rust host's rule: the packaged component (Runtime(), or bytes
    equal to it) is unmetered, so a budget that traps a metered runtime does
    not stop it; a path (even to the very same bytes), other bytes, or
    metered=True are metered, and metered=False is refused for them. Fails
    if fuel were off for a path-loaded component."""
    packaged = PACKAGED.read_bytes()
    unmetered = [fc.Runtime(limits=STARVING), fc.Runtime(component=packaged, limits=STARVING),
                 fc.Runtime(limits=STARVING, metered=False)]
    for rt in unmetered:
        assert rt.metered is False
        guest = rt.instance()
        d = guest.check(None, req(1))
        assert isinstance(d, fc.Applied)
        assert isinstance(guest.check_batch([(d.state, req(2))])[0], fc.Applied)
        assert isinstance(guest._check_typed(d.state, req(2)), fc.Applied)
        assert guest.inspect(d.state).version == 1
    name = b"fencecheck-test"
    other = packaged + bytes([0, len(name) + 2, len(name)]) + name + b"x"  # a custom section: other bytes
    metered = [fc.Runtime(PACKAGED, limits=STARVING), fc.Runtime(component=other, limits=STARVING),
               fc.Runtime(limits=STARVING, metered=True)]
    for rt in metered:
        assert rt.metered is True
        guest = rt.instance()
        for call in (guest.check, guest._check_typed):
            with pytest.raises(fc.GuestTrapped):
                call(None, req(1))
        with pytest.raises(fc.GuestTrapped):
            guest.check_batch([(None, req(1))])
        with pytest.raises(fc.GuestTrapped):
            guest.inspect(b"\x01\x02")
    for refused in (lambda: fc.Runtime(PACKAGED, metered=False), lambda: fc.Runtime(component=other, metered=False)):
        with pytest.raises(ValueError, match="only the packaged component"):
            refused()


def test_a_metered_runtime_decides_as_the_packaged_one(runtime):
    """Default limits never starve a metered runtime on inputs within
    call_bytes: fuel per check plus fuel per input byte covers the
    documented cost bound, including long inputs that take check-packed
    (larger than the single-check buffer) and are refused by the guest."""
    metered = fc.Runtime(PACKAGED).instance()
    unmetered = runtime.instance()
    state = unmetered.check(None, req(1, op_id="o")).state
    cases = [(None, req(1)), (state, req(2)), (None, req(1, scope="é" * 1_000_000)),
             (b"\x00" * 200_000, req(1)), (state, req(3, op_id="ö" * 50_000))]
    for s, r in cases:
        got = []
        for guest in (metered, unmetered):
            try:
                got.append(guest.check(s, r))
            except fc.FenceError as e:
                got.append(repr(e))
        assert got[0] == got[1], (r.scope[:10], got)


def test_oversized_call_is_refused_before_the_guest():
    """Inputs above call_bytes raise TooLarge without calling the guest."""
    small = fc.Runtime(limits=fc.Limits(call_bytes=16)).instance()
    with pytest.raises(fc.TooLarge):
        small.check(b"x" * 17, req(1))


def test_missing_or_broken_component_fails_to_load(tmp_path):
    """A missing file or non-component bytes raise ComponentLoadError."""
    with pytest.raises(fc.ComponentLoadError):
        fc.Runtime(tmp_path / "absent.wasm")
    with pytest.raises(fc.ComponentLoadError):
        fc.Runtime(component=b"\0asm not a component")


def test_inspect_refuses_garbage(guest):
    """inspect raises CorruptState for bytes that are not a state."""
    with pytest.raises(fc.CorruptState):
        guest.inspect(b"\x01\x02")


def test_batch_accepts_any_iterable_and_refuses_wrong_types(guest):
    """check_batch takes a generator; a non-Request item raises TypeError before the call."""
    assert [d.version for d in guest.check_batch((None, req(n)) for n in (1, 2))] == [1, 1]
    with pytest.raises(TypeError):
        guest.check_batch([(None, {"scope": "s"})])
    with pytest.raises(TypeError):
        guest.check("not bytes", req(1))


def test_an_unknown_check_error_case_is_a_host_error():
    """A check-error case outside the contract raises GuestTrapped (a HostError), never Exhausted."""
    from types import SimpleNamespace

    from fencecheck._guest import _error_from_generic

    with pytest.raises(fc.GuestTrapped, match="unknown check-error case 'out-of-range'"):
        _error_from_generic(SimpleNamespace(tag="out-of-range", payload=None))
    assert isinstance(_error_from_generic(SimpleNamespace(tag="exhausted", payload=None)), fc.Exhausted)
