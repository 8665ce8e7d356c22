//! The one text form of a token, used by the CLI, SQL functions and HTTP:
//! `EPOCH.COUNTER` (authority 0) or `AUTHORITY:EPOCH.COUNTER`, each part a
//! decimal u64 without sign, spaces or leading `+`; a signed token appends
//! `~KEY-ID~LEASE~TAG` (key id a decimal u32; lease id and tag base64url
//! without padding). `~` is outside the unsigned grammar and base64url,
//! unreserved in URLs and legal in HTTP header values.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::{GrantSignature, Token};

/// Parses and prints tokens in their canonical text form.
///
/// ```
/// use fencecheck::{Token, TokenText};
/// let t: Token = "7:2.41".parse::<TokenText>()?.0;
/// assert_eq!(t, Token::new(7, 2, 41));
/// assert_eq!(TokenText(Token::new(0, 0, 42)).to_string(), "0.42");
/// # Ok::<(), fencecheck::TokenTextError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenText(pub Token);

/// A string that is not a token in canonical text form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid token {text:?}: expected EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER (decimal u64), signed: TOKEN~KEY-ID~LEASE~TAG (base64url)"
)]
pub struct TokenTextError {
    /// The rejected text (truncated to 64 bytes).
    pub text: String,
}

fn part(s: &str) -> Option<u64> {
    // u64::from_str accepts a leading '+'; the canonical form does not.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl FromStr for TokenText {
    type Err = TokenTextError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = (|| {
            let (authority, rest) = match s.split_once(':') {
                Some((a, rest)) => (part(a)?, rest),
                None => (0, s),
            };
            let (epoch, counter) = rest.split_once('.')?;
            Some(Token::new(authority, part(epoch)?, part(counter)?))
        })();
        parsed.map(TokenText).ok_or_else(|| TokenTextError {
            text: s.chars().take(64).collect(),
        })
    }
}

impl fmt::Display for TokenText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.0;
        if t.authority != 0 {
            write!(f, "{}:", t.authority)?;
        }
        write!(f, "{}.{}", t.epoch, t.counter)
    }
}

/// A token with its signature, if any, in text form:
/// `TOKEN` or `TOKEN~KEY-ID~LEASE~TAG`.
///
/// Parsing checks the form only (canonical decimal and base64url): whether
/// the signature is valid, and whether the lease id and tag have usable
/// lengths, is the component's decision (`auth.check-signed`).
///
/// ```
/// use fencecheck::{GrantSignature, SignedTokenText, Token};
/// let signed = SignedTokenText {
///     token: Token::new(0, 2, 41),
///     signature: Some(GrantSignature { key_id: 3, lease_id: "L1".into(), tag: vec![0xff; 32] }),
/// };
/// let text = signed.to_string();
/// assert!(text.starts_with("2.41~3~TDE~__"));
/// assert_eq!(text.parse::<SignedTokenText>()?, signed);
/// assert_eq!("2.41".parse::<SignedTokenText>()?.signature, None);
/// # Ok::<(), fencecheck::TokenTextError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedTokenText {
    /// The token.
    pub token: Token,
    /// Its signature; `None` for plain token text.
    pub signature: Option<GrantSignature>,
}

/// Canonical base64url without padding: decoding refuses padding, other
/// alphabets and non-zero trailing bits, so each value has one spelling.
fn base64url(s: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(s).ok()
}

impl FromStr for SignedTokenText {
    type Err = TokenTextError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let refused = || TokenTextError {
            text: s.chars().take(64).collect(),
        };
        let Some((token, signature)) = s.split_once('~') else {
            return Ok(Self {
                token: s.parse::<TokenText>()?.0,
                signature: None,
            });
        };
        let token = token.parse::<TokenText>().map_err(|_| refused())?.0;
        let parts: Vec<&str> = signature.split('~').collect();
        let [key_id, lease, tag] = parts.as_slice() else {
            return Err(refused());
        };
        let key_id = part(key_id)
            .and_then(|k| u32::try_from(k).ok())
            .ok_or_else(refused)?;
        let lease_id = base64url(lease)
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(refused)?;
        let tag = base64url(tag).ok_or_else(refused)?;
        Ok(Self {
            token,
            signature: Some(GrantSignature {
                key_id,
                lease_id,
                tag,
            }),
        })
    }
}

impl fmt::Display for SignedTokenText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", TokenText(self.token))?;
        if let Some(s) = &self.signature {
            write!(
                f,
                "~{}~{}~{}",
                s.key_id,
                URL_SAFE_NO_PAD.encode(s.lease_id.as_bytes()),
                URL_SAFE_NO_PAD.encode(&s.tag)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signed text round-trips; every departure from the form is refused.
    #[test]
    fn signed_text() -> Result<(), TokenTextError> {
        let signed = SignedTokenText {
            token: Token::new(7, 2, 41),
            signature: Some(GrantSignature {
                key_id: u32::MAX,
                lease_id: "lease-7f3a9c2e-0001".into(),
                tag: (0..32).collect(),
            }),
        };
        let text = signed.to_string();
        assert_eq!(text.parse::<SignedTokenText>()?, signed);
        assert_eq!(
            "7:2.41".parse::<SignedTokenText>()?,
            SignedTokenText {
                token: Token::new(7, 2, 41),
                signature: None
            }
        );
        for bad in [
            "2.41~",
            "2.41~3~TDE",
            "2.41~3~TDE~AA~x",
            "2.41~4294967296~TDE~AA",
            "2.41~+3~TDE~AA",
            "2.41~3~TDE=~AA",
            "2.41~3~TD+~AA",
            "2.41~3~TDF~AA",
            "2.41~3~_w~AA",
            "x~3~TDE~AA",
            "~3~TDE~AA",
        ] {
            assert!(bad.parse::<SignedTokenText>().is_err(), "{bad:?} accepted");
        }
        Ok(())
    }

    /// Accepts the full u64 range and round-trips through Display.
    #[test]
    fn round_trips_full_range() -> Result<(), TokenTextError> {
        let max = u64::MAX;
        let text = format!("{max}:{max}.{max}");
        let t: TokenText = text.parse()?;
        assert_eq!(t.0, Token::new(max, max, max));
        assert_eq!(t.to_string(), text);
        Ok(())
    }

    /// Everything outside the grammar is refused.
    #[test]
    fn rejects_non_canonical_text() {
        for bad in [
            "",
            "41",
            ".41",
            "0.",
            "+0.41",
            "0.-1",
            "0 .41",
            "0.41 ",
            "1:2:0.3",
            "0.1.2",
            "18446744073709551616.0",
            "a.b",
            "0x1.2",
            ":0.1",
        ] {
            assert!(bad.parse::<TokenText>().is_err(), "{bad:?} accepted");
        }
    }
}
