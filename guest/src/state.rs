//! The canonical encoding of a scope's fence state.
//!
//! Every format version keeps the same *frame*, so a decoder can always tell
//! damage from a newer format:
//!
//! ```text
//! magic "FS" (2) | format (1) | total length u32 LE (4) | body … | CRC-32C u32 LE (4)
//! ```
//!
//! The CRC covers every byte before it; the length counts every byte including
//! the CRC. Damage is detected before the format is read, so a flipped format
//! byte is `corrupt-state`, while an intact state of a newer format is
//! `unsupported-state-version`.
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

use crate::crc::crc32c;
use crate::types::{
    CheckError, Corruption, MAX_OP_ID_BYTES, MAX_SCOPE_BYTES, StateInfo, Token, WindowEntry,
};

/// The format version this build writes (and the newest it reads).
pub const FORMAT_VERSION: u8 = 1;
/// How many op-ids applied under the highest token are remembered.
pub const WINDOW_CAPACITY: usize = 32;

const MAGIC: [u8; 2] = *b"FS";
const HEADER_LEN: usize = 2 + 1 + 4;
const CRC_LEN: usize = 4;

/// One op-id applied under the highest token, borrowed from stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    pub op_id: &'a str,
    pub version: u64,
}

/// A decoded, validated fence state. It borrows its strings from the stored
/// bytes, so deciding a request allocates nothing but the new state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct State<'a> {
    pub scope: &'a str,
    /// Carries the scope's authority in `authority`.
    pub highest: Token,
    pub version: u64,
    /// Oldest first; at most [`WINDOW_CAPACITY`].
    pub window: Vec<Entry<'a>>,
}

impl<'a> State<'a> {
    /// The canonical bytes of this state. Callers uphold the invariants that
    /// `decode` checks (lengths within limits), so every length fits its field.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let window_bytes: usize = self
            .window
            .iter()
            .map(|e| e.op_id.len().saturating_add(10))
            .sum();
        let capacity = HEADER_LEN
            .saturating_add(32 + 2 + 1 + CRC_LEN)
            .saturating_add(self.scope.len())
            .saturating_add(window_bytes);
        let mut out = Vec::with_capacity(capacity);
        out.extend_from_slice(&MAGIC);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&[0; 4]); // length, patched below
        out.extend_from_slice(&self.highest.authority.to_le_bytes());
        out.extend_from_slice(&self.highest.epoch.to_le_bytes());
        out.extend_from_slice(&self.highest.counter.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.scope.len() as u16).to_le_bytes());
        out.extend_from_slice(self.scope.as_bytes());
        out.push(self.window.len() as u8);
        for entry in &self.window {
            out.extend_from_slice(&(entry.op_id.len() as u16).to_le_bytes());
            out.extend_from_slice(entry.op_id.as_bytes());
            out.extend_from_slice(&entry.version.to_le_bytes());
        }
        let total = (out.len().saturating_add(CRC_LEN)) as u32;
        if let Some(len_field) = out.get_mut(3..7) {
            len_field.copy_from_slice(&total.to_le_bytes());
        }
        let crc = crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decode and validate stored bytes; see the module docs for the order of
    /// checks.
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<State<'a>, CheckError> {
        let corrupt = CheckError::CorruptState;
        if bytes.len() < HEADER_LEN.saturating_add(CRC_LEN) {
            return Err(corrupt(Corruption::Truncated));
        }
        let mut frame = Reader(bytes);
        let magic = frame.take(2).map_err(corrupt)?;
        let format = frame.u8().map_err(corrupt)?;
        let length = frame.u32().map_err(corrupt)?;
        if usize::try_from(length).ok() != Some(bytes.len()) {
            return Err(corrupt(Corruption::LengthMismatch));
        }
        let split = bytes.len().saturating_sub(CRC_LEN);
        let (covered, stored_crc) = bytes
            .split_at_checked(split)
            .ok_or(corrupt(Corruption::Truncated))?;
        if stored_crc != crc32c(covered).to_le_bytes() {
            return Err(corrupt(Corruption::ChecksumMismatch));
        }
        if magic != MAGIC {
            return Err(corrupt(Corruption::Malformed));
        }
        if format > FORMAT_VERSION {
            return Err(CheckError::UnsupportedStateVersion(format));
        }
        if format != FORMAT_VERSION {
            return Err(corrupt(Corruption::Malformed));
        }
        let body = covered.get(HEADER_LEN..).unwrap_or_default();
        decode_body(body).map_err(corrupt)
    }

    pub(crate) fn info(self) -> StateInfo {
        StateInfo {
            format_version: FORMAT_VERSION,
            scope: self.scope.to_owned(),
            authority: self.highest.authority,
            highest: self.highest,
            version: self.version,
            window: self
                .window
                .iter()
                .map(|e| WindowEntry {
                    op_id: e.op_id.to_owned(),
                    version: e.version,
                })
                .collect(),
        }
    }
}

