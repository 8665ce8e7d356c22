//! The one text form of a token, used by the CLI, SQL functions and HTTP:
//! `EPOCH.COUNTER` (authority 0) or `AUTHORITY:EPOCH.COUNTER`, each part a
//! decimal u64 without sign, spaces or leading `+`.

use std::fmt;
use std::str::FromStr;

use crate::Token;

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
#[error("invalid token {text:?}: expected EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER (decimal u64)")]
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

#[cfg(test)]
mod tests {
    use super::*;

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
