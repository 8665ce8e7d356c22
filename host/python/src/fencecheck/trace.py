"""The agreement trace (tests/agreement/README.md): run a sequence of checks
and damage over numbered state slots and print one canonical line per step.
Every runtime prints the same bytes for the same sequence, or they disagree."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional, TextIO

from ._guest import Instance
from ._types import (
    Applied,
    CorruptState,
    Duplicate,
    FenceError,
    ForeignAuthority,
    InvalidRequest,
    Request,
    ScopeMismatch,
    StaleFence,
    Token,
    UnsupportedStateVersion,
    VersionConflict,
)
from .vectors import Outcome, VectorFormatError, _no_duplicate_keys, _obj, damage, parse_request, u64


def _request(check: object) -> Request:
    """A trace's check: a trace has no signed scopes, so ``keys`` (which
    ``check`` would silently drop) is refused; a ``signature`` is ignored by
    ``check``, as on any scope that is not opted in."""
    if isinstance(check, dict) and "keys" in check:
        raise VectorFormatError("a trace check has no `keys` (signed scopes are not traced)")
    return parse_request(check)


def _tok(t: Token) -> str:
    return f"[{t.authority},{t.epoch},{t.counter}]"


def _hex(state: Optional[bytes]) -> str:
    return "null" if state is None else f'"{state.hex()}"'


def line(o: Outcome) -> str:
    """The canonical fields of one outcome (without line number and state)."""
    if isinstance(o, Applied):
        return f'"outcome":"applied","version":{o.version},"highest":{_tok(o.highest)}'
    if isinstance(o, Duplicate):
        return f'"outcome":"duplicate","version":{o.version}'
    if isinstance(o, StaleFence):
        return f'"outcome":"stale-fence","presented":{_tok(o.presented)},"highest":{_tok(o.highest)}'
    if isinstance(o, VersionConflict):
        return f'"outcome":"version-conflict","expected":{o.expected},"actual":{o.actual}'
    head = f'"outcome":"error","error":"{o.name}"'
    if isinstance(o, (InvalidRequest, CorruptState)):
        return f'{head},"reason":"{o.reason}"'
    if isinstance(o, UnsupportedStateVersion):
        return f'{head},"format":{o.format_version}'
    if isinstance(o, ScopeMismatch):
        return f'{head},"scope":"{o.stored_scope.encode().hex()}"'
    if isinstance(o, ForeignAuthority):
        return f'{head},"stored":{o.stored},"presented":{o.presented}'
    return head


def run(lines: Any, guest: Instance, out: TextIO, *, typed_batches: bool = False) -> None:
    """Run a sequence (an iterable of text lines); raises VectorFormatError on
    a malformed line and HostError when the guest cannot run. Batch lines go
    through ``check_batch`` (check-packed), or with ``typed_batches`` through
    the typed check-batch export."""
    slots: dict[int, bytes] = {}
    check_batch = guest._check_batch_typed if typed_batches else guest.check_batch
    for n, text in enumerate(lines, start=1):
        try:
            step = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as e:
            raise VectorFormatError(f"line {n}: {e}") from None
        if isinstance(step, dict) and "batch" in step:
            _obj(step, {"batch"}, f"line {n}")
            if not isinstance(step["batch"], list):
                raise VectorFormatError(f"line {n}: batch must be a list")
            items = [_obj(i, {"slot", "check"}, f"line {n} item") for i in step["batch"]]
            keys = [u64(i.get("slot"), "slot") for i in items]
            if len(set(keys)) != len(keys):
                raise VectorFormatError(f"line {n}: a batch's slots must be distinct")
            requests = [_request(i.get("check")) for i in items]
            outcomes = check_batch([(slots.get(k), r) for k, r in zip(keys, requests)])
            for i, (k, o) in enumerate(zip(keys, outcomes)):
                if isinstance(o, Applied):
                    slots[k] = o.state
                out.write(f'{{"line":{n},"item":{i},{line(o)},"state":{_hex(slots.get(k))}}}\n')
            continue
        step = _obj(step, {"slot", "check", "damage", "bit", "len", "hex"}, f"line {n}")
        k = u64(step.get("slot"), "slot")
        if step.get("damage") is not None and step.get("check") is None:
            after = damage(slots.get(k), step)
            if after is None:
                slots.pop(k, None)
            else:
                slots[k] = after
            out.write(f'{{"line":{n},"damage":"{step["damage"]}","state":{_hex(after)}}}\n')
            continue
        if step.get("check") is None or any(key in step for key in ("damage", "bit", "len", "hex")):
            raise VectorFormatError(f"line {n}: needs exactly one of `check`, `damage`, `batch`")
        try:
            o: Outcome = guest.check(slots.get(k), _request(step["check"]))
        except FenceError as e:
            o = e
        if isinstance(o, Applied):
            slots[k] = o.state
        out.write(f'{{"line":{n},{line(o)},"state":{_hex(slots.get(k))}}}\n')


def main(path: str, guest: Instance, *, typed_batches: bool = False) -> int:
    """``python -m fencecheck trace FILE``: exit 0, or 1 with a message."""
    try:
        with open(path, encoding="utf-8") as f:
            run(f, guest, sys.stdout, typed_batches=typed_batches)
    except (OSError, UnicodeDecodeError, VectorFormatError) as e:
        print(f"fencecheck trace: {path}: {e}", file=sys.stderr)
        return 1
    return 0
