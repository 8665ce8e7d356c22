//! CRC-32C (Castagnoli), slicing-by-8 over tables built at compile time.
//!
//! Hand-written rather than taken from a crate to keep the component small
//! and import-free: 8 KiB of tables, eight bytes per step (the check's
//! hottest loop: it verifies every stored state). A new state that differs
//! from the stored one only in fixed-width fields gets its CRC by `patch`
//! (CRC-32C is affine), at a fraction of a second pass over its bytes.
//! CRC-32C detects every single-bit flip and every burst of up to 32 bits;
//! truncation and trailing bytes are caught by the state's length field.

const POLY: u32 = 0x82F6_3B78;

// Evaluated at compile time, where an out-of-bounds index is a build error.
// A `static`, not a `const`: lookups must read one table, never a copy.
// TABLES[0] is the classic byte table; TABLES[k][b] is the CRC of byte `b`
// followed by `k` zero bytes.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
static TABLES: [[u32; 256]; 8] = {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0usize;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        tables[0][i] = c;
        i += 1;
    }
    let mut t = 1usize;
    while t < 8 {
        let mut i = 0usize;
        while i < 256 {
            let prev = tables[t - 1][i];
            tables[t][i] = (prev >> 8) ^ tables[0][(prev & 0xff) as usize];
            i += 1;
        }
        t += 1;
    }
    tables
};

/// Table lookup; `& 0xff` keeps every index inside the 256-entry tables.
#[inline(always)]
fn at(table: usize, index: u32) -> u32 {
    TABLES
        .get(table)
        .and_then(|t| t.get((index & 0xff) as usize))
        .copied()
        .unwrap_or(0)
}

/// One slicing-by-8 step: eight message bytes (little-endian `word`)
/// through the register `crc`.
#[inline(always)]
fn step(crc: u32, word: u64) -> u32 {
    let lo = (word as u32) ^ crc;
    let hi = (word >> 32) as u32;
    at(7, lo)
        ^ at(6, lo >> 8)
        ^ at(5, lo >> 16)
        ^ at(4, lo >> 24)
        ^ at(3, hi)
        ^ at(2, hi >> 8)
        ^ at(1, hi >> 16)
        ^ at(0, hi >> 24)
}

/// `data` through the register `crc`, without CRC-32C's initial and final
/// inversions.
#[inline(always)]
fn update(mut crc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let Some(&[b0, b1, b2, b3, b4, b5, b6, b7]) = chunk.first_chunk::<8>() else {
            break;
        };
        // The register meets the first four bytes; the last four index
        // their tables as loaded (one byte load each, no shifts: in wasm,
        // 6 instructions a lookup instead of 8).
        let lo = crc ^ u32::from_le_bytes([b0, b1, b2, b3]);
        crc = at(7, lo)
            ^ at(6, lo >> 8)
            ^ at(5, lo >> 16)
            ^ at(4, lo >> 24)
            ^ at(3, u32::from(b4))
            ^ at(2, u32::from(b5))
            ^ at(1, u32::from(b6))
            ^ at(0, u32::from(b7));
    }
    let mut rest = chunks.remainder();
    if let Some((four, tail)) = rest.split_first_chunk::<4>() {
        // Slicing-by-4 over the first four bytes of the tail.
        let x = crc ^ u32::from_le_bytes(*four);
        crc = at(3, x) ^ at(2, x >> 8) ^ at(1, x >> 16) ^ at(0, x >> 24);
        rest = tail;
    }
    for &byte in rest {
        crc = at(0, crc ^ u32::from(byte)) ^ (crc >> 8);
    }
    crc
}

