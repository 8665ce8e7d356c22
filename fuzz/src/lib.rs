//! Shared pieces of the fuzz targets (`fuzz_targets/`): the input format
//! they read, the three runtimes they compare, and oracles written here from
//! the documented formats (`guest/src/state.rs`, `guest/src/lease.rs`,
//! `wit/fence.wit`) rather than from the guest's code.
//!
//! # Input format
//!
//! The targets read their input with [`Src`], a cursor of little-endian
//! fields that reads zeros past the end, instead of `arbitrary`: the layout
//! is fixed and documented, so `fuzz/seeds.py` can write the conformance
//! vectors (`tests/vectors`) as seed inputs byte for byte, and every input,
//! however short, means something.
//!
//! - A string is `u16 length | bytes`, read lossily as UTF-8 (invalid bytes
//!   become U+FFFD: requests carry `String`s).
//! - A request ([`read_request`]) is `flags u8 | authority u64 | epoch u64 |
//!   counter u64 | scope string` then `op-id string` if flag 2 and `expected
//!   version u64` if flag 4; flag 1 is allow-equal.
//! - A damage step ([`Damage`]) is `kind u8` and its argument.
//!
//! # Runtimes
//!
//! [`Runtimes::all`] runs one call on the native reference, the wasm
//! component over the core transport and over the component API, asserts
//! that no wasm call fails (trap, fuel, protocol) and that all three answer
//! the same, and returns the answer. A failed assertion is a panic: that is
//! how libFuzzer records a finding.
#![allow(clippy::panic)]

use std::fmt::Debug;

use fencecheck::{
    AuthFailure, Checker, Decision, Error, GrantKey, GrantSignature, Instance, KeyProblem,
    LeaseInfo, Native, Policy, Request, Runtime, SignedCheckError, StateInfo, Token,
};

/// Reads the input: little-endian integers, length-prefixed strings; zeros
/// (and empty strings) past the end.
#[derive(Debug)]
pub struct Src<'a>(pub &'a [u8]);

impl<'a> Src<'a> {
    /// Nothing left to read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The next `n` bytes, or as many as are left.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }

    /// A u16 (missing bytes are 0).
    pub fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let got = self.bytes(2);
        b[..got.len()].copy_from_slice(got);
        u16::from_le_bytes(b)
    }

    /// A u32 (missing bytes are 0).
    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let got = self.bytes(4);
        b[..got.len()].copy_from_slice(got);
        u32::from_le_bytes(b)
    }

    /// A u64 (missing bytes are 0).
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let got = self.bytes(8);
        b[..got.len()].copy_from_slice(got);
        u64::from_le_bytes(b)
    }

    /// `u16 length | bytes`.
    pub fn blob(&mut self) -> &'a [u8] {
        let len = usize::from(self.u16());
        self.bytes(len)
    }

    /// A blob as a string (lossy UTF-8).
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.blob()).into_owned()
    }
}

/// A fence-check request from the input (module docs).
pub fn read_request(src: &mut Src<'_>) -> Request {
    let flags = src.u8();
    let token = Token::new(src.u64(), src.u64(), src.u64());
    let policy = if flags & 1 != 0 {
        Policy::AllowEqual
    } else {
        Policy::Strict
    };
    let mut request = Request::new(src.string(), token, policy);
    if flags & 2 != 0 {
        request.op_id = Some(src.string());
    }
    if flags & 4 != 0 {
        request.expected_version = Some(src.u64());
    }
    request
}

/// The damage steps of the conformance vectors (tests/vectors/README.md),
/// applied to a stored-state slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// `u16 bit`: flip bit `bit % 8` of byte `bit / 8`, wrapping.
    FlipBit(u16),
    /// `u16 len`: keep the first `len` bytes.
    Truncate(u16),
    /// `blob`: append bytes.
    Append(Vec<u8>),
    /// `blob`: replace the whole state.
    Replace(Vec<u8>),
    /// Remove the state.
    Clear,
}

