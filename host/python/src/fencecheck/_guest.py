"""The component, loaded by wasmtime-py's component API.

``Runtime`` (one per process) loads the component: deserialized from the
artifacts precompiled for this host when the package carries matching ones
(``_precompiled``), else compiled; ``Instance`` (one per thread) calls it
under a memory limit, and is replaced after a trap, as in the Rust host
(host/runtime/src/runtime.rs).

Fuel, as in the Rust host: the packaged component runs without fuel metering
(each of its calls does work linear in its input, which ``Limits.call_bytes``
bounds: docs/design.md §1, "What bounds a call's time", held by the fuzz
target ``fuel_bound``); a component loaded from a path, or any bytes other
than the packaged ones, is metered (``Limits.fuel_per_check``), since nothing
vouches for its loops. ``Runtime.metered`` says which.

``check`` encodes its pair as a one-item ``check-packed`` batch (``_packed``)
and, when the component has the expected shape, crosses once into the
component's core module through the guest's single-check export (``_core``:
one copy each way, no allocation, no post-return); ``check_batch`` encodes
its pairs the same way and calls ``check-packed`` on that core module,
about 10x faster than the typed ``check-batch``. Otherwise (no core module of
that shape) ``check`` passes its values through ``_abi`` (raw C API values,
about 10x faster than wasmtime-py's generic conversion) to the typed
``check``, and ``check_batch`` takes ``check-packed`` through the component
API. ``check_signed`` (signed tokens, the ``auth`` interface of 0.1.1) takes
the same two ways: a one-item batch with keys and signature on the core
module, else the typed ``auth.check-signed``. Tests compare every way on the
conformance vectors and on random inputs. The exported signatures are compared at
load with the ones these codecs were written for, so a changed contract fails
at load, not at run time. ``_abi`` relies on wasmtime-py's ``_ffi`` module,
hence the exact version pin. The rarer calls (``inspect``, the lease
functions, ``sign``, ``grant_message``) use the generic conversion for
arguments.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from dataclasses import dataclass
from os import PathLike
from typing import Any, Optional, Union

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime import component as wc

from . import _abi, _core, _packed, _precompiled, _wit
from ._types import (
    Acquired,
    Busy,
    ComponentLoadError,
    CorruptState,
    Decision,
    Exhausted,
    FenceError,
    ForeignAuthority,
    GrantKey,
    GrantSignature,
    GuestTrapped,
    InvalidRequest,
    LeaseError,
    Lost,
    NotOwner,
    PackedFormatError,
    Released,
    Renewed,
    Request,
    Restored,
    ScopeMismatch,
    SignError,
    StateInfo,
    Token,
    TooLarge,
    UnsupportedFeature,
    UnsupportedStateVersion,
    WindowEntry,
    _keys,
    _u32,
    _u64,
    _utf8,
)

CHECK_INTERFACE = "fencecheck:fence/check@0.1.1"
LEASE_INTERFACE = "fencecheck:fence/lease@0.1.1"
AUTH_INTERFACE = "fencecheck:fence/auth@0.1.1"
SIGNED_TOKENS_SINCE = "0.1.1"
"""The first component version with the ``auth`` interface (signed tokens)."""

_V = ffi.wasmtime_component_val_t


@dataclass(frozen=True)
class Limits:
    """Bounds on every instance of a ``Runtime`` (defaults as in the Rust host)."""

    fuel_per_check: int = 10_000_000
    """Fuel per check (and per batch item) when the runtime is metered (any
    component but the packaged one: ``Runtime.metered``); stops a runaway
    guest, not a normal one. The packaged component runs without fuel."""
    memory_bytes: int = 64 << 20
    """Largest linear memory an instance may grow to."""
    call_bytes: int = 16 << 20
    """Largest total input (states, scopes, op-ids) of one call; larger calls
    raise ``TooLarge`` before reaching the guest."""
    fuel_per_input_byte: int = 400
    """Fuel per byte of a call that crosses into the core module, on top of
    ``fuel_per_check`` (metered runtimes only): there the guest also
    validates the strings' UTF-8, which the component API does on the host,
    so a long input within the documented cost bound never runs out (the Rust
    host's ``FUEL_BOUND_PER_BYTE``)."""


def _default_component() -> bytes:
    """The packaged component, read beside this module: importing
    ``importlib.resources`` would cost a new process several milliseconds. It
    is used only when the package is not on a file system (a zip)."""
    try:
        with open(os.path.join(_precompiled.PACKAGE_DIR, "fencecheck.wasm"), "rb") as f:
            return f.read()
    except OSError:
        pass  # read below, which reports a missing component
    import importlib.resources

    resource = importlib.resources.files(__package__).joinpath("fencecheck.wasm")
    try:
        return resource.read_bytes()
    except OSError as e:
        raise ComponentLoadError(
            f"the packaged component is missing ({e}); run scripts/build-component "
            "before `pip install ./host/python`, or pass a path to Runtime()"
        ) from None


def _signature(ty: Any) -> str:
    """A type as text, to compare the component's exports with this codec."""
    if isinstance(ty, wc.RecordType):
        return "record{" + ",".join(f"{n}:{_signature(t)}" for n, t in ty.fields) + "}"
    if isinstance(ty, wc.VariantType):
        cases = (n if t is None else f"{n}({_signature(t)})" for n, t in ty.cases)
        return "variant{" + ",".join(cases) + "}"
    if isinstance(ty, wc.EnumType):
        return "enum{" + ",".join(ty.names) + "}"
    if isinstance(ty, wc.OptionType):
        return f"option<{_signature(ty.payload)}>"
    if isinstance(ty, wc.ResultType):
        ok, err = ty.ok, ty.err
        return f"result<{_signature(ok) if ok else '_'},{_signature(err) if err else '_'}>"
    if isinstance(ty, wc.ListType):
        return f"list<{_signature(ty.element)}>"
    return type(ty).__name__.lower()


_TOKEN = "record{authority:u64,epoch:u64,counter:u64}"
_REQUEST = (
    f"record{{scope:string,token:{_TOKEN},policy:enum{{strict,allow-equal}},"
    "op-id:option<string>,expected-version:option<u64>}"
)
_DECISION = (
    f"variant{{applied(record{{version:u64,highest:{_TOKEN},state:list<u8>}}),"
    f"duplicate(u64),stale-fence(record{{presented:{_TOKEN},highest:{_TOKEN}}}),"
    "version-conflict(record{expected:u64,actual:u64})}"
)
_CHECK_ERROR = (
    "variant{invalid-request(enum{missing-token,empty-scope,scope-too-long,empty-op-id,"
    "op-id-too-long,equal-token-unguarded}),"
    "corrupt-state(enum{truncated,length-mismatch,checksum-mismatch,malformed}),"
    "unsupported-state-version(u8),scope-mismatch(string),"
    "foreign-authority(record{stored:u64,presented:u64}),exhausted}"
)
_OUTCOME = f"result<{_DECISION},{_CHECK_ERROR}>"
_KEY = "record{key-id:u32,secret:list<u8>}"
_SIGNATURE = "record{key-id:u32,lease-id:string,tag:list<u8>}"
_KEY_PROBLEM = "enum{no-keys,too-many-keys,short-secret,long-secret,duplicate-key-id}"
_EXPECTED_AUTH = {
    "check-signed": (
        f"state:option<list<u8>>,request:{_REQUEST},signature:option<{_SIGNATURE}>,keys:list<{_KEY}>",
        f"result<{_DECISION},variant{{check({_CHECK_ERROR}),invalid-keys({_KEY_PROBLEM}),"
        "unauthenticated(enum{unsigned,unknown-key,malformed-signature,bad-signature})}>",
    ),
    "sign": (
        f"scope:string,token:{_TOKEN},lease-id:string,key:{_KEY}",
        f"result<{_SIGNATURE},variant{{empty-scope,scope-too-long,missing-token,empty-lease-id,"
        f"lease-id-too-long,invalid-key({_KEY_PROBLEM})}}>",
    ),
    "grant-message": (f"scope:string,token:{_TOKEN},key-id:u32,lease-id:string", "list<u8>"),
}
_EXPECTED = {
    "check": (f"state:option<list<u8>>,request:{_REQUEST}", _OUTCOME),
    "check-batch": (f"items:list<record{{state:option<list<u8>>,request:{_REQUEST}}}>", f"list<{_OUTCOME}>"),
    "check-packed": ("batch:list<u8>", "result<list<u8>,enum{malformed}>"),
}


class Runtime:
    """The compiled component: one per process.

    ``Runtime()`` loads the component packaged with this module; pass a path
    (or ``component=bytes``) to load another build.

    Fuel: the packaged component (``Runtime()``, or ``component=`` bytes
    equal to it) runs without fuel metering; a component read from a path is
    always metered, even when its bytes are the packaged ones (a file is not
    what this package was built and tested with), and so are any other bytes.
    ``metered=True`` meters the packaged component too (to measure its cost,
    or to test the metered path); ``metered=False`` is refused for anything
    but the packaged component. Unmetered and metered runtimes compile
    different machine code, so each uses only artifacts made for it.

    ``precompiled``: where to look for machine code made for this host by
    ``python -m fencecheck precompile`` (``scripts/build-component`` puts it
    in the package): ``True``, the package directory (unless the environment
    has ``FENCECHECK_PRECOMPILED=0``); a directory; or ``False``, always
    compile. It is used only for the very component being loaded (SHA-256),
    the running wasmtime-py and engine settings, and only if its bytes match
    their recorded SHA-256 (``_precompiled``); otherwise the component is
    compiled, as without it, with a ``RuntimeWarning`` if artifacts for this
    component were there but refused.
    """

    component_version: str
    """The loaded component's WIT package version (``"0.1.1"``), from its
    export names; a component whose version this package does not run is
    refused at load with ``UnsupportedComponent``."""
    supports_signing: bool
    """Whether the component has signed tokens (the ``auth`` interface, 0.1.1
    or later); without it ``check_signed`` and ``sign`` raise
    ``UnsupportedFeature``."""
    loaded_from: str
    """``"precompiled"`` (deserialized artifacts) or ``"compiled"`` (Cranelift,
    in this process)."""
    metered: bool
    """Whether calls run under fuel metering: ``False`` only for the packaged
    component (see above)."""
    why_compiled: Optional[str]
    """Why the artifacts were not used (``None`` when they were)."""

    def __init__(
        self,
        path: Union[str, PathLike[str], None] = None,
        *,
        component: Optional[bytes] = None,
        limits: Limits = Limits(),
        precompiled: Union[bool, str, PathLike[str]] = True,
        metered: Optional[bool] = None,
    ) -> None:
        if not _abi.LAYOUT_OK:
            raise ComponentLoadError("wasmtime-py's C structs are not laid out as fencecheck._abi expects")
        if metered not in (None, True, False):
            raise TypeError("metered must be None, True or False")
        if path is not None:
            packaged = False  # a file is metered whatever its bytes
            if component is None:
                try:
                    with open(path, "rb") as f:
                        component = f.read()
                except OSError as e:
                    raise ComponentLoadError(f"reading the component at {path}: {e}") from None
        elif component is None:
            component = _default_component()
            packaged = True
        else:
            packaged = _is_packaged(component)
        if metered is False and not packaged:
            raise ValueError("only the packaged component runs without fuel (metered=False)")
        self.metered = metered is True or not packaged
        self.limits = limits
        try:
            self._engine = wasmtime.Engine(_precompiled.engine_config(metered=self.metered))
        except wasmtime.WasmtimeError as e:
            raise ComponentLoadError(f"loading the fencecheck component: {e}") from None
        loaded = _precompiled.load(self._engine, component, precompiled, metered=self.metered)
        if isinstance(loaded, _precompiled.Loaded):
            self.loaded_from, self.why_compiled = "precompiled", None
            self._component = loaded.component
            # check-packed's fast transport (see _core); None: the component API only.
            self._core: Optional[wasmtime.Module] = loaded.core
        else:
            self.loaded_from, self.why_compiled = "compiled", loaded
            try:
                self._component = wc.Component(self._engine, component)
            except wasmtime.WasmtimeError as e:
                raise ComponentLoadError(f"loading the fencecheck component: {e}") from None
            self._core = _core.core_module(self._engine, component)
        # Refuse a component with another contract before anything is
        # instantiated, whichever way its machine code came.
        try:
            exports = self._component.type.exports(self._engine)
        except wasmtime.WasmtimeError as e:
            raise ComponentLoadError(f"reading the component's exports: {e}") from None
        vetted = _wit.vet(exports.keys())
        self.component_version = vetted.version
        self.supports_signing = vetted.auth_interface is not None
        self._interfaces = (vetted.check_interface, vetted.lease_interface, vetted.auth_interface)
        if self._core is not None:  # its exports must be named after the vetted version
            self._core = _core.checked(self._core, vetted.check_interface)
        # The single-check exports (guest/src/one.rs), if the core module has them.
        self._one = self._core is not None and _core.has_one(self._core)
        # The component imports nothing: an empty linker refuses any import.
        self._linker = wc.Linker(self._engine)

    def instance(self) -> "Instance":
        """A fresh instance, for one thread at a time."""
        return Instance(self)


def _is_packaged(component: bytes) -> bool:
    """Whether ``component`` is byte for byte the packaged component (as the
    Rust host's ``Runtime::from_bytes`` compares with the embedded one)."""
    try:
        return bytes(component) == _default_component()
    except ComponentLoadError:
        return False


_DEFAULT: Optional[Runtime] = None


def component_version() -> str:
    """The WIT package version of the component this package runs by default
    (the packaged one), e.g. ``"0.1.1"``: read from the loaded component's
    export names. Loads it once per process (``Runtime()``); raises
    ``ComponentLoadError`` (``UnsupportedComponent``) as that would.
    ``Runtime.component_version`` gives the same for any other component."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Runtime()
    return _DEFAULT.component_version


class Instance:
    """One instance of the component. Not thread-safe: one per thread.

    Every call is bounded by memory and by its input (``Limits.call_bytes``);
    a metered runtime also bounds it by fuel. If the guest traps, the call
    raises ``GuestTrapped``, nothing was decided, and the instance is replaced.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._instantiate()

    def _instantiate(self) -> None:
        rt = self._runtime
        self._store = wasmtime.Store(rt._engine)
        self._store.set_limits(memory_size=rt.limits.memory_bytes)
        try:
            self._inst = rt._linker.instantiate(self._store, rt._component)
            funcs = self._lookup(rt._interfaces[0], ("check", "check-batch", "check-packed", "inspect"))
        except wasmtime.WasmtimeError as e:
            raise ComponentLoadError(f"instantiating the fencecheck component: {e}") from None
        _verify(self._store, funcs, _EXPECTED)
        self._funcs = funcs
        self._lease_funcs: Optional[dict[str, Any]] = None  # looked up on first use
        self._auth_funcs: Optional[dict[str, Any]] = None  # looked up (and verified) on first use
        self._packed: Optional[_core.Packed] = None  # instantiated on first use

    # -- the three exports -------------------------------------------------

    def check(self, state: Optional[bytes], request: Request) -> Decision:
        """Decide one request against a scope's stored state (``None``: the
        scope never accepted a token). Returns the decision; raises a
        ``FenceError`` when the check cannot decide, ``HostError`` when the
        component cannot run.

        Crosses once, through the core module's single-check export, when
        the runtime has one (else check-packed on the core module, else the
        typed ``check``: ``_check_typed``); all decide the same."""
        if self._runtime._core is None:
            return self._check_typed(state, request)
        batch, _, size = _packed.encode([(state, request)])
        self._bound("check", size)
        outcome = self._check_one("check", batch, signed=False)
        if isinstance(outcome, FenceError):
            raise outcome
        return outcome

    def _check_one(self, call: str, batch: bytes, *, signed: bool, single: bool = True) -> Union[Decision, FenceError]:
        """A one-item batch through the core module: its outcome (a
        ``FenceError`` returned, not raised). ``single=False`` sends it
        through check-packed even when the single-check export is there
        (tests compare the two)."""
        out = self._check_packed(batch, 1, single=single, call=call)
        if isinstance(out, str):
            raise PackedFormatError("input", f"batch-error `{out}` for a {call}, {len(batch)} bytes")
        try:
            [outcome] = _packed.decode(out, 1, signed=signed)
        except PackedFormatError:
            self._instantiate()  # a guest that wrote garbage is not trusted again
            raise
        return outcome

    def _check_typed(self, state: Optional[bytes], request: Request) -> Decision:
        """``check`` through the typed ``check`` export (wasmtime's component
        API, values lowered by ``_abi``): always this way when the runtime
        has no core module; tests and benchmarks compare it with the core
        module's single-check export."""
        keep, args, size = _abi.lower_check(state, request)
        self._bound("check", size)
        outcome = self._call("check", self._funcs["check"], 1, args, 2, _abi.lift_check)
        del keep  # the argument memory was borrowed by the call
        if isinstance(outcome, FenceError):
            raise outcome
        return outcome

    def check_signed(self, state: Optional[bytes], request: Request, keys: Iterable[GrantKey]) -> Decision:
        """Decide one request on a scope that requires signed tokens:
        ``request.signature`` is verified against ``keys`` (the keys the
        resource trusts for this scope) before the state is read, then the
        rules of ``check`` apply. Raises ``Unauthenticated`` (``unsigned``,
        ``unknown-key``, ``malformed-signature``, ``bad-signature``),
        ``InvalidKeys`` (the key set is unusable) or any other ``FenceError``
        of ``check``; ``UnsupportedFeature`` if the loaded component predates
        signed tokens (nothing is sent); ``HostError`` if it cannot run.

        Crosses as a one-item batch with keys and signature (flags 4 and 5)
        on the core module when the runtime has one (the single-check export,
        as ``check``), else through the typed ``auth.check-signed``."""
        return self._check_signed(state, request, keys)

    def _check_signed(
        self, state: Optional[bytes], request: Request, keys: Iterable[GrantKey], *, single: bool = True
    ) -> Decision:
        """``check_signed``; ``single=False`` crosses through check-packed
        even when the single-check export is there (tests compare them)."""
        self._require_auth()
        keys = _keys(keys)
        if self._runtime._core is None:
            return self._check_signed_typed(state, request, keys)
        batch, _, size = _packed.encode([(state, request)], keys)
        self._bound("check-signed", size)
        outcome = self._check_one("check-signed", batch, signed=True, single=single)
        if isinstance(outcome, FenceError):
            raise outcome
        return outcome

    def _check_signed_typed(self, state: Optional[bytes], request: Request, keys: Iterable[GrantKey]) -> Decision:
        """``check_signed`` through the typed ``auth.check-signed`` (the
        component API): state and request lowered raw (``_abi``), signature
        and keys by wasmtime-py's generic conversion. Always this way when
        the runtime has no core module; tests compare the two."""
        self._require_auth()
        keys = _keys(keys)
        keep, raw, size = _abi.lower_check(state, request)
        sig = request.signature
        size += sum(len(k.secret) + 5 for k in keys) + (len(sig.lease_id.encode()) + len(sig.tag) if sig else 0)
        self._bound("check-signed", size)
        func, types = self._auth()["check-signed"]
        args = (_V * 4)()
        ctypes.memmove(args, raw, 2 * _abi.VAL)  # state and request: borrowed from `keep`
        signature = None if sig is None else _wit_record(key_id=sig.key_id, lease_id=sig.lease_id, tag=sig.tag)
        converted = 0
        try:
            for i, value in ((2, signature), (3, [_key_rec(k) for k in keys])):
                types[i].convert_to_c(self._store, value, ctypes.pointer(args[i]))
                converted += 1
            outcome = self._call("check-signed", func, 1, args, 4, _abi.lift_signed)
        finally:
            for i in range(converted):
                ffi.wasmtime_component_val_delete(ctypes.byref(args[2 + i]))
        del keep
        if isinstance(outcome, FenceError):
            raise outcome
        return outcome

    def sign(self, scope: str, token: Token, lease_id: str, key: GrantKey) -> GrantSignature:
        """Sign the grant of ``token`` to ``lease_id`` for ``scope`` (the
        lock's name: a signed token is valid only on the scope named like its
        lock) with ``key``: what a lease authority attaches to the token it
        hands out. Raises ``SignError`` (``empty-scope``, ``scope-too-long``,
        ``missing-token``, ``empty-lease-id``, ``lease-id-too-long``,
        ``invalid-key`` with the key problem), ``UnsupportedFeature`` if the
        component predates signed tokens."""
        self._require_auth()
        if not isinstance(key, GrantKey):
            raise TypeError("key must be a fencecheck.GrantKey")
        values = (_utf8("scope", scope), _token_rec(token), _utf8("lease_id", lease_id), _key_rec(key))
        size = len(scope.encode()) + len(lease_id.encode()) + len(key.secret)
        tag, p = self._generic("sign", self._auth()["sign"][0], values, size)
        if tag == "ok" and isinstance(p, dict) and set(p) == {"key-id", "lease-id", "tag"}:
            return GrantSignature(p["key-id"], p["lease-id"], bytes(p["tag"]))
        if tag == "err" and isinstance(p, tuple) and p[0] in _SIGN_ERRORS:
            raise SignError(p[0], p[1])
        self._instantiate()  # a guest that answered off its contract is not trusted again
        raise GuestTrapped("sign", f"unknown sign result {tag!r} {p!r}")

    def grant_message(self, scope: str, token: Token, key_id: int, lease_id: str) -> bytes:
        """The bytes a signature's tag is the HMAC-SHA256 of (little-endian:
        ``"fencecheck-grant-v1\\0" | scope-len u32 | scope | authority u64 |
        epoch u64 | counter u64 | key-id u32 | lease-len u32 | lease-id``),
        for signers and tools outside the component. ``UnsupportedFeature``
        if the component predates signed tokens."""
        self._require_auth()
        values = (_utf8("scope", scope), _token_rec(token), _u32("key_id", key_id), _utf8("lease_id", lease_id))
        message = self._generic(
            "grant-message", self._auth()["grant-message"][0], values, len(scope.encode()) + len(lease_id.encode())
        )
        if not isinstance(message, bytes):
            self._instantiate()
            raise GuestTrapped("grant-message", f"not a list<u8>: {message!r}")
        return message

    def _require_auth(self) -> None:
        rt = self._runtime
        if not rt.supports_signing:
            raise UnsupportedFeature("signed tokens", rt.component_version, SIGNED_TOKENS_SINCE)

    def _auth(self) -> dict[str, tuple[Any, list[Any]]]:
        """The auth exports (function, parameter types), looked up and their
        signatures verified on first use."""
        if self._auth_funcs is None:
            interface = self._runtime._interfaces[2]
            assert interface is not None  # _require_auth ran first
            try:
                funcs = self._lookup(interface, tuple(_EXPECTED_AUTH))
            except wasmtime.WasmtimeError as e:
                raise ComponentLoadError(f"binding {interface}: {e}") from None
            _verify(self._store, funcs, _EXPECTED_AUTH)
            self._auth_funcs = {
                name: (f, [t for _, t in f.type(self._store).params]) for name, f in funcs.items()
            }
        return self._auth_funcs

    def check_batch(
        self, items: Iterable[tuple[Optional[bytes], Request]]
    ) -> list[Union[Decision, FenceError]]:
        """Decide independent ``(state, request)`` pairs in one call.

        Results are in input order; each is what ``check`` would return, except
        that a ``FenceError`` is returned in its place rather than raised, so one
        bad item does not hide the others' decisions.

        The pairs cross as one byte list each way (``check-packed``). If either
        side of that encoding is malformed (a bug, not an outcome), this raises
        ``PackedFormatError`` and returns no decision at all."""
        batch, n, size = _packed.encode(items)
        self._bound("check-packed", size)
        out = self._check_packed(batch, n)
        if isinstance(out, str):  # batch-error: the guest could not read our encoding
            raise PackedFormatError("input", f"batch-error `{out}` for {n} items, {len(batch)} bytes")
        try:
            return _packed.decode(out, n)
        except PackedFormatError:
            self._instantiate()  # a guest that wrote garbage is not trusted again
            raise

    def _check_packed(
        self,
        batch: bytes,
        items: int,
        *,
        component_api: bool = False,
        single: bool = False,
        call: str = "check-packed",
    ) -> Union[bytes, str]:
        """Call ``check-packed`` with raw bytes (fuel for ``items`` checks):
        the output bytes, or the ``batch-error`` case name. Through the core
        module when the runtime has one (``_core``), else, or with
        ``component_api=True``, through wasmtime's component API.
        ``single``: a one-item batch, sent through the single-check export
        when the core module has it (the same bytes come back). ``call``:
        the name a ``GuestTrapped`` carries."""
        rt = self._runtime
        core = rt._core
        if core is None or component_api:
            keep, args = _abi.lower_bytes(batch)
            out = self._call(call, self._funcs["check-packed"], max(items, 1), args, 1, _abi.lift_packed)
            del keep  # the argument memory was borrowed by the call
            return out
        if rt.metered:  # as the Rust host's core transport: per check, and per byte of the batch
            limits = rt.limits
            self._store.set_fuel(limits.fuel_per_check * max(items, 1) + limits.fuel_per_input_byte * len(batch))
        try:
            packed = self._packed
            if packed is None:
                packed = self._packed = _core.Packed(self._store, core, rt._interfaces[0], one=rt._one)
            return packed.call_one(batch) if single else packed.call(batch)
        except PackedFormatError:
            self._instantiate()
            raise
        except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
            self._instantiate()
            raise GuestTrapped(call, str(e)) from None

    def _check_batch_typed(
        self, items: Iterable[tuple[Optional[bytes], Request]]
    ) -> list[Union[Decision, FenceError]]:
        """``check_batch`` through the typed ``check-batch`` export (one C-API
        value per field): the previous path, kept for tests and benchmarks."""
        items = list(items)
        keep, args, size = _abi.lower_batch(items)
        self._bound("check-batch", size)
        n = len(items)
        results = self._call(
            "check-batch", self._funcs["check-batch"], max(n, 1), args, 1, lambda v: _abi.lift_batch(v, n)
        )
        del keep
        return results

    def inspect(self, state: bytes) -> StateInfo:
        """Decode a stored state (rare: uses wasmtime-py's generic conversion)."""
        self._bound("inspect", len(state))
        func = self._funcs["inspect"]
        if self._runtime.metered:
            self._store.set_fuel(self._runtime.limits.fuel_per_check)
        try:
            result = func(self._store, bytes(state))
            func.post_return(self._store)
        except wasmtime.WasmtimeError as e:
            self._instantiate()
            raise GuestTrapped("inspect", str(e)) from None
        # wasmtime-py returns the ok record, or the error variant (tagged
        # `err` when the two cases are not distinguishable by Python type).
        if not isinstance(result, wc.Record):
            try:
                error = _error_from_generic(result.payload if result.tag == "err" else result)
            except GuestTrapped:
                self._instantiate()  # a guest that answered off its contract is not trusted again
                raise
            raise error
        i = result
        return StateInfo(
            format_version=i.__dict__["format-version"],
            scope=i.scope,
            authority=i.authority,
            highest=Token(i.highest.authority, i.highest.epoch, i.highest.counter),
            version=i.version,
            window=tuple(WindowEntry(e.__dict__["op-id"], e.version) for e in i.window),
        )

    # -- the lease authority (rare calls: wasmtime-py's generic conversion) --

    def acquire(
        self,
        state: Optional[bytes],
        lock: str,
        lease_id: str,
        now: int,
        ttl: int,
        *,
        authority: int = 0,
        epoch_floor: int = 0,
    ) -> Union[Acquired, Busy]:
        """Grant ``lock`` to ``lease_id`` at coordinator time ``now`` (ms) for
        ``ttl`` ms, or report who holds it. Raises ``LeaseError``."""
        request = _wit_record(
            lock=lock, lease_id=lease_id, authority=_u64("authority", authority),
            epoch_floor=_u64("epoch_floor", epoch_floor), now=_u64("now", now), ttl=_u64("ttl", ttl),
        )
        case, p = self._lease("acquire", state, request)
        if case == "acquired":
            return Acquired(_token_of(p["token"]), p["expires-at"], p["state"])
        return Busy(p["holder"], p["expires-at"])

    def renew(self, state: Optional[bytes], lease_id: str, token: Token, now: int, ttl: int) -> Union[Renewed, Lost]:
        """Extend the exact current lease (``now < expires_at``), else ``Lost``."""
        request = _wit_record(lease_id=lease_id, token=_token_rec(token), now=_u64("now", now), ttl=_u64("ttl", ttl))
        case, p = self._lease("renew", state, request)
        return Renewed(p["expires-at"], p["state"]) if case == "renewed" else Lost()

    def release(self, state: Optional[bytes], lease_id: str, token: Token) -> Union[Released, NotOwner]:
        """Release the exact current lease, else ``NotOwner`` (nothing changes)."""
        case, p = self._lease("release", state, _wit_record(lease_id=lease_id, token=_token_rec(token)))
        return Released(p) if case == "released" else NotOwner()

    def restore(self, state: Optional[bytes]) -> Restored:
        """Start the next epoch, so new grants compare above every older token."""
        p = self._lease("restore", state)
        return Restored(p["epoch"], p["state"])

    def _lease(self, name: str, state: Optional[bytes], *args: Any) -> Any:
        """Call a lease export: arguments through wasmtime-py's generic
        conversion, the result read raw (the generic one is ambiguous here)."""
        if self._lease_funcs is None:
            self._lease_funcs = self._lookup(self._runtime._interfaces[1], ("acquire", "renew", "release", "restore"))
        if state is not None:
            state = bytes(state)
        strings = sum(len(v) for a in args for v in vars(a).values() if isinstance(v, str))
        tag, payload = self._generic(name, self._lease_funcs[name], (state, *args), len(state or b"") + strings)
        try:
            return _lease_result(name, tag, payload)
        except GuestTrapped:
            self._instantiate()  # a guest that answered off its contract is not trusted again
            raise

    def _generic(self, name: str, func: Any, values: tuple[Any, ...], size: int) -> Any:
        """Call ``func`` with ``values`` converted by wasmtime-py's generic
        conversion (bounded by ``size`` input bytes); its result read raw
        (``_lift_raw``)."""
        self._bound(name, size)
        params = (_V * len(values))()
        done = 0
        try:
            for (_, ty), value in zip(func.type(self._store).params, values):
                ty.convert_to_c(self._store, value, ctypes.pointer(params[done]))
                done += 1
            return self._call(name, func, 1, params, done, _lift_raw)
        finally:
            for i in range(done):
                ffi.wasmtime_component_val_delete(ctypes.byref(params[i]))

    def _lookup(self, interface: str, names: tuple[str, ...]) -> dict[str, Any]:
        store, inst = self._store, self._inst
        iface = inst.get_export_index(store, interface)
        if iface is None:
            raise ComponentLoadError(f"the component does not export {interface}")
        funcs = {}
        for name in names:
            index = inst.get_export_index(store, name, iface)
            func = inst.get_func(store, index) if index is not None else None
            if func is None:
                raise ComponentLoadError(f"{interface} does not export `{name}`")
            funcs[name] = func
        return funcs

    # -- plumbing ----------------------------------------------------------

    def _bound(self, call: str, size: int) -> None:
        limit = self._runtime.limits.call_bytes
        if size > limit:
            raise TooLarge(call, size, limit)

    def _call(self, call: str, func: Any, checks: int, args: Any, nargs: int, lift: Any) -> Any:
        """Call an export with a fresh fuel budget; lift and free its result.
        On a trap, replace the instance (its memory may be inconsistent)."""
        store = self._store
        if self._runtime.metered:
            store.set_fuel(self._runtime.limits.fuel_per_check * checks)
        result = _V()
        error = ffi.wasmtime_component_func_call(
            ctypes.byref(func._func), store._context(), args, nargs, ctypes.byref(result), 1
        )
        if error:
            message = str(wasmtime.WasmtimeError._from_ptr(error))
            self._instantiate()
            raise GuestTrapped(call, message)
        try:
            return lift(result)
        except ValueError as e:  # a result this codec cannot read: a guest bug
            self._instantiate()  # not trusted again (the old store stays alive for the cleanup below)
            raise GuestTrapped(call, str(e)) from None
        finally:
            ffi.wasmtime_component_val_delete(ctypes.byref(result))
            error = ffi.wasmtime_component_func_post_return(ctypes.byref(func._func), store._context())
            if error:
                message = str(wasmtime.WasmtimeError._from_ptr(error))
                self._instantiate()
                raise GuestTrapped(call, message)


def _verify(store: wasmtime.Store, funcs: dict[str, Any], expected: dict[str, tuple[str, str]]) -> None:
    for name, (params, result) in expected.items():
        ty = funcs[name].type(store)
        got = (",".join(f"{n}:{_signature(t)}" for n, t in ty.params), _signature(ty.result))
        if got != (params, result):
            raise ComponentLoadError(
                f"`{name}` has signature {got}, not the one this package was written for"
            )


def _wit_record(**fields: Any) -> wc.Record:
    """A WIT record for the generic API (snake_case names become kebab-case)."""
    r = wc.Record()
    for key, value in fields.items():
        if isinstance(value, str):
            _utf8(key, value)
        setattr(r, key.replace("_", "-"), value)
    return r


def _token_rec(t: Token) -> wc.Record:
    if not isinstance(t, Token):
        raise TypeError("token must be a Token")
    return _wit_record(authority=t.authority, epoch=t.epoch, counter=t.counter)


def _key_rec(k: GrantKey) -> wc.Record:
    return _wit_record(key_id=k.key_id, secret=k.secret)


def _token_of(r: dict[str, int]) -> Token:
    return Token(r["authority"], r["epoch"], r["counter"])


def _name_of(vec: Any) -> bytes:
    return ctypes.string_at(vec.data, vec.size)


def _lift_raw(v: Any) -> Any:
    """Any value, untyped: records as dicts, variants and results as
    ``(case, payload)``, enums as names, ``list<u8>`` as bytes."""
    k = v.kind
    if k == _abi.U8:
        return v.of.u8
    if k == _abi.U32:
        return v.of.u32
    if k == _abi.U64:
        return v.of.u64
    if k == _abi.STRING:
        return _name_of(v.of.string).decode()
    if k == _abi.ENUM:
        return _name_of(v.of.enumeration).decode()
    if k == _abi.OPTION:
        return _lift_raw(v.of.option.contents) if v.of.option else None
    if k == _abi.RESULT:
        r = v.of.result
        return ("ok" if r.is_ok else "err", _lift_raw(r.val.contents) if r.val else None)
    if k == _abi.VARIANT:
        var = v.of.variant
        return (_name_of(var.discriminant).decode(), _lift_raw(var.val.contents) if var.val else None)
    if k == _abi.RECORD:
        rec = v.of.record
        return {_name_of(rec.data[i].name).decode(): _lift_raw(rec.data[i].val) for i in range(rec.size)}
    if k == _abi.LIST:
        lst = v.of.list
        items = [lst.data[i] for i in range(lst.size)]
        if all(i.kind == _abi.U8 for i in items):
            return bytes(i.of.u8 for i in items)
        return [_lift_raw(i) for i in items]
    raise ValueError(f"unexpected value kind {k}")


# The cases of each lease export's ok variant (None: a record), and of
# lease-error. Anything else is off the contract: never mapped to an outcome.
_LEASE_OUTCOMES: dict[str, Optional[tuple[str, ...]]] = {
    "acquire": ("acquired", "busy"),
    "renew": ("renewed", "lost"),
    "release": ("released", "not-owner"),
    "restore": None,
}
_SIGN_ERRORS = ("empty-scope", "scope-too-long", "missing-token", "empty-lease-id", "lease-id-too-long", "invalid-key")
_LEASE_ERRORS = (
    "invalid-request", "corrupt-state", "unsupported-state-version", "lock-mismatch", "foreign-authority", "exhausted",
)


def _lease_result(name: str, tag: str, payload: Any) -> Any:
    """A lease export's raw result (``_lift_raw``): the ok payload, else raise
    its ``LeaseError``. A case outside the contract raises ``GuestTrapped``."""
    if tag == "ok":
        cases = _LEASE_OUTCOMES[name]
        if cases is None:
            known = isinstance(payload, dict)
        else:
            known = isinstance(payload, tuple) and payload[0] in cases
        if known:
            return payload
        raise GuestTrapped(name, f"unknown {name} outcome {payload!r}")
    if tag != "err" or not isinstance(payload, tuple) or payload[0] not in _LEASE_ERRORS:
        raise GuestTrapped(name, f"unknown lease-error case {payload!r}")
    case, detail = payload
    if case in ("invalid-request", "corrupt-state"):
        raise LeaseError(case, detail)
    if case == "foreign-authority":
        raise LeaseError(case, None, f"stored {detail['stored']}, presented {detail['presented']}")
    raise LeaseError(case, None, "" if detail is None else repr(detail))


def _error_from_generic(v: Any) -> FenceError:
    """A check-error from wasmtime-py's generic conversion (used by inspect).
    A case outside the contract raises ``GuestTrapped``: never a refusal."""
    tag, p = v.tag, v.payload
    if tag == "invalid-request":
        return InvalidRequest(p)
    if tag == "corrupt-state":
        return CorruptState(p)
    if tag == "unsupported-state-version":
        return UnsupportedStateVersion(p)
    if tag == "scope-mismatch":
        return ScopeMismatch(p)
    if tag == "foreign-authority":
        return ForeignAuthority(p.stored, p.presented)
    if tag == "exhausted":
        return Exhausted()
    raise GuestTrapped("inspect", f"unknown check-error case {tag!r}")
