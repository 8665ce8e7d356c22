"""Which component versions this package runs (as host/runtime/src/version.rs).

A component's version is its WIT package version, carried in its export
names (``fencecheck:fence/check@0.1.0``). This package was written against
``WIT_VERSION`` (the ``package fencecheck:fence@…;`` line of wit/fence.wit;
tests/test_component_version.py keeps the two equal) and runs a component
only if its exports carry a version of the same release line: for 0.x the
same major and minor, any patch, older or newer. Anything else has another
contract and is refused at load with ``UnsupportedComponent``. Within a line
versions only add (0.1.1 added ``fencecheck:fence/auth``): a call that needs
what an older component lacks raises ``UnsupportedFeature``, and every other
call works.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple, Optional

from ._types import UnsupportedComponent

WIT_PACKAGE = "fencecheck:fence"
WIT_VERSION = "0.1.1"

# MAJOR.MINOR.PATCH, no leading zeros, no pre-release or build tag.
_SEMVER = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")


def _parse(text: str) -> Optional[tuple[int, int, int]]:
    m = _SEMVER.fullmatch(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def supported() -> str:
    """The versions this package runs, e.g. ``fencecheck:fence@0.1.x``."""
    built = _parse(WIT_VERSION)
    if built is None:
        return f"{WIT_PACKAGE}@{WIT_VERSION}"
    major, minor, _ = built
    return f"{WIT_PACKAGE}@" + (f"0.{minor}.x" if major == 0 else f"{major}.x")


def _serves(found: tuple[int, int, int], built: tuple[int, int, int]) -> bool:
    """The same release line (for 0.x the same minor), older or newer."""
    return found[:2] == built[:2] if built[0] == 0 else found[0] == built[0]


class Vetted(NamedTuple):
    """A component this package runs."""

    version: str
    """Its WIT package version, e.g. ``0.1.0``."""
    check_interface: str
    """Its check interface's full name, e.g. ``fencecheck:fence/check@0.1.0``."""
    lease_interface: str
    """The lease interface's full name at the same version."""
    auth_interface: Optional[str]
    """The auth interface's full name (signed tokens, new in 0.1.1), or
    ``None`` if the component does not export it."""


def vet(exports: Iterable[str]) -> Vetted:
    """The component whose top-level export names are ``exports``, if this
    package runs it; else raise ``UnsupportedComponent`` saying what was found."""
    ours: list[tuple[str, Optional[str]]] = []
    others: list[str] = []
    for name in exports:
        if name.startswith(WIT_PACKAGE + "/"):
            rest = name[len(WIT_PACKAGE) + 1 :]
            interface, at, version = rest.partition("@")
            ours.append((interface, version if at else None))
        else:
            others.append(name)

    def full(interface: str, version: Optional[str]) -> str:
        return f"{WIT_PACKAGE}/{interface}" + (f"@{version}" if version is not None else "")

    check = [v for i, v in ours if i == "check"]
    if not check:
        listed = sorted([full(i, v) for i, v in ours] + others)
        raise UnsupportedComponent(
            f"no {WIT_PACKAGE}/check interface (its exports: {', '.join(listed) or 'nothing'})", supported()
        )
    version = check[0]
    check_name = full("check", version)
    if version is None:
        raise UnsupportedComponent(f"{check_name} without a version", supported())
    for interface, other in ours:
        if other != version:
            raise UnsupportedComponent(f"{check_name} and {full(interface, other)} (two versions)", supported())
    found, built = _parse(version), _parse(WIT_VERSION)
    if found is None or built is None or not _serves(found, built):
        raise UnsupportedComponent(check_name, supported())
    has_auth = any(interface == "auth" for interface, _ in ours)
    return Vetted(version, check_name, full("lease", version), full("auth", version) if has_auth else None)