impl Damage {
    /// `kind u8` (modulo 5: flip-bit, truncate, append, replace, clear) and
    /// its argument.
    pub fn read(src: &mut Src<'_>) -> Damage {
        match src.u8() % 5 {
            0 => Damage::FlipBit(src.u16()),
            1 => Damage::Truncate(src.u16()),
            2 => Damage::Append(src.blob().to_vec()),
            3 => Damage::Replace(src.blob().to_vec()),
            _ => Damage::Clear,
        }
    }

    /// Apply to a slot, as the vector runner does: on an empty slot only
    /// `replace` creates bytes.
    pub fn apply(&self, slot: &mut Option<Vec<u8>>) {
        match (self, slot.as_mut()) {
            (Damage::Replace(bytes), _) => *slot = Some(bytes.clone()),
            (Damage::Clear, _) => *slot = None,
            (_, None) => {}
            (Damage::FlipBit(bit), Some(state)) => {
                let bits = state.len() * 8;
                if bits > 0 {
                    let bit = usize::from(*bit) % bits;
                    state[bit / 8] ^= 1 << (bit % 8);
                }
            }
            (Damage::Truncate(len), Some(state)) => state.truncate(usize::from(*len)),
            (Damage::Append(bytes), Some(state)) => state.extend_from_slice(bytes),
        }
    }
}

/// CRC-32C (Castagnoli, reflected, init and final xor `!0`), bit by bit:
/// an implementation independent of the guest's table-driven one.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Make the frame of `bytes` intact: the length field says its length and
/// the CRC is that of the bytes before it (guest/src/frame.rs). Damage then
/// reaches the decoder's field checks instead of stopping at the checksum.
/// Too short to hold a frame: left as it is.
pub fn fix_frame(bytes: &mut [u8]) {
    let len = bytes.len();
    if len < 11 {
        return;
    }
    bytes[3..7].copy_from_slice(&(len as u32).to_le_bytes());
    let crc = crc32c(&bytes[..len - 4]);
    bytes[len - 4..].copy_from_slice(&crc.to_le_bytes());
}

