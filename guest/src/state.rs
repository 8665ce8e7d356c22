//! The canonical encoding of a scope's fence state, inside the shared frame
//! of `frame.rs` with magic `"FS"`.
//!
//! Format 1 body, integers little-endian:
//!
//! ```text
//! authority u64 | highest.epoch u64 | highest.counter u64 | version u64
//! scope-len u16 | scope (UTF-8)
//! window-count u8 | window-count × ( op-id-len u16 | op-id (UTF-8) | version u64 )
//! ```
//!
//! Decoding accepts only canonical bytes (valid lengths, a token that is not
//! "missing", window versions strictly increasing and at most `version`,
//! distinct op-ids), so `encode(decode(bytes)) == bytes` for every accepted
//! input and every runtime writes the same bytes.

use crate::crc;
use crate::frame::{self, CRC_LEN, FORMAT_VERSION, FrameError, HEADER_LEN, Reader, same};
use crate::types::{
    CheckError, Corruption, MAX_OP_ID_BYTES, MAX_SCOPE_BYTES, StateInfo, Token, WindowEntry,
};

/// How many op-ids applied under the highest token are remembered.
pub const WINDOW_CAPACITY: usize = 32;

const MAGIC: [u8; 2] = *b"FS";

/// The header and the body's fixed fields (authority, epoch, counter,
/// version, scope length): every state starts with these 41 bytes.
const HEAD_LEN: usize = HEADER_LEN + 34;
/// Where the encoded epoch starts; counter and version follow it.
const EPOCH_AT: usize = HEADER_LEN + 8;
/// The bytes of a window entry besides its op-id (length and version).
const ENTRY_OVERHEAD: usize = 2 + 8;

impl From<FrameError> for CheckError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Corrupt(c) => CheckError::CorruptState(c),
            FrameError::Unsupported(v) => CheckError::UnsupportedStateVersion(v),
        }
    }
}

/// One op-id applied under the highest token, borrowed from stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    /// Valid UTF-8 (checked by `State::decode`).
    pub op_id: &'a [u8],
    pub version: u64,
}

/// The op-ids applied under the highest token, oldest first, left in their
/// encoded form (`op-id-len u16 | op-id | version u64` each) and borrowed
/// from the stored bytes: deciding needs no copy of them, and encoding the
/// next state copies them as one slice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Window<'a> {
    /// Exactly `len` well-formed entries (checked by `State::decode`).
    bytes: &'a [u8],
    len: u8,
}

impl<'a> Window<'a> {
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn iter(&self) -> Entries<'a> {
        Entries(Reader(self.bytes))
    }

    /// The version `op_id` was applied at, if it is in the window.
    pub(crate) fn find(&self, op_id: &[u8]) -> Option<u64> {
        self.iter()
            .find(|e| same(e.op_id, op_id))
            .map(|e| e.version)
    }

    /// The window without its oldest entry.
    fn without_oldest(self) -> Window<'a> {
        let mut entries = self.iter();
        if entries.next().is_none() {
            return self;
        }
        Window {
            bytes: (entries.0).0,
            len: self.len.saturating_sub(1),
        }
    }
}

/// The entries of a [`Window`], oldest first.
pub(crate) struct Entries<'a>(Reader<'a>);

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.0.0.is_empty() {
            return None;
        }
        let op_id = self.0.bytes(0, usize::MAX).ok()?;
        let version = self.0.u64().ok()?;
        Some(Entry { op_id, version })
    }
}

/// A decoded, validated fence state, borrowing everything from the stored
/// bytes: deciding a request allocates nothing but the new state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State<'a> {
    /// Not checked to be UTF-8 by `decode`: the check compares it with the
    /// request's scope (valid UTF-8), and only a mismatch needs [`State::scope_str`].
    pub scope: &'a [u8],
    /// Carries the scope's authority in `authority`.
    pub highest: Token,
    pub version: u64,
    /// At most [`WINDOW_CAPACITY`] entries.
    pub window: Window<'a>,
    /// The stored CRC-32C (verified).
    crc: u32,
}

