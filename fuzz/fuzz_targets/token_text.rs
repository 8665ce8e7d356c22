//! `TokenText`, the one text form of a token (CLI, SQL, HTTP): parsing any
//! string never panics; every token prints to text that parses back to it;
//! any accepted text prints in canonical form, which parses to the same token
//! and prints the same again.
//!
//! Input: the text (any bytes; not UTF-8 is read lossily), and as a token
//! its first 24 bytes (authority, epoch, counter).
#![no_main]

use fencecheck::{Token, TokenText};
use fencecheck_fuzz::Src;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(TokenText(token)) = text.parse::<TokenText>() {
        let canonical = TokenText(token).to_string();
        let again = canonical.parse::<TokenText>();
        assert_eq!(again, Ok(TokenText(token)), "{text:?} -> {canonical:?}");
        // Canonical: no sign, no spaces, and the authority only when nonzero.
        assert!(
            canonical
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'.' || b == b':')
        );
        assert_eq!(canonical.contains(':'), token.authority != 0);
        // Longer than the canonical form only by leading zeros or "0:".
        assert!(text.len() >= canonical.len());
    }
    let mut src = Src(data);
    let token = Token::new(src.u64(), src.u64(), src.u64());
    let printed = TokenText(token).to_string();
    assert_eq!(
        printed.parse::<TokenText>(),
        Ok(TokenText(token)),
        "{printed:?}"
    );
});
