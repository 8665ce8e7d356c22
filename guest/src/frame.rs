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

/// Magic, format and total length, before the body.
pub(crate) const HEADER_LEN: usize = 2 + 1 + 4;
/// The CRC-32C after the body.
pub(crate) const CRC_LEN: usize = 4;

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

/// Verify a frame and return its body and its (verified) CRC-32C; see the
/// module docs for the order.
pub(crate) fn open(bytes: &[u8], magic: [u8; 2]) -> Result<(&[u8], u32), FrameError> {
    if bytes.len() < HEADER_LEN.saturating_add(CRC_LEN) {
        return Err(Corruption::Truncated.into());
    }
    let (Some((header, _)), Some((covered, stored_crc))) = (
        bytes.split_first_chunk::<HEADER_LEN>(),
        bytes.split_last_chunk::<CRC_LEN>(),
    ) else {
        return Err(Corruption::Truncated.into());
    };
    let length = u32::from_le_bytes([header[3], header[4], header[5], header[6]]);
    if usize::try_from(length).ok() != Some(bytes.len()) {
        return Err(Corruption::LengthMismatch.into());
    }
    let crc = crc32c(covered);
    if *stored_crc != crc.to_le_bytes() {
        return Err(Corruption::ChecksumMismatch.into());
    }
    if [header[0], header[1]] != magic {
        return Err(Corruption::Malformed.into());
    }
    let format = header[2];
    if format > FORMAT_VERSION {
        return Err(FrameError::Unsupported(format));
    }
    if format != FORMAT_VERSION {
        return Err(Corruption::Malformed.into());
    }
    Ok((covered.get(HEADER_LEN..).unwrap_or_default(), crc))
}

/// Whether two byte strings are equal, eight bytes at a time. `==` on slices
/// calls `memcmp`, which in the wasm build is a byte loop of ~20
/// instructions a byte; scopes and op-ids are compared on every check.
#[inline(never)]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |c: &[u8]| c.first_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w));
    match (a.last_chunk::<8>(), b.last_chunk::<8>()) {
        // Whole words, then the last eight bytes (overlapping the last word).
        (Some(a_last), Some(b_last)) => {
            a.chunks_exact(8)
                .zip(b.chunks_exact(8))
                .all(|(x, y)| word(x) == word(y))
                && a_last == b_last
        }
        _ => a.iter().zip(b).all(|(x, y)| x == y),
    }
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

    /// A u16-length-prefixed string of `min..=max` bytes, not yet checked
    /// to be UTF-8.
    pub(crate) fn bytes(&mut self, min: usize, max: usize) -> Result<&'a [u8], Corruption> {
        let len = usize::from(u16::from_le_bytes(self.array()?));
        if len < min || len > max {
            return Err(Corruption::Malformed);
        }
        self.take(len)
    }

    /// A u16-length-prefixed UTF-8 string of `min..=max` bytes.
    pub(crate) fn str(&mut self, min: usize, max: usize) -> Result<&'a str, Corruption> {
        core::str::from_utf8(self.bytes(min, max)?).map_err(|_| Corruption::Malformed)
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

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    /// `same` is `==`: every length, a difference at every position.
    #[test]
    fn same_is_equality() {
        let a: Vec<u8> = (0..40u8).collect();
        for len in 0..a.len() {
            let x = &a[..len];
            assert!(same(x, x));
            assert!(!same(x, &a[..len + 1]));
            for at in 0..len {
                let mut y = x.to_vec();
                y[at] ^= 0x80;
                assert!(!same(x, &y), "len {len}, at {at}");
            }
        }
    }
}