fn framed(magic: &[u8; 2], body: &[u8]) -> Vec<u8> {
    let mut out = magic.to_vec();
    out.push(1);
    out.extend_from_slice(&((body.len() + 11) as u32).to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The format-1 fence state of `info`, written from the layout documented
/// in guest/src/state.rs (not with the guest's encoder).
pub fn encode_state(info: &StateInfo) -> Vec<u8> {
    let mut body = Vec::new();
    for v in [
        info.authority,
        info.highest.epoch,
        info.highest.counter,
        info.version,
    ] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    put_str16(&mut body, &info.scope);
    body.push(info.window.len() as u8);
    for entry in &info.window {
        put_str16(&mut body, &entry.op_id);
        body.extend_from_slice(&entry.version.to_le_bytes());
    }
    framed(b"FS", &body)
}

/// The format-1 lease state of `info`, from the layout documented in
/// tests/vectors/README.md (not with the guest's encoder).
pub fn encode_lease(info: &LeaseInfo) -> Vec<u8> {
    let mut body = Vec::new();
    for v in [info.authority, info.epoch, info.counter] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    put_str16(&mut body, &info.lock);
    match &info.holder {
        None => body.push(0),
        Some(h) => {
            body.push(1);
            put_str16(&mut body, &h.lease_id);
            for v in [h.token.epoch, h.token.counter, h.expires_at] {
                body.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    framed(b"LS", &body)
}

/// The native reference and the component over both transports.
pub struct Runtimes {
    native: Native,
    core: Instance,
    component: Instance,
}

impl Runtimes {
    /// Load the embedded component once (precompiled at build time).
    pub fn new() -> Self {
        let runtime = Runtime::new().unwrap_or_else(|e| panic!("loading the component: {e}"));
        // Precompiled unless the fuzz build's engine differs from build.rs's.
        eprintln!("fencecheck-fuzz: component {:?}", runtime.loaded());
        let core = runtime
            .instance()
            .unwrap_or_else(|e| panic!("instantiating: {e}"));
        let component = runtime
            .with_component_transport()
            .instance()
            .unwrap_or_else(|e| panic!("instantiating: {e}"));
        Runtimes {
            native: Native,
            core,
            component,
        }
    }

    /// The native answer, after asserting that both wasm transports answer
    /// the same without an infrastructure error (trap, fuel, protocol).
    pub fn all<T: PartialEq + Debug>(
        &mut self,
        what: &str,
        mut call: impl FnMut(&mut dyn Checker) -> Result<T, Error>,
    ) -> T {
        let native = call(&mut self.native)
            .unwrap_or_else(|e| panic!("{what}: the native reference failed: {e}"));
        for (name, wasm) in [
            ("wasm (core transport)", &mut self.core),
            ("wasm (component API)", &mut self.component),
        ] {
            match call(wasm) {
                Ok(answer) => assert_eq!(answer, native, "{what}: {name} differs from native"),
                Err(e) => panic!("{what}: {name} failed: {e}"),
            }
        }
        native
    }

    /// `check-packed` on raw bytes: the native answer, after asserting that
    /// both transports return the same bytes (or the same refusal).
    pub fn check_packed(&mut self, input: &[u8]) -> Result<Vec<u8>, fencecheck::BatchError> {
        let native = fencecheck_guest::check_packed(input);
        for (name, wasm) in [
            ("wasm (core transport)", &mut self.core),
            ("wasm (component API)", &mut self.component),
        ] {
            match wasm.check_packed_raw(input) {
                Ok(answer) => {
                    assert_eq!(answer, native, "check-packed: {name} differs from native")
                }
                Err(e) => panic!("check-packed: {name} failed: {e}"),
            }
        }
        native
    }
}

thread_local! {
    static RUNTIMES: std::cell::RefCell<Option<Runtimes>> = const { std::cell::RefCell::new(None) };
}

/// Run `f` with this thread's runtimes, loaded on first use (libFuzzer calls
/// a target many times in one thread: the component is loaded once).
pub fn with_runtimes<T>(f: impl FnOnce(&mut Runtimes) -> T) -> T {
    RUNTIMES.with(|cell| f(cell.borrow_mut().get_or_insert_with(Runtimes::new)))
}

impl Default for Runtimes {
    fn default() -> Self {
        Self::new()
    }
}

/// What the fence check must decide for `request` against a state that
/// decoded to `old` (`None`: no state), written from docs/design.md §3 rules
/// 3-9 (the request is valid and the state intact): the decision, with
/// `Applied`'s state left empty, and the state an applied request leaves.
pub fn model_check(
    old: Option<&StateInfo>,
    request: &Request,
) -> Result<(Decision, Option<StateInfo>), fencecheck::CheckError> {
    use fencecheck::CheckError;
    use std::cmp::Ordering;
    let capacity = fencecheck::WINDOW_CAPACITY;
    let (version, mut window) = match old {
        None => (0, Vec::new()),
        Some(old) => {
            if old.scope != request.scope {
                return Err(CheckError::ScopeMismatch(old.scope.clone()));
            }
            if old.authority != request.token.authority {
                return Err(CheckError::ForeignAuthority {
                    stored: old.authority,
                    presented: request.token.authority,
                });
            }
            let stale = Decision::StaleFence {
                presented: request.token,
                highest: old.highest,
            };
            match (request.token.epoch, request.token.counter)
                .cmp(&(old.highest.epoch, old.highest.counter))
            {
                Ordering::Less => return Ok((stale, None)),
                Ordering::Greater => (old.version, Vec::new()),
                Ordering::Equal => {
                    if let Some(op) = &request.op_id
                        && let Some(e) = old.window.iter().find(|e| &e.op_id == op)
                    {
                        return Ok((Decision::Duplicate { version: e.version }, None));
                    }
                    match request.policy {
                        Policy::Strict => return Ok((stale, None)),
                        Policy::AllowEqual
                            if request.op_id.is_none() && request.expected_version.is_none() =>
                        {
                            return Err(CheckError::InvalidRequest(
                                fencecheck::InvalidReason::EqualTokenUnguarded,
                            ));
                        }
                        Policy::AllowEqual => (old.version, old.window.clone()),
                    }
                }
            }
        }
    };
    if let Some(expected) = request.expected_version
        && expected != version
    {
        return Ok((
            Decision::VersionConflict {
                expected,
                actual: version,
            },
            None,
        ));
    }
    let next = version.checked_add(1).ok_or(CheckError::Exhausted)?;
    if let Some(op) = &request.op_id {
        if window.len() >= capacity {
            window.remove(0);
        }
        window.push(fencecheck::WindowEntry {
            op_id: op.clone(),
            version: next,
        });
    }
    let info = StateInfo {
        format_version: fencecheck::FORMAT_VERSION,
        scope: request.scope.clone(),
        authority: request.token.authority,
        highest: request.token,
        version: next,
        window,
    };
    Ok((
        Decision::Applied {
            version: next,
            highest: request.token,
            state: Vec::new(),
        },
        Some(info),
    ))
}

/// Rule 1 of docs/design.md §3: why `request` is malformed, if it is.
pub fn model_validate(request: &Request) -> Option<fencecheck::InvalidReason> {
    use fencecheck::InvalidReason::*;
    if request.token.epoch == 0 && request.token.counter == 0 {
        return Some(MissingToken);
    }
    if request.scope.is_empty() {
        return Some(EmptyScope);
    }
    if request.scope.len() > fencecheck::MAX_SCOPE_BYTES {
        return Some(ScopeTooLong);
    }
    match &request.op_id {
        Some(op) if op.is_empty() => Some(EmptyOpId),
        Some(op) if op.len() > fencecheck::MAX_OP_ID_BYTES => Some(OpIdTooLong),
        _ => None,
    }
}

/// One lease action, as the lease target reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// `acquire`.
    Acquire(fencecheck::AcquireRequest),
    /// `renew`.
    Renew(fencecheck::RenewRequest),
    /// `release`.
    Release(fencecheck::ReleaseRequest),
    /// `restore`.
    Restore,
}

/// What a lease action must return, from docs/design.md §5 and
/// tests/vectors/README.md ("Lease steps"), given the decoded stored state
/// (`Ok(None)`: no state; `Err`: the state's decoding error): the outcome
/// name, its token and expiry where it has them, and the state it leaves
/// (`None`: unchanged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseExpect {
    /// `acquired`, `busy`, `renewed`, `lost`, `released`, `not-owner`, `restored`.
    pub outcome: &'static str,
    /// The granted token (`acquired`), the new epoch (`restored`, as its epoch).
    pub token: Option<Token>,
    /// `acquired`, `busy` and `renewed`: the lease's end.
    pub expires_at: Option<u64>,
    /// `busy`: the holder.
    pub holder: Option<String>,
    /// The state it leaves, for outcomes that write one.
    pub state: Option<LeaseInfo>,
}

impl LeaseExpect {
    fn new(outcome: &'static str) -> Self {
        LeaseExpect {
            outcome,
            token: None,
            expires_at: None,
            holder: None,
            state: None,
        }
    }
}

/// The lease model (see [`LeaseExpect`]).
pub fn model_lease(
    old: Result<Option<&LeaseInfo>, fencecheck::LeaseError>,
    action: &LeaseAction,
) -> Result<LeaseExpect, fencecheck::LeaseError> {
    use fencecheck::LeaseError::{self, *};
    use fencecheck::LeaseInvalidReason::*;
    let invalid = InvalidRequest;
    let lease_id = |id: &str| match id.len() {
        0 => Err(invalid(EmptyLeaseId)),
        n if n > fencecheck::MAX_LEASE_ID_BYTES => Err(invalid(LeaseIdTooLong)),
        _ => Ok(()),
    };
    let expiry = |now: u64, ttl: u64| -> Result<u64, LeaseError> {
        if ttl == 0 {
            return Err(invalid(ZeroTtl));
        }
        now.checked_add(ttl).ok_or(invalid(ExpiryOverflow))
    };
    let exact = |old: &LeaseInfo, id: &str, token: Token| {
        old.holder
            .as_ref()
            .is_some_and(|h| h.lease_id == id && h.token == token)
    };
    match action {
        LeaseAction::Acquire(r) => {
            match r.lock.len() {
                0 => return Err(invalid(EmptyLock)),
                n if n > fencecheck::MAX_LOCK_BYTES => return Err(invalid(LockTooLong)),
                _ => {}
            }
            lease_id(&r.lease_id)?;
            let expires_at = expiry(r.now, r.ttl)?;
            let mut lease = match old? {
                None => LeaseInfo {
                    format_version: fencecheck::FORMAT_VERSION,
                    lock: r.lock.clone(),
                    authority: r.authority,
                    epoch: r.epoch_floor,
                    counter: 0,
                    holder: None,
                },
                Some(old) => {
                    if old.lock != r.lock {
                        return Err(LockMismatch(old.lock.clone()));
                    }
                    if old.authority != r.authority {
                        return Err(ForeignAuthority {
                            stored: old.authority,
                            presented: r.authority,
                        });
                    }
                    old.clone()
                }
            };
            if let Some(h) = &lease.holder
                && r.now < h.expires_at
            {
                return Ok(if h.lease_id == r.lease_id {
                    LeaseExpect {
                        token: Some(h.token),
                        expires_at: Some(h.expires_at),
                        state: Some(lease.clone()),
                        ..LeaseExpect::new("acquired")
                    }
                } else {
                    LeaseExpect {
                        expires_at: Some(h.expires_at),
                        holder: Some(h.lease_id.clone()),
                        ..LeaseExpect::new("busy")
                    }
                });
            }
            if lease.epoch < r.epoch_floor {
                lease.epoch = r.epoch_floor;
                lease.counter = 0;
            }
            lease.counter = lease.counter.checked_add(1).ok_or(Exhausted)?;
            let token = Token::new(lease.authority, lease.epoch, lease.counter);
            lease.holder = Some(fencecheck::Holder {
                lease_id: r.lease_id.clone(),
                token,
                expires_at,
            });
            Ok(LeaseExpect {
                token: Some(token),
                expires_at: Some(expires_at),
                state: Some(lease),
                ..LeaseExpect::new("acquired")
            })
        }
        LeaseAction::Renew(r) => {
            let expires_at = expiry(r.now, r.ttl)?;
            lease_id(&r.lease_id)?;
            if r.token.epoch == 0 && r.token.counter == 0 {
                return Err(invalid(MissingToken));
            }
            let Some(old) = old? else {
                return Ok(LeaseExpect::new("lost"));
            };
            match &old.holder {
                Some(h) if exact(old, &r.lease_id, r.token) && r.now < h.expires_at => {
                    let mut lease = old.clone();
                    if let Some(h) = lease.holder.as_mut() {
                        h.expires_at = expires_at;
                    }
                    Ok(LeaseExpect {
                        expires_at: Some(expires_at),
                        state: Some(lease),
                        ..LeaseExpect::new("renewed")
                    })
                }
                _ => Ok(LeaseExpect::new("lost")),
            }
        }
        LeaseAction::Release(r) => {
            lease_id(&r.lease_id)?;
            if r.token.epoch == 0 && r.token.counter == 0 {
                return Err(invalid(MissingToken));
            }
            match old? {
                Some(old) if exact(old, &r.lease_id, r.token) => {
                    let mut lease = old.clone();
                    lease.holder = None;
                    Ok(LeaseExpect {
                        state: Some(lease),
                        ..LeaseExpect::new("released")
                    })
                }
                _ => Ok(LeaseExpect::new("not-owner")),
            }
        }
        LeaseAction::Restore => {
            let Some(old) = old? else {
                return Err(invalid(NoState));
            };
            let mut lease = old.clone();
            lease.epoch = lease.epoch.checked_add(1).ok_or(Exhausted)?;
            lease.counter = 0;
            Ok(LeaseExpect {
                token: Some(Token::new(lease.authority, lease.epoch, 0)),
                state: Some(lease),
                ..LeaseExpect::new("restored")
            })
        }
    }
}

/// One item of a packed batch: its state, request (with its signature, if
/// the item carries one) and, for a scope that requires signed tokens, the
/// keys the item carries.
pub type PackedItem = (Option<Vec<u8>>, Request, Option<Vec<GrantKey>>);

/// A packed batch from the input, `mode u8 | batch`: the batch bytes and,
/// if they follow the format, their items. Mode bit 0: make each parsed
/// state's frame intact (length and CRC-32C) and encode the batch again,
/// so that the checks get past the frame to the decision rules.
pub fn packed_input(src: &mut Src<'_>) -> (Vec<u8>, Option<Vec<PackedItem>>) {
    let mode = src.u8();
    let mut batch = src.0.to_vec();
    let mut items = parse_packed(&batch);
    if mode & 1 != 0
        && let Some(items) = items.as_mut()
    {
        for (state, _, _) in items.iter_mut() {
            if let Some(state) = state {
                fix_frame(state);
            }
        }
        batch = encode_packed(items);
    }
    (batch, items)
}

/// Parse a `check-packed` input per `wit/fence.wit`, independently of the
/// guest's parser: `None` exactly when the guest must answer `malformed`.
pub fn parse_packed(input: &[u8]) -> Option<Vec<PackedItem>> {
    fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if input.len() < n {
            return None;
        }
        let (head, rest) = input.split_at(n);
        *input = rest;
        Some(head)
    }
    fn u8_(input: &mut &[u8]) -> Option<u8> {
        take(input, 1)?.first().copied()
    }
    fn u32_(input: &mut &[u8]) -> Option<u32> {
        Some(u32::from_le_bytes(take(input, 4)?.try_into().ok()?))
    }
    fn u64_(input: &mut &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(take(input, 8)?.try_into().ok()?))
    }
    fn blob<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = u32_(input)? as usize;
        take(input, len)
    }
    fn short<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = u8_(input)?;
        take(input, usize::from(len))
    }
    fn text(input: &mut &[u8]) -> Option<String> {
        String::from_utf8(blob(input)?.to_vec()).ok()
    }
    let mut input = input;
    let count = u32_(&mut input)?;
    let mut items = Vec::new();
    for _ in 0..count {
        let flags = u8_(&mut input)?;
        // Bit 5 (signature) only with bit 4 (keys); bits 6 and 7 are zero.
        if flags & !0b11_1111 != 0 || flags & 0b11_0000 == 0b10_0000 {
            return None;
        }
        let token = Token::new(u64_(&mut input)?, u64_(&mut input)?, u64_(&mut input)?);
        let expected_version = if flags & 4 != 0 {
            Some(u64_(&mut input)?)
        } else {
            None
        };
        let scope = text(&mut input)?;
        let op_id = if flags & 2 != 0 {
            Some(text(&mut input)?)
        } else {
            None
        };
        let state = if flags & 1 != 0 {
            Some(blob(&mut input)?.to_vec())
        } else {
            None
        };
        let policy = if flags & 8 != 0 {
            Policy::AllowEqual
        } else {
            Policy::Strict
        };
        let mut request = Request::new(scope, token, policy);
        request.op_id = op_id;
        request.expected_version = expected_version;
        let keys = if flags & 16 != 0 {
            let n = u8_(&mut input)?;
            let mut keys = Vec::new();
            for _ in 0..n {
                let key_id = u32_(&mut input)?;
                keys.push(GrantKey {
                    key_id,
                    secret: short(&mut input)?.to_vec(),
                });
            }
            Some(keys)
        } else {
            None
        };
        if flags & 32 != 0 {
            let key_id = u32_(&mut input)?;
            let lease_id = text(&mut input)?;
            request.signature = Some(GrantSignature {
                key_id,
                lease_id,
                tag: short(&mut input)?.to_vec(),
            });
        }
        items.push((state, request, keys));
    }
    input.is_empty().then_some(items)
}