impl<'a> State<'a> {
    /// Decode and validate stored bytes (frame first, then the body). A
    /// scope that is not UTF-8 is refused by `scope_str`, and so `Malformed`
    /// either way: the check compares the bytes first, and only a scope that
    /// differs from the request's can be invalid.
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<State<'a>, CheckError> {
        let (body, crc) = frame::open(bytes, MAGIC)?;
        decode_body(body, crc).map_err(CheckError::CorruptState)
    }

    /// The scope as text; a stored scope that is not UTF-8 is malformed.
    pub(crate) fn scope_str(&self) -> Result<&'a str, CheckError> {
        core::str::from_utf8(self.scope)
            .map_err(|_| CheckError::CorruptState(Corruption::Malformed))
    }

    /// What this state becomes under `highest` at `version` when its whole
    /// window is kept and nothing is added: the same bytes but for epoch,
    /// counter, version and CRC.
    pub(crate) fn base(&self) -> Base {
        Base {
            highest: self.highest,
            version: self.version,
            crc: self.crc,
        }
    }

    pub(crate) fn info(self) -> Result<StateInfo, CheckError> {
        let text = |b: &[u8]| {
            core::str::from_utf8(b)
                .map(str::to_owned)
                .map_err(|_| CheckError::CorruptState(Corruption::Malformed))
        };
        Ok(StateInfo {
            format_version: FORMAT_VERSION,
            scope: self.scope_str()?.to_owned(),
            authority: self.highest.authority,
            highest: self.highest,
            version: self.version,
            window: self
                .window
                .iter()
                .map(|e| {
                    Ok(WindowEntry {
                        op_id: text(e.op_id)?,
                        version: e.version,
                    })
                })
                .collect::<Result<_, CheckError>>()?,
        })
    }
}

fn decode_body(body: &[u8], crc: u32) -> Result<State<'_>, Corruption> {
    // The fixed fields in one bounds check, then the variable ones.
    let (fixed, rest) = body
        .split_first_chunk::<{ HEAD_LEN - HEADER_LEN }>()
        .ok_or(Corruption::Malformed)?;
    let highest = Token::new(
        le_u64(&fixed[..8]),
        le_u64(&fixed[8..16]),
        le_u64(&fixed[16..24]),
    );
    let version = le_u64(&fixed[24..32]);
    let scope_len = usize::from(u16::from_le_bytes([fixed[32], fixed[33]]));
    if scope_len == 0 || scope_len > MAX_SCOPE_BYTES {
        return Err(Corruption::Malformed);
    }
    let mut r = Reader(rest);
    let scope = r.take(scope_len)?;
    let count = r.u8()?;
    if highest.is_missing() || version == 0 || usize::from(count) > WINDOW_CAPACITY {
        return Err(Corruption::Malformed);
    }
    let entries = r.0;
    let mut previous = 0u64;
    for seen in 0..count {
        let op_id = r.str(1, MAX_OP_ID_BYTES)?.as_bytes();
        let entry_version = r.u64()?;
        // Versions strictly increase (so none is 0) up to the state's.
        if entry_version <= previous || entry_version > version {
            return Err(Corruption::Malformed);
        }
        let earlier = Window {
            bytes: entries,
            len: seen,
        };
        if earlier
            .iter()
            .take(usize::from(seen))
            .any(|e| same(e.op_id, op_id))
        {
            return Err(Corruption::Malformed);
        }
        previous = entry_version;
    }
    r.end()?;
    Ok(State {
        scope,
        highest,
        version,
        window: Window {
            bytes: entries,
            len: count,
        },
        crc,
    })
}

/// The little-endian u64 at the start of `bytes` (callers pass eight bytes).
#[inline(always)]
fn le_u64(bytes: &[u8]) -> u64 {
    bytes
        .first_chunk::<8>()
        .map_or(0, |b| u64::from_le_bytes(*b))
}

/// The stored state an applied request's new state differs from only in
/// epoch, counter and version (same scope, same authority, same window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Base {
    highest: Token,
    version: u64,
    crc: u32,
}

/// The state an applied request leaves, written once by `encode_into`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Next<'a> {
    /// Valid UTF-8, like `pushed`: the request's.
    pub scope: &'a [u8],
    /// Carries the scope's authority in `authority`.
    pub highest: Token,
    pub version: u64,
    /// Entries carried over from the stored state, oldest first.
    kept: Window<'a>,
    /// The op-id applied now, at `version`, after `kept`.
    pushed: Option<&'a [u8]>,
    /// Set only when the new bytes differ from the stored ones in epoch,
    /// counter and version alone: the CRC is then patched, not recomputed.
    base: Option<Base>,
}

impl<'a> Next<'a> {
    /// The state after applying a request: `kept` (the stored window, or an
    /// empty one) with `op_id` appended, the oldest entry dropped if the
    /// window is full. `base` is the stored state when `kept` is its whole
    /// window; the scope and the authority must be the stored ones.
    pub(crate) fn new(
        scope: &'a [u8],
        highest: Token,
        version: u64,
        kept: Window<'a>,
        op_id: Option<&'a [u8]>,
        base: Option<Base>,
    ) -> Self {
        let (kept, base) = match op_id {
            None => (kept, base),
            Some(_) if kept.len() >= WINDOW_CAPACITY => (kept.without_oldest(), None),
            Some(_) => (kept, None),
        };
        Next {
            scope,
            highest,
            version,
            kept,
            pushed: op_id,
            base,
        }
    }

