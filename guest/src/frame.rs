//! The frame every stored encoding shares, fence state and lease state alike.
//!
//! ```text
//! magic (2) | format (1) | total length u32 LE (4) | body … | CRC-32C u32 LE (4)
//! ```
//!
//! The frame never changes between format versions, so a decoder can always
//! tell damage from a newer format: the length and the CRC (which covers every
//! byte before it) are verified before the format byte is believed. A flipped
//! format byte is therefore corruption, while an intact frame of a newer format
//! is "unsupported". Single-bit flips are caught by the CRC, truncation and
//! trailing bytes by the length field.

use crate::crc::crc32c;
use crate::types::Corruption;

/// The format version this build writes (and the newest it reads).
pub const FORMAT_VERSION: u8 = 1;

const HEADER_LEN: usize = 2 + 1 + 4;
const CRC_LEN: usize = 4;

/// Why a frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameError {
    Corrupt(Corruption),
    Unsupported(u8),
}

impl From<Corruption> for FrameError {
    fn from(c: Corruption) -> Self {
        FrameError::Corrupt(c)
    }
}

/// The length of a frame around a body of `body_len` bytes.
pub(crate) fn framed_len(body_len: usize) -> usize {
    body_len.saturating_add(HEADER_LEN + CRC_LEN)
}

/// Appends one frame to a buffer: header, then the body written by the
/// caller, then the length and CRC on `finish`. Appending (rather than owning
/// a buffer) lets a batch write many frames into one output.
pub(crate) struct Writer<'v> {
    out: &'v mut Vec<u8>,
    start: usize,
}

impl<'v> Writer<'v> {
    pub(crate) fn new(out: &'v mut Vec<u8>, magic: [u8; 2], body_capacity: usize) -> Self {
        out.reserve(framed_len(body_capacity));
        let start = out.len();
        out.extend_from_slice(&magic);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&[0; 4]); // total length, patched by `finish`
        Writer { out, start }
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// A u16-length-prefixed string. Callers keep strings within their
    /// validated limits (at most 1024 bytes), so the length always fits.
    pub(crate) fn str(&mut self, s: &str) {
        self.out.extend_from_slice(&(s.len() as u16).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn finish(self) {
        let frame_len = self.out.len().saturating_sub(self.start);
        let total = frame_len.saturating_add(CRC_LEN) as u32;
        let len_at = self.start.saturating_add(3);
        if let Some(field) = self.out.get_mut(len_at..len_at.saturating_add(4)) {
            field.copy_from_slice(&total.to_le_bytes());
        }
        let crc = crc32c(self.out.get(self.start..).unwrap_or_default());
        self.out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// Verify a frame and return its body; see the module docs for the order.
pub(crate) fn open(bytes: &[u8], magic: [u8; 2]) -> Result<&[u8], FrameError> {
    if bytes.len() < HEADER_LEN.saturating_add(CRC_LEN) {
        return Err(Corruption::Truncated.into());
    }
    let mut header = Reader(bytes);
    let found_magic = header.take(2)?;
    let format = header.u8()?;
    let length = header.u32()?;
    if usize::try_from(length).ok() != Some(bytes.len()) {
        return Err(Corruption::LengthMismatch.into());
    }
    let split = bytes.len().saturating_sub(CRC_LEN);
    let (covered, stored_crc) = bytes.split_at_checked(split).ok_or(Corruption::Truncated)?;
    if stored_crc != crc32c(covered).to_le_bytes() {
        return Err(Corruption::ChecksumMismatch.into());
    }
    if found_magic != magic {
        return Err(Corruption::Malformed.into());
    }
    if format > FORMAT_VERSION {
        return Err(FrameError::Unsupported(format));
    }
    if format != FORMAT_VERSION {
        return Err(Corruption::Malformed.into());
    }
    Ok(covered.get(HEADER_LEN..).unwrap_or_default())
}

/// A cursor that never panics: every read past the end is `Malformed`.
pub(crate) struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Corruption> {
        let (head, rest) = self.0.split_at_checked(n).ok_or(Corruption::Malformed)?;
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Corruption> {
        self.take(N)?.try_into().map_err(|_| Corruption::Malformed)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Corruption> {
        Ok(u8::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Corruption> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Corruption> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u16-length-prefixed UTF-8 string of `min..=max` bytes.
    pub(crate) fn str(&mut self, min: usize, max: usize) -> Result<&'a str, Corruption> {
        let len = usize::from(u16::from_le_bytes(self.array()?));
        if len < min || len > max {
            return Err(Corruption::Malformed);
        }
        core::str::from_utf8(self.take(len)?).map_err(|_| Corruption::Malformed)
    }

    /// Canonical encodings end exactly where their last field does.
    pub(crate) fn end(&self) -> Result<(), Corruption> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Corruption::Malformed)
        }
    }
}