/// The `check-packed` input for `items` (`wit/fence.wit`). A signature is
/// written only for a keyed item (an unkeyed one cannot carry it); keys,
/// secrets and tags must fit their u8 lengths (parsed items always do).
pub fn encode_packed(items: &[PackedItem]) -> Vec<u8> {
    let mut out = (items.len() as u32).to_le_bytes().to_vec();
    for (state, r, keys) in items {
        let signature = keys.as_ref().and(r.signature.as_ref());
        let flags = u8::from(state.is_some())
            | (u8::from(r.op_id.is_some()) << 1)
            | (u8::from(r.expected_version.is_some()) << 2)
            | (u8::from(r.policy == Policy::AllowEqual) << 3)
            | (u8::from(keys.is_some()) << 4)
            | (u8::from(signature.is_some()) << 5);
        out.push(flags);
        for v in [r.token.authority, r.token.epoch, r.token.counter] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(v) = r.expected_version {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let blob = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        };
        let short = |out: &mut Vec<u8>, b: &[u8]| {
            out.push(b.len() as u8);
            out.extend_from_slice(b);
        };
        blob(&mut out, r.scope.as_bytes());
        if let Some(op) = &r.op_id {
            blob(&mut out, op.as_bytes());
        }
        if let Some(s) = state {
            blob(&mut out, s);
        }
        if let Some(keys) = keys {
            out.push(keys.len() as u8);
            for k in keys {
                out.extend_from_slice(&k.key_id.to_le_bytes());
                short(&mut out, &k.secret);
            }
        }
        if let Some(s) = signature {
            out.extend_from_slice(&s.key_id.to_le_bytes());
            blob(&mut out, s.lease_id.as_bytes());
            short(&mut out, &s.tag);
        }
    }
    out
}