fn decode_body(body: &[u8]) -> Result<State<'_>, Corruption> {
    let mut r = Reader(body);
    let highest = Token::new(r.u64()?, r.u64()?, r.u64()?);
    let version = r.u64()?;
    let scope = r.string(1, MAX_SCOPE_BYTES)?;
    let count = usize::from(r.u8()?);
    if highest.is_missing() || version == 0 || count > WINDOW_CAPACITY {
        return Err(Corruption::Malformed);
    }
    let mut window: Vec<Entry<'_>> = Vec::with_capacity(count);
    for _ in 0..count {
        let op_id = r.string(1, MAX_OP_ID_BYTES)?;
        let entry_version = r.u64()?;
        let increasing = window
            .last()
            .is_none_or(|prev| prev.version < entry_version);
        let distinct = window.iter().all(|e| e.op_id != op_id);
        if entry_version == 0 || entry_version > version || !increasing || !distinct {
            return Err(Corruption::Malformed);
        }
        window.push(Entry {
            op_id,
            version: entry_version,
        });
    }
    if !r.0.is_empty() {
        return Err(Corruption::Malformed);
    }
    Ok(State {
        scope,
        highest,
        version,
        window,
    })
}

/// A cursor that never panics: every read past the end is `Malformed`.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Corruption> {
        let (head, rest) = self.0.split_at_checked(n).ok_or(Corruption::Malformed)?;
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Corruption> {
        self.take(N)?.try_into().map_err(|_| Corruption::Malformed)
    }

    fn u8(&mut self) -> Result<u8, Corruption> {
        Ok(u8::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, Corruption> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Corruption> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u16-length-prefixed UTF-8 string of `min..=max` bytes.
    fn string(&mut self, min: usize, max: usize) -> Result<&'a str, Corruption> {
        let len = usize::from(u16::from_le_bytes(self.array()?));
        if len < min || len > max {
            return Err(Corruption::Malformed);
        }
        let raw = self.take(len)?;
        core::str::from_utf8(raw).map_err(|_| Corruption::Malformed)
    }
}

/// Decode a stored state into a readable record (for tools and metrics).
pub fn inspect(bytes: &[u8]) -> Result<StateInfo, CheckError> {
    State::decode(bytes).map(State::info)
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]
mod tests {
    use super::*;

    fn sample() -> State<'static> {
        State {
            scope: "report/july",
            highest: Token::new(7, 1, 42),
            version: 3,
            window: vec![
                Entry {
                    op_id: "a",
                    version: 2,
                },
                Entry {
                    op_id: "b",
                    version: 3,
                },
            ],
        }
    }

    /// Encoding then decoding gives back the same state, and re-encoding the
    /// decoded state gives back the same bytes.
    #[test]
    fn round_trips_canonically() {
        let bytes = sample().encode();
        let decoded = State::decode(&bytes);
        assert_eq!(decoded, Ok(sample()));
        assert_eq!(sample().encode(), bytes);
    }

    /// Every single-bit flip of a valid state is refused as corrupt.
    #[test]
    fn every_bit_flip_is_corrupt() {
        let bytes = sample().encode();
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
        let bytes = sample().encode();
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
        let mut bytes = sample().encode();
        bytes[2] = FORMAT_VERSION + 1;
        let split = bytes.len() - 4;
        let crc = crc32c(&bytes[..split]).to_le_bytes();
        bytes[split..].copy_from_slice(&crc);
        assert_eq!(
            State::decode(&bytes),
            Err(CheckError::UnsupportedStateVersion(FORMAT_VERSION + 1))
        );
    }
}
