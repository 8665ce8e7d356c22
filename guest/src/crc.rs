//! CRC-32C (Castagnoli), slicing-by-8 over tables built at compile time.
//!
//! Hand-written rather than taken from a crate to keep the component small
//! and import-free: 8 KiB of tables, eight bytes per step (the check's
//! hottest loop: it runs over the stored state and again over the new one).
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

/// CRC-32C of `data`.
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let lo = (word as u32) ^ crc;
        let hi = (word >> 32) as u32;
        crc = at(7, lo)
            ^ at(6, lo >> 8)
            ^ at(5, lo >> 16)
            ^ at(4, lo >> 24)
            ^ at(3, hi)
            ^ at(2, hi >> 8)
            ^ at(1, hi >> 16)
            ^ at(0, hi >> 24);
    }
    for &byte in chunks.remainder() {
        crc = at(0, crc ^ u32::from(byte)) ^ (crc >> 8);
    }
    !crc
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
}