/// Why `check-signed` must refuse `request` before reading any state, or
/// `None` when authentication passes (then it decides as `check`), written
/// from `wit/fence.wit` (`auth`) with the `hmac` crate over the documented
/// grant message; an invalid request is `check`'s own error (rule 1 first).
pub fn auth_model(request: &Request, keys: &[GrantKey]) -> Option<SignedCheckError> {
    use hmac::Mac;
    if let Err(e) = fencecheck_guest::check(None, request) {
        if matches!(e, fencecheck::CheckError::InvalidRequest(_)) {
            return Some(SignedCheckError::Check(e));
        }
    }
    let problem = if keys.is_empty() {
        Some(KeyProblem::NoKeys)
    } else if keys.len() > 16 {
        Some(KeyProblem::TooManyKeys)
    } else {
        keys.iter().enumerate().find_map(|(i, k)| {
            if k.secret.len() < 16 {
                Some(KeyProblem::ShortSecret)
            } else if k.secret.len() > 64 {
                Some(KeyProblem::LongSecret)
            } else if keys[i + 1..].iter().any(|o| o.key_id == k.key_id) {
                Some(KeyProblem::DuplicateKeyId)
            } else {
                None
            }
        })
    };
    if let Some(problem) = problem {
        return Some(SignedCheckError::InvalidKeys(problem));
    }
    let failure = |f| Some(SignedCheckError::Unauthenticated(f));
    let Some(s) = &request.signature else {
        return failure(AuthFailure::Unsigned);
    };
    if s.lease_id.is_empty() || s.lease_id.len() > 256 || s.tag.len() != 32 {
        return failure(AuthFailure::MalformedSignature);
    }
    let Some(key) = keys.iter().find(|k| k.key_id == s.key_id) else {
        return failure(AuthFailure::UnknownKey);
    };
    let mut message = b"fencecheck-grant-v1\0".to_vec();
    message.extend_from_slice(&(request.scope.len() as u32).to_le_bytes());
    message.extend_from_slice(request.scope.as_bytes());
    let t = request.token;
    for v in [t.authority, t.epoch, t.counter] {
        message.extend_from_slice(&v.to_le_bytes());
    }
    message.extend_from_slice(&s.key_id.to_le_bytes());
    message.extend_from_slice(&(s.lease_id.len() as u32).to_le_bytes());
    message.extend_from_slice(s.lease_id.as_bytes());
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key.secret)
        .unwrap_or_else(|e| panic!("HMAC takes any key length: {e}"));
    mac.update(&message);
    if mac.finalize().into_bytes().as_slice() == s.tag.as_slice() {
        None
    } else {
        failure(AuthFailure::BadSignature)
    }
}

