//! `TokenText`, the one text form of a token (CLI, SQL, HTTP): parsing any
//! string never panics; every token prints to text that parses back to it;
//! any accepted text prints in canonical form, which parses to the same token
//! and prints the same again. The same for `SignedTokenText` (a token with
//! `~KEY-ID~LEASE~TAG`): accepted text prints to text that parses back to
//! the same token and signature, plain text means what `TokenText` says, and
//! every signed token made from the input round-trips.
//!
//! Input: the text (any bytes; not UTF-8 is read lossily), and as a token
//! its first 24 bytes (authority, epoch, counter), then a key id u32, a
//! lease id string and a tag (the rest).
#![no_main]

use fencecheck::{GrantSignature, SignedTokenText, Token, TokenText};
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
    if let Ok(signed) = text.parse::<SignedTokenText>() {
        let printed = signed.to_string();
        assert_eq!(
            printed.parse::<SignedTokenText>(),
            Ok(signed.clone()),
            "{text:?}"
        );
        if signed.signature.is_none() {
            assert_eq!(text.parse::<TokenText>().map(|t| t.0), Ok(signed.token));
        } else {
            assert!(text.contains('~') && text.parse::<TokenText>().is_err());
        }
    }
    let mut src = Src(data);
    let token = Token::new(src.u64(), src.u64(), src.u64());
    let printed = TokenText(token).to_string();
    assert_eq!(
        printed.parse::<TokenText>(),
        Ok(TokenText(token)),
        "{printed:?}"
    );
    let signed = SignedTokenText {
        token,
        signature: Some(GrantSignature {
            key_id: src.u32(),
            lease_id: src.string(),
            tag: src.0.to_vec(),
        }),
    };
    let printed = signed.to_string();
    assert_eq!(
        printed.parse::<SignedTokenText>(),
        Ok(signed),
        "{printed:?}"
    );
});