    /// The length of the encoded state. Scopes, op-ids and the window are
    /// within their limits, so this is far below `u32::MAX`.
    pub(crate) fn encoded_len(&self) -> usize {
        let pushed = self
            .pushed
            .map_or(0, |op| op.len().saturating_add(ENTRY_OVERHEAD));
        (HEAD_LEN + 1 + CRC_LEN)
            .saturating_add(self.scope.len())
            .saturating_add(self.kept.bytes.len())
            .saturating_add(pushed)
    }

    /// The canonical bytes of this state, allocated once at their size.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// Append the canonical bytes of this state to `out`.
    #[inline]
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        let total = self.encoded_len();
        out.reserve(total);
        let start = out.len();
        let mut head = [0u8; HEAD_LEN];
        head[..2].copy_from_slice(&MAGIC);
        head[2] = FORMAT_VERSION;
        head[3..7].copy_from_slice(&(total as u32).to_le_bytes());
        head[7..15].copy_from_slice(&self.highest.authority.to_le_bytes());
        head[15..23].copy_from_slice(&self.highest.epoch.to_le_bytes());
        head[23..31].copy_from_slice(&self.highest.counter.to_le_bytes());
        head[31..39].copy_from_slice(&self.version.to_le_bytes());
        head[39..41].copy_from_slice(&(self.scope.len() as u16).to_le_bytes());
        out.extend_from_slice(&head);
        out.extend_from_slice(self.scope);
        let pushed = u8::from(self.pushed.is_some());
        out.push(self.kept.len.saturating_add(pushed));
        out.extend_from_slice(self.kept.bytes);
        if let Some(op_id) = self.pushed {
            out.extend_from_slice(&(op_id.len() as u16).to_le_bytes());
            out.extend_from_slice(op_id);
            out.extend_from_slice(&self.version.to_le_bytes());
        }
        let crc = match self.base {
            // The bytes after the version field, up to the CRC, are unchanged.
            Some(base) => crc::patch(
                base.crc,
                [
                    base.highest.epoch ^ self.highest.epoch,
                    base.highest.counter ^ self.highest.counter,
                    base.version ^ self.version,
                ],
                total.saturating_sub(EPOCH_AT + 24 + CRC_LEN),
            ),
            None => crc::crc32c(out.get(start..).unwrap_or_default()),
        };
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// Decode a stored state into a readable record (for tools and metrics).
pub fn inspect(bytes: &[u8]) -> Result<StateInfo, CheckError> {
    State::decode(bytes).and_then(State::info)
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> State<'_> {
        State::decode(bytes).unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// `report/july` at `7:1.42`, version 3, window `[a at 2, b at 3]`.
    fn sample() -> Vec<u8> {
        let token = Token::new(7, 1, 42);
        let one = Next::new(
            b"report/july",
            token,
            2,
            Window::default(),
            Some(b"a"),
            None,
        );
        let one = one.encode();
        let two = Next::new(
            b"report/july",
            token,
            3,
            decode(&one).window,
            Some(b"b"),
            None,
        );
        two.encode()
    }

    /// The format, byte by byte, as the module docs give it.
    #[test]
    fn encodes_the_documented_layout() {
        let mut expected = b"FS\x01".to_vec();
        expected.extend_from_slice(&(7u32 + 34 + 11 + 1 + 11 + 11 + 4).to_le_bytes());
        for v in [7u64, 1, 42, 3] {
            expected.extend_from_slice(&v.to_le_bytes());
        }
        expected.extend_from_slice(&11u16.to_le_bytes());
        expected.extend_from_slice(b"report/july");
        expected.push(2);
        for (op, v) in [(b"a", 2u64), (b"b", 3)] {
            expected.extend_from_slice(&1u16.to_le_bytes());
            expected.extend_from_slice(op);
            expected.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crate::crc::crc32c(&expected);
        expected.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(sample(), expected);
    }

    /// Decoding gives back the fields, and re-encoding the decoded state
    /// (with its CRC patched or computed afresh) gives back the same bytes.
    #[test]
    fn round_trips_canonically() {
        let bytes = sample();
        let state = decode(&bytes);
        assert_eq!(state.scope, b"report/july");
        assert_eq!(state.highest, Token::new(7, 1, 42));
        assert_eq!(state.version, 3);
        let window: Vec<_> = state.window.iter().map(|e| (e.op_id, e.version)).collect();
        assert_eq!(window, [(&b"a"[..], 2), (&b"b"[..], 3)]);
        let scope = state.scope_str().unwrap_or_else(|e| panic!("{e:?}"));
        for base in [None, Some(state.base())] {
            let again = Next::new(
                scope.as_bytes(),
                state.highest,
                state.version,
                state.window,
                None,
                base,
            );
            assert_eq!(again.encoded_len(), bytes.len());
            assert_eq!(again.encode(), bytes);
        }
    }

    /// A patched CRC is the CRC of the new bytes, whatever changed among
    /// epoch, counter and version, for short and long scopes and windows.
    #[test]
    fn patched_crc_is_the_crc() {
        let long = "s".repeat(MAX_SCOPE_BYTES);
        for scope in [&b"s"[..], b"report/july", long.as_bytes()] {
            for ops in [0usize, 1, 5] {
                let token = Token::new(9, 3, 8);
                let mut bytes = Next::new(scope, token, 1, Window::default(), None, None).encode();
                for i in 0..ops {
                    let op = format!("op{i}");
                    let state = decode(&bytes);
                    let version = state.version + 1;
                    let op = Some(op.as_bytes());
                    bytes = Next::new(scope, token, version, state.window, op, None).encode();
                }
                let state = decode(&bytes);
                for (epoch, counter, version) in [
                    (3, 8, 7),
                    (3, 9, 7),
                    (4, 1, 7),
                    (u64::MAX, u64::MAX, u64::MAX),
                ] {
                    let highest = Token::new(9, epoch, counter);
                    let patched = Next::new(
                        scope,
                        highest,
                        version,
                        state.window,
                        None,
                        Some(state.base()),
                    );
                    let fresh = Next::new(scope, highest, version, state.window, None, None);
                    let patched = patched.encode();
                    assert_eq!(patched, fresh.encode());
                    assert_eq!(decode(&patched).highest, highest);
                }
            }
        }
    }

    /// The window drops its oldest entry when full, and only then.
    #[test]
    fn window_drops_the_oldest_when_full() {
        let token = Token::new(0, 0, 1);
        let mut bytes = Next::new(b"s", token, 1, Window::default(), Some(b"op0"), None).encode();
        for i in 1..=WINDOW_CAPACITY {
            let state = decode(&bytes);
            let op = format!("op{i}");
            let op = Some(op.as_bytes());
            let next = Next::new(b"s", token, state.version + 1, state.window, op, None);
            let encoded = next.encode();
            assert_eq!(next.encoded_len(), encoded.len());
            bytes = encoded;
        }
        let info = inspect(&bytes).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(info.window.len(), WINDOW_CAPACITY);
        assert_eq!(info.window[0].op_id, "op1");
        assert_eq!(
            info.window[WINDOW_CAPACITY - 1].op_id,
            format!("op{WINDOW_CAPACITY}")
        );
    }

    /// A stored scope that is not UTF-8 is malformed, for inspect as for the check.
    #[test]
    fn a_scope_that_is_not_utf8_is_malformed() {
        let mut bytes =
            Next::new(b"ab", Token::new(0, 0, 1), 1, Window::default(), None, None).encode();
        bytes[41] = 0xff;
        let split = bytes.len() - 4;
        let crc = crate::crc::crc32c(&bytes[..split]).to_le_bytes();
        bytes[split..].copy_from_slice(&crc);
        let state = decode(&bytes);
        let malformed = Err(CheckError::CorruptState(Corruption::Malformed));
        assert_eq!(state.scope_str().map(|_| ()), malformed);
        assert_eq!(inspect(&bytes).map(|_| ()), malformed);
    }

    /// Every single-bit flip of a valid state is refused as corrupt.
    #[test]
    fn every_bit_flip_is_corrupt() {
        let bytes = sample();
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(State::decode(&damaged), Err(CheckError::CorruptState(_))),
                "bit {bit} not detected"
            );
        }
    }

    /// Every truncation and every appended byte is refused as corrupt.
    #[test]
    fn truncation_and_trailing_bytes_are_corrupt() {
        let bytes = sample();
        for len in 0..bytes.len() {
            assert!(matches!(
                State::decode(&bytes[..len]),
                Err(CheckError::CorruptState(_))
            ));
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            State::decode(&longer),
            Err(CheckError::CorruptState(Corruption::LengthMismatch))
        );
    }

    /// An intact frame of a newer format is reported as such, not as damage.
    #[test]
    fn newer_format_is_unsupported() {
        let mut bytes = sample();
        bytes[2] = FORMAT_VERSION + 1;
        let split = bytes.len() - 4;
        let crc = crate::crc::crc32c(&bytes[..split]).to_le_bytes();
        bytes[split..].copy_from_slice(&crc);
        assert_eq!(
            State::decode(&bytes),
            Err(CheckError::UnsupportedStateVersion(FORMAT_VERSION + 1))
        );
    }
}
