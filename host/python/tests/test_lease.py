"""The lease authority through the same component: grants, busy, renew, the
delayed release, and errors that are never retryable."""

import doctest

import pytest

import fencecheck as fc


def test_grants_are_ordered_and_a_delayed_release_changes_nothing(guest):
    """A expires, B gets the next token; A's late renew is Lost, its release NotOwner."""
    a = guest.acquire(None, "report/july", "a7", now=0, ttl=30_000)
    assert (a.token, a.expires_at) == (fc.Token(0, 0, 1), 30_000)
    assert guest.acquire(a.state, "report/july", "b9", now=29_999, ttl=30_000) == fc.Busy("a7", 30_000)
    b = guest.acquire(a.state, "report/july", "b9", now=30_000, ttl=30_000)
    assert b.token == fc.Token(0, 0, 2)
    assert guest.renew(b.state, "a7", a.token, now=30_001, ttl=1) == fc.Lost()
    assert guest.release(b.state, "a7", a.token) == fc.NotOwner()
    assert isinstance(guest.release(b.state, "b9", b.token), fc.Released)


def test_restore_starts_the_next_epoch(guest):
    """After restore the next grant is (epoch + 1, 1), above every older token."""
    a = guest.acquire(None, "l", "a", now=0, ttl=1)
    r = guest.restore(a.state)
    assert r.epoch == 1
    assert guest.acquire(r.state, "l", "b", now=5, ttl=1).token == fc.Token(0, 1, 1)


@pytest.mark.parametrize(
    ("call", "name", "reason"),
    [
        (lambda g: g.acquire(None, "", "a", 0, 1), "invalid-request", "empty-lock"),
        (lambda g: g.acquire(None, "l", "a", 0, 0), "invalid-request", "zero-ttl"),
        (lambda g: g.restore(None), "invalid-request", "no-state"),
        (lambda g: g.acquire(b"LS\x01", "l", "a", 0, 1), "corrupt-state", "truncated"),
    ],
)
def test_lease_errors_are_refusals(guest, call, name, reason):
    """Bad lease requests raise LeaseError with the WIT names; never retryable."""
    with pytest.raises(fc.LeaseError) as e:
        call(guest)
    assert (e.value.name, e.value.reason, e.value.retryable) == (name, reason, False)


def test_package_docstring_example_runs():
    """The example in the package docstring is executed and holds."""
    result = doctest.testmod(fc)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    ("call", "tag", "payload"),
    [
        ("acquire", "ok", ("granted", {})),
        ("renew", "ok", ("expired", None)),
        ("release", "ok", ("lost", None)),
        ("restore", "ok", ("restored", {})),
        ("renew", "err", ("out-of-range", None)),
        ("renew", "err", "not a variant"),
    ],
)
def test_an_unknown_lease_case_is_a_host_error(call, tag, payload):
    """An outcome or lease-error case outside the contract raises GuestTrapped, never a guessed outcome."""
    from fencecheck._guest import _lease_result

    with pytest.raises(fc.GuestTrapped, match="unknown"):
        _lease_result(call, tag, payload)


def test_known_lease_cases_still_map():
    """The contract's own cases pass through (ok payloads) or raise their LeaseError."""
    from fencecheck._guest import _lease_result

    assert _lease_result("renew", "ok", ("lost", None)) == ("lost", None)
    assert _lease_result("restore", "ok", {"epoch": 1}) == {"epoch": 1}
    with pytest.raises(fc.LeaseError) as e:
        _lease_result("renew", "err", ("exhausted", None))
    assert e.value.name == "exhausted"
