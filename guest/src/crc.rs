//! CRC-32C (Castagnoli), byte at a time from a 1 KiB table built at compile
//! time. States are small (tens of bytes to a few KiB), so the 16 KiB
//! slicing tables of general-purpose crates would cost component size for no
//! measurable gain. CRC-32C detects every single-bit flip and every burst of
//! up to 32 bits; truncation and trailing bytes are caught by the length field.

const POLY: u32 = 0x82F6_3B78;

// Evaluated at compile time, where an out-of-bounds index is a build error.
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0usize;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32C of `data`.
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        // `& 0xff` keeps the index inside the 256-entry table.
        #[allow(clippy::indexing_slicing)]
        let entry = TABLE[((crc ^ u32::from(byte)) & 0xff) as usize];
        crc = entry ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects, clippy::panic)]
mod tests {
    use super::crc32c;

    /// The standard check value of CRC-32C (RFC 3720, appendix B.4).
    #[test]
    fn matches_the_published_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }
}