/// `count` zero bytes through the register `crc`: the same as `update` over
/// zeros, with half the table lookups (the zero bytes select entry 0 of their
/// tables, which is 0).
#[inline(always)]
fn zeros(mut crc: u32, mut count: usize) -> u32 {
    while count >= 8 {
        crc = at(7, crc) ^ at(6, crc >> 8) ^ at(5, crc >> 16) ^ at(4, crc >> 24);
        count = count.saturating_sub(8);
    }
    // `n` zero bytes in one step: register byte `i` is followed by
    // `n - 1 - i` more bytes, and bytes the step does not reach shift down.
    match count {
        0 => crc,
        1 => at(0, crc) ^ (crc >> 8),
        2 => at(1, crc) ^ at(0, crc >> 8) ^ (crc >> 16),
        3 => at(2, crc) ^ at(1, crc >> 8) ^ at(0, crc >> 16) ^ (crc >> 24),
        4 => at(3, crc) ^ at(2, crc >> 8) ^ at(1, crc >> 16) ^ at(0, crc >> 24),
        5 => at(4, crc) ^ at(3, crc >> 8) ^ at(2, crc >> 16) ^ at(1, crc >> 24),
        6 => at(5, crc) ^ at(4, crc >> 8) ^ at(3, crc >> 16) ^ at(2, crc >> 24),
        _ => at(6, crc) ^ at(5, crc >> 8) ^ at(4, crc >> 16) ^ at(3, crc >> 24),
    }
}

/// CRC-32C of `data`.
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    !update(!0, data)
}

/// The CRC-32C of a message of the same length as one whose CRC-32C is
/// `crc`, that differs from it only in the consecutive little-endian words
/// XORed into `delta`, followed by `tail` unchanged bytes.
///
/// CRC-32C is affine: for messages `a` and `b` of one length,
/// `crc(a) ^ crc(b)` is the register after `a ^ b` from zero with no
/// inversions, and the zero bytes before the first changed one leave a zero
/// register as it is. So the new CRC costs the changed words and a
/// zero-byte tail instead of a pass over the whole message.
#[inline]
pub(crate) fn patch(crc: u32, delta: [u64; 3], tail: usize) -> u32 {
    let mut reg = 0u32;
    for word in delta {
        reg = if word >> 32 == 0 {
            // The usual delta (a counter or a version that grew by one) has
            // zero upper bytes: their lookups select entry 0, which is 0.
            let lo = reg ^ (word as u32);
            if lo == 0 {
                0
            } else {
                at(7, lo) ^ at(6, lo >> 8) ^ at(5, lo >> 16) ^ at(4, lo >> 24)
            }
        } else {
            step(reg, word)
        };
    }
    crc ^ zeros(reg, tail)
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]
mod tests {
    use super::*;

    /// Bit-at-a-time CRC-32C, the definition the tables must agree with.
    fn bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// The standard check values of CRC-32C (RFC 3720, appendix B.4).
    #[test]
    fn matches_the_published_check_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
    }

    /// Slicing-by-8 agrees with the bitwise definition at every length and
    /// alignment of the tail.
    #[test]
    fn agrees_with_the_bitwise_definition() {
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in 0..data.len() {
            assert_eq!(crc32c(&data[..len]), bitwise(&data[..len]), "len {len}");
        }
    }

    /// `zeros` agrees with feeding zero bytes, at every count.
    #[test]
    fn zeros_agree_with_zero_bytes() {
        for count in 0..40 {
            for reg in [0u32, 1, 0x8000_0000, 0xDEAD_BEEF, !0] {
                assert_eq!(zeros(reg, count), update(reg, &vec![0u8; count]), "{count}");
            }
        }
    }

    /// A patched CRC is the CRC of the changed message.
    #[test]
    fn patch_agrees_with_a_fresh_crc() {
        let base: Vec<u8> = (0..120u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect();
        let deltas = [
            [0u64, 0, 1],
            [0, 7, 0x300],
            [1 << 63, 0, 5],
            [u64::MAX, 3, 0],
        ];
        for at in [0usize, 1, 15, 40] {
            for delta in deltas {
                let mut changed = base.clone();
                for (i, word) in delta.iter().enumerate() {
                    let field = &mut changed[at + 8 * i..at + 8 * i + 8];
                    let value = u64::from_le_bytes(field.try_into().unwrap_or_default()) ^ word;
                    field.copy_from_slice(&value.to_le_bytes());
                }
                let tail = base.len() - at - 24;
                assert_eq!(
                    patch(crc32c(&base), delta, tail),
                    crc32c(&changed),
                    "at {at}, {delta:?}"
                );
            }
        }
    }
}