/// The `check-packed` output for these outcomes (`wit/fence.wit`), written
/// from the documented tags, independently of the guest's writer.
pub fn encode_packed_outcomes(outcomes: &[fencecheck::SignedOutcome]) -> Vec<u8> {
    use fencecheck::{CheckError as E, Corruption as C, InvalidReason as I};
    let mut out = (outcomes.len() as u32).to_le_bytes().to_vec();
    let u64s = |out: &mut Vec<u8>, vs: &[u64]| {
        for v in vs {
            out.extend_from_slice(&v.to_le_bytes());
        }
    };
    for outcome in outcomes {
        let outcome = match outcome {
            Ok(d) => Ok(d),
            Err(SignedCheckError::Check(e)) => Err(e),
            Err(SignedCheckError::Unauthenticated(f)) => {
                out.push(134);
                out.push(match f {
                    AuthFailure::Unsigned => 0,
                    AuthFailure::UnknownKey => 1,
                    AuthFailure::MalformedSignature => 2,
                    AuthFailure::BadSignature => 3,
                });
                continue;
            }
            Err(SignedCheckError::InvalidKeys(p)) => {
                out.push(135);
                out.push(match p {
                    KeyProblem::NoKeys => 0,
                    KeyProblem::TooManyKeys => 1,
                    KeyProblem::ShortSecret => 2,
                    KeyProblem::LongSecret => 3,
                    KeyProblem::DuplicateKeyId => 4,
                });
                continue;
            }
        };
        match outcome {
            Ok(Decision::Applied {
                version,
                highest,
                state,
            }) => {
                out.push(0);
                u64s(
                    &mut out,
                    &[*version, highest.authority, highest.epoch, highest.counter],
                );
                out.extend_from_slice(&(state.len() as u32).to_le_bytes());
                out.extend_from_slice(state);
            }
            Ok(Decision::Duplicate { version }) => {
                out.push(1);
                u64s(&mut out, &[*version]);
            }
            Ok(Decision::StaleFence { presented, highest }) => {
                out.push(2);
                u64s(
                    &mut out,
                    &[
                        presented.authority,
                        presented.epoch,
                        presented.counter,
                        highest.authority,
                        highest.epoch,
                        highest.counter,
                    ],
                );
            }
            Ok(Decision::VersionConflict { expected, actual }) => {
                out.push(3);
                u64s(&mut out, &[*expected, *actual]);
            }
            Err(E::InvalidRequest(reason)) => {
                out.push(128);
                out.push(match reason {
                    I::MissingToken => 0,
                    I::EmptyScope => 1,
                    I::ScopeTooLong => 2,
                    I::EmptyOpId => 3,
                    I::OpIdTooLong => 4,
                    I::EqualTokenUnguarded => 5,
                });
            }
            Err(E::CorruptState(c)) => {
                out.push(129);
                out.push(match c {
                    C::Truncated => 0,
                    C::LengthMismatch => 1,
                    C::ChecksumMismatch => 2,
                    C::Malformed => 3,
                });
            }
            Err(E::UnsupportedStateVersion(v)) => out.extend_from_slice(&[130, *v]),
            Err(E::ScopeMismatch(scope)) => {
                out.push(131);
                out.extend_from_slice(&(scope.len() as u32).to_le_bytes());
                out.extend_from_slice(scope.as_bytes());
            }
            Err(E::ForeignAuthority { stored, presented }) => {
                out.push(132);
                u64s(&mut out, &[*stored, *presented]);
            }
            Err(E::Exhausted) => out.push(133),
        }
    }
    out
}
