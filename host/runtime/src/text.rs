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

use crate::{GrantKey, GrantSignature, Token};

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

/// A key set in text form, as configuration files, command lines and SQL
/// arguments give it: `KEY-ID:SECRET-HEX` entries separated by commas or
/// newlines; blank lines and lines starting with `#` are skipped.
///
/// Parsing also checks that the set is usable ([`crate::check_keys`]: at
/// least one key, 16 to 64 bytes each, no id twice), so a host refuses a
/// bad configuration when it reads it, not at its first write. `Display`
/// prints the secrets (it writes key files); [`GrantKey`]'s `Debug` does not.
///
/// ```
/// use fencecheck::KeysText;
/// let keys: KeysText = "3:000102030405060708090a0b0c0d0e0f, 4:ffffffffffffffffffffffffffffffff".parse()?;
/// assert_eq!(keys.0.len(), 2);
/// assert_eq!(keys.0[1].key_id, 4);
/// assert!("3:00".parse::<KeysText>().is_err()); // a 1-byte secret
/// # Ok::<(), fencecheck::KeysTextError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeysText(pub Vec<GrantKey>);

/// Text that is not a usable key set; the message never contains a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid key set: {reason}")]
pub struct KeysTextError {
    /// What is wrong: the entry's position and its form, or the key set's
    /// problem (`short-secret`, `duplicate-key-id`…).
    pub reason: String,
}

impl KeysText {
    /// The one key of a signing key file: an authority signs with exactly
    /// one key (resources may trust several).
    pub fn signing_key(self) -> Result<GrantKey, KeysTextError> {
        let count = self.0.len();
        let mut keys = self.0.into_iter();
        match (keys.next(), keys.next()) {
            (Some(key), None) => Ok(key),
            _ => Err(KeysTextError {
                reason: format!("{count} keys; an authority signs with one"),
            }),
        }
    }
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| char::from(b).to_digit(16);
    s.as_bytes()
        .chunks_exact(2)
        .map(|pair| match pair {
            [hi, lo] => Some(u8::try_from(digit(*hi)? * 16 + digit(*lo)?).ok()?),
            _ => None,
        })
        .collect()
}

impl FromStr for KeysText {
    type Err = KeysTextError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut keys = Vec::new();
        let entries = s
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .flat_map(|line| line.split(','))
            .map(str::trim)
            .filter(|entry| !entry.is_empty());
        for (n, entry) in entries.enumerate() {
            let refused = || KeysTextError {
                reason: format!("entry {} is not KEY-ID:SECRET-HEX", n + 1),
            };
            let (id, secret) = entry.split_once(':').ok_or_else(refused)?;
            let key_id = part(id)
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(refused)?;
            let secret = hex_bytes(secret).ok_or_else(refused)?;
            keys.push(GrantKey { key_id, secret });
        }
        crate::check_keys(&keys).map_err(|problem| KeysTextError {
            reason: problem.name().to_owned(),
        })?;
        Ok(Self(keys))
    }
}

impl fmt::Display for KeysText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, key) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:", key.key_id)?;
            for b in &key.secret {
                write!(f, "{b:02x}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key sets parse from commas or lines with comments, print back, and
    /// every malformed or unusable set is refused without naming a secret.
    #[test]
    fn keys_text() -> Result<(), KeysTextError> {
        let text = "# rotation\n3:00112233445566778899aabbccddeeff\n\n  4:FFEEDDCCBBAA99887766554433221100ffee ,5:000102030405060708090a0b0c0d0e0f\n";
        let keys: KeysText = text.parse()?;
        let ids: Vec<u32> = keys.0.iter().map(|k| k.key_id).collect();
        assert_eq!(ids, [3, 4, 5]);
        assert_eq!(keys.0[1].secret.len(), 18);
        assert_eq!(keys.to_string().parse::<KeysText>()?, keys);
        let sixteen = "00112233445566778899aabbccddeeff";
        for (bad, reason) in [
            ("", "no-keys"),
            ("# only a comment", "no-keys"),
            ("3:0011", "short-secret"),
            (&*format!("3:{}", "00".repeat(65)), "long-secret"),
            (&*format!("3:{sixteen},3:{sixteen}"), "duplicate-key-id"),
            (&*format!("x:{sixteen}"), "entry 1 is not KEY-ID:SECRET-HEX"),
            (
                &*format!("4294967296:{sixteen}"),
                "entry 1 is not KEY-ID:SECRET-HEX",
            ),
            (
                &*format!("3:{sixteen},4:{sixteen}0"),
                "entry 2 is not KEY-ID:SECRET-HEX",
            ),
            (
                &*format!("3:{sixteen},4-{sixteen}"),
                "entry 2 is not KEY-ID:SECRET-HEX",
            ),
            (
                &*format!("3:{}zz", &sixteen[2..]),
                "entry 1 is not KEY-ID:SECRET-HEX",
            ),
        ] {
            let err = bad.parse::<KeysText>().err();
            assert_eq!(err.map(|e| e.reason), Some(reason.to_owned()), "{bad:?}");
        }
        Ok(())
    }

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
