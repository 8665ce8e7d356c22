//! Authenticated tokens (docs/signed-tokens.md): the authority signs each
//! grant with HMAC-SHA256 over a canonical message, and a resource that opted
//! a scope in verifies it before anything else is read (rule 1b).
//!
//! The scheme is a property of the key configuration, never read from the
//! token, so there is no algorithm to confuse. Keys travel with each call:
//! the guest keeps no state, and rotating a key never rewrites a stored state.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::check::{RequestRef, Verdict, decide, validate};
use crate::types::{CheckError, Decision, MAX_SCOPE_BYTES, Request, Token};

/// Shortest secret accepted, in bytes (128 bits).
pub const MIN_SECRET_BYTES: usize = 16;
/// Longest secret accepted, in bytes: one SHA-256 block, so a key is never
/// hashed down first (HMAC's rule for longer keys).
pub const MAX_SECRET_BYTES: usize = 64;
/// Most keys one call may carry (rotation needs two; a few more cover
/// overlapping rotations).
pub const MAX_KEYS: usize = 16;
/// Longest lease id a signature may carry, as the lease authority's limit.
pub const MAX_SIGNED_LEASE_ID_BYTES: usize = 256;
/// The length of a tag: a full HMAC-SHA256 output, never truncated.
pub const TAG_BYTES: usize = 32;

/// Versions the message: a later scheme gets a new domain string, so a tag
/// can never be valid under two message formats.
const DOMAIN: &[u8] = b"fencecheck-grant-v1\0";

/// A key a host configured for a scope (or for every scope of an authority).
#[derive(Clone, PartialEq, Eq)]
pub struct GrantKey {
    /// Which of the authority's keys this is; carried by every signature it makes.
    pub key_id: u32,
    /// The shared secret: [`MIN_SECRET_BYTES`] to [`MAX_SECRET_BYTES`] bytes.
    pub secret: Vec<u8>,
}

/// Secrets never reach a log through `{:?}`.
impl core::fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GrantKey")
            .field("key_id", &self.key_id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The proof that a grant came from its authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantSignature {
    /// The key that made it.
    pub key_id: u32,
    /// The lease the grant was made to (1 to 256 bytes).
    pub lease_id: String,
    /// HMAC-SHA256 of the canonical grant message ([`TAG_BYTES`] bytes).
    pub tag: Vec<u8>,
}

/// Why a request on an opted-in scope was not authenticated. A MAC cannot
/// tell a forged tag from a tampered token or one replayed into another
/// scope: all three are [`AuthFailure::BadSignature`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthFailure {
    /// No signature was presented.
    Unsigned,
    /// The signature names a key id the host did not configure.
    UnknownKey,
    /// The signature's lease id or tag has the wrong length.
    MalformedSignature,
    /// The tag does not match the grant: forged, tampered or replayed.
    BadSignature,
}

/// Why a key set (or one signing key) is unusable: a host configuration
/// error, not the caller's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyProblem {
    /// No key at all: an opted-in scope needs at least one.
    NoKeys,
    /// More than [`MAX_KEYS`] keys.
    TooManyKeys,
    /// A secret shorter than [`MIN_SECRET_BYTES`].
    ShortSecret,
    /// A secret longer than [`MAX_SECRET_BYTES`].
    LongSecret,
    /// Two keys with one id.
    DuplicateKeyId,
}

/// Why `check-signed` could not decide. Nothing may change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignedCheckError {
    /// The request or the stored state, exactly as `check` reports it.
    Check(CheckError),
    /// The host's key set is unusable.
    InvalidKeys(KeyProblem),
    /// The token is not proven to come from its authority.
    Unauthenticated(AuthFailure),
}

/// Why a grant could not be signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignError {
    /// The scope is empty.
    EmptyScope,
    /// The scope is longer than [`MAX_SCOPE_BYTES`].
    ScopeTooLong,
    /// The token is `epoch = counter = 0`.
    MissingToken,
    /// The lease id is empty.
    EmptyLeaseId,
    /// The lease id is longer than [`MAX_SIGNED_LEASE_ID_BYTES`].
    LeaseIdTooLong,
    /// The signing key is unusable.
    InvalidKey(KeyProblem),
}

/// A key borrowed from a request or a packed batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyRef<'a> {
    pub id: u32,
    pub secret: &'a [u8],
}

/// A signature borrowed from a request or a packed batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SignatureRef<'a> {
    pub key_id: u32,
    pub lease_id: &'a [u8],
    pub tag: &'a [u8],
}

impl<'a> From<&'a GrantKey> for KeyRef<'a> {
    fn from(k: &'a GrantKey) -> Self {
        KeyRef {
            id: k.key_id,
            secret: &k.secret,
        }
    }
}

impl<'a> From<&'a GrantSignature> for SignatureRef<'a> {
    fn from(s: &'a GrantSignature) -> Self {
        SignatureRef {
            key_id: s.key_id,
            lease_id: s.lease_id.as_bytes(),
            tag: &s.tag,
        }
    }
}

/// Decide one request on a scope that requires signed tokens: the rules of
/// `check`, with authentication (rule 1b) between validating the request
/// and reading the state, so an unauthenticated caller learns nothing about
/// the scope and changes nothing.
///
/// The signature is the request's own ([`Request::signature`]).
pub fn check_signed(
    state: Option<&[u8]>,
    request: &Request,
    keys: &[GrantKey],
) -> Result<Decision, SignedCheckError> {
    let key_refs: Vec<KeyRef<'_>> = keys.iter().map(KeyRef::from).collect();
    let signature = request.signature.as_ref().map(SignatureRef::from);
    let request = RequestRef::from(request);
    authenticate(&request, signature, &key_refs)?;
    match decide(state, request).map_err(SignedCheckError::Check)? {
        Verdict::Applied { version, next } => Ok(Decision::Applied {
            version,
            highest: next.highest,
            state: next.encode(),
        }),
        Verdict::Decided(decision) => Ok(decision),
    }
}

/// Rules 1 and 1b: the request, the key set, then the signature.
pub(crate) fn authenticate(
    request: &RequestRef<'_>,
    signature: Option<SignatureRef<'_>>,
    keys: &[KeyRef<'_>],
) -> Result<(), SignedCheckError> {
    validate(request).map_err(|r| SignedCheckError::Check(CheckError::InvalidRequest(r)))?;
    validate_keys(keys).map_err(SignedCheckError::InvalidKeys)?;
    let failure = SignedCheckError::Unauthenticated;
    let signature = signature.ok_or(failure(AuthFailure::Unsigned))?;
    if signature.lease_id.is_empty()
        || signature.lease_id.len() > MAX_SIGNED_LEASE_ID_BYTES
        || signature.tag.len() != TAG_BYTES
    {
        return Err(failure(AuthFailure::MalformedSignature));
    }
    let key = keys
        .iter()
        .find(|k| k.id == signature.key_id)
        .ok_or(failure(AuthFailure::UnknownKey))?;
    let mac = grant_mac(key, request.scope, request.token, signature.lease_id);
    // Constant-time comparison: a mismatch's position is never revealed.
    mac.verify_slice(signature.tag)
        .map_err(|_| failure(AuthFailure::BadSignature))
}

/// Sign a grant: what the lease authority attaches to the token it issues
/// for `scope` (the lock's name) to `lease_id`.
pub fn sign(
    scope: &str,
    token: Token,
    lease_id: &str,
    key: &GrantKey,
) -> Result<GrantSignature, SignError> {
    if scope.is_empty() {
        return Err(SignError::EmptyScope);
    }
    if scope.len() > MAX_SCOPE_BYTES {
        return Err(SignError::ScopeTooLong);
    }
    if token.is_missing() {
        return Err(SignError::MissingToken);
    }
    if lease_id.is_empty() {
        return Err(SignError::EmptyLeaseId);
    }
    if lease_id.len() > MAX_SIGNED_LEASE_ID_BYTES {
        return Err(SignError::LeaseIdTooLong);
    }
    let key_ref = KeyRef::from(key);
    validate_keys(core::slice::from_ref(&key_ref)).map_err(SignError::InvalidKey)?;
    let tag = grant_mac(&key_ref, scope.as_bytes(), token, lease_id.as_bytes())
        .finalize()
        .into_bytes()
        .to_vec();
    Ok(GrantSignature {
        key_id: key.key_id,
        lease_id: lease_id.to_owned(),
        tag,
    })
}

/// The canonical grant message (little-endian throughout):
/// `"fencecheck-grant-v1\0" | u32 scope-len | scope | u64 authority |
/// u64 epoch | u64 counter | u32 key-id | u32 lease-len | lease-id`.
/// The key id is inside, so a tag cannot be relabelled to another key; the
/// lengths make the encoding unambiguous. For tools and foreign signers.
pub fn grant_message(scope: &str, token: Token, key_id: u32, lease_id: &str) -> Vec<u8> {
    let mut message = Vec::new();
    for part in message_parts(scope.as_bytes(), token, key_id, lease_id.as_bytes()) {
        message.extend_from_slice(part.as_ref());
    }
    message
}

/// The message's parts, fed to the MAC one by one (no copy of the message).
fn message_parts<'p>(
    scope: &'p [u8],
    token: Token,
    key_id: u32,
    lease_id: &'p [u8],
) -> [Part<'p>; 9] {
    [
        Part::Bytes(DOMAIN),
        Part::U32(len32(scope)),
        Part::Bytes(scope),
        Part::U64(token.authority.to_le_bytes()),
        Part::U64(token.epoch.to_le_bytes()),
        Part::U64(token.counter.to_le_bytes()),
        Part::U32(key_id.to_le_bytes()),
        Part::U32(len32(lease_id)),
        Part::Bytes(lease_id),
    ]
}

enum Part<'p> {
    Bytes(&'p [u8]),
    U32([u8; 4]),
    U64([u8; 8]),
}

impl AsRef<[u8]> for Part<'_> {
    fn as_ref(&self) -> &[u8] {
        match self {
            Part::Bytes(b) => b,
            Part::U32(b) => b,
            Part::U64(b) => b,
        }
    }
}

/// Callers bound every length far below `u32::MAX` (scopes and lease ids
/// are validated first); saturating keeps this total anyway.
fn len32(bytes: &[u8]) -> [u8; 4] {
    u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes()
}

fn grant_mac(key: &KeyRef<'_>, scope: &[u8], token: Token, lease_id: &[u8]) -> Hmac<Sha256> {
    // Any key length is accepted by HMAC (`InvalidLength` is never returned
    // for it); the fallback keeps this total without a panic and can only
    // produce a MAC no signer made.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key.secret) {
        Ok(mac) => mac,
        Err(_) => Hmac::<Sha256>::new(&Default::default()),
    };
    for part in message_parts(scope, token, key.id, lease_id) {
        mac.update(part.as_ref());
    }
    mac
}

/// Whether `keys` is a usable key set for a scope that requires signed
/// tokens: what `check-signed` refuses as `invalid-keys`, checked when a host
/// is configured rather than at its first write.
pub fn check_keys(keys: &[GrantKey]) -> Result<(), KeyProblem> {
    let refs: Vec<KeyRef<'_>> = keys.iter().map(KeyRef::from).collect();
    validate_keys(&refs)
}

pub(crate) fn validate_keys(keys: &[KeyRef<'_>]) -> Result<(), KeyProblem> {
    if keys.is_empty() {
        return Err(KeyProblem::NoKeys);
    }
    if keys.len() > MAX_KEYS {
        return Err(KeyProblem::TooManyKeys);
    }
    for (i, key) in keys.iter().enumerate() {
        if key.secret.len() < MIN_SECRET_BYTES {
            return Err(KeyProblem::ShortSecret);
        }
        if key.secret.len() > MAX_SECRET_BYTES {
            return Err(KeyProblem::LongSecret);
        }
        if keys
            .iter()
            .skip(i.saturating_add(1))
            .any(|k| k.id == key.id)
        {
            return Err(KeyProblem::DuplicateKeyId);
        }
    }
    Ok(())
}

impl AuthFailure {
    /// The case's kebab-case name, as in WIT (`bad-signature`…).
    pub const fn name(self) -> &'static str {
        match self {
            AuthFailure::Unsigned => "unsigned",
            AuthFailure::UnknownKey => "unknown-key",
            AuthFailure::MalformedSignature => "malformed-signature",
            AuthFailure::BadSignature => "bad-signature",
        }
    }
}

impl KeyProblem {
    /// The case's kebab-case name, as in WIT (`short-secret`…).
    pub const fn name(self) -> &'static str {
        match self {
            KeyProblem::NoKeys => "no-keys",
            KeyProblem::TooManyKeys => "too-many-keys",
            KeyProblem::ShortSecret => "short-secret",
            KeyProblem::LongSecret => "long-secret",
            KeyProblem::DuplicateKeyId => "duplicate-key-id",
        }
    }
}

impl SignError {
    /// The case's kebab-case name, as in WIT (`empty-lease-id`…).
    pub const fn name(self) -> &'static str {
        match self {
            SignError::EmptyScope => "empty-scope",
            SignError::ScopeTooLong => "scope-too-long",
            SignError::MissingToken => "missing-token",
            SignError::EmptyLeaseId => "empty-lease-id",
            SignError::LeaseIdTooLong => "lease-id-too-long",
            SignError::InvalidKey(_) => "invalid-key",
        }
    }
}

impl SignedCheckError {
    /// The error's kebab-case name, as in conformance vectors: a check
    /// error's own name, `invalid-keys` or `unauthenticated`.
    pub fn name(&self) -> &'static str {
        match self {
            SignedCheckError::Check(e) => e.name(),
            SignedCheckError::InvalidKeys(_) => "invalid-keys",
            SignedCheckError::Unauthenticated(_) => "unauthenticated",
        }
    }

    /// The sub-case: the check error's reason, the key problem or the
    /// authentication failure.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            SignedCheckError::Check(e) => e.reason(),
            SignedCheckError::InvalidKeys(p) => Some(p.name()),
            SignedCheckError::Unauthenticated(f) => Some(f.name()),
        }
    }
}

impl From<CheckError> for SignedCheckError {
    fn from(e: CheckError) -> Self {
        SignedCheckError::Check(e)
    }
}

impl core::fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl core::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// `name: detail`, as [`CheckError`]'s.
impl core::fmt::Display for SignedCheckError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SignedCheckError::Check(e) => e.fmt(f),
            SignedCheckError::InvalidKeys(p) => write!(f, "invalid-keys: {p}"),
            SignedCheckError::Unauthenticated(a) => write!(f, "unauthenticated: {a}"),
        }
    }
}

impl core::fmt::Display for SignError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SignError::InvalidKey(p) => write!(f, "invalid-key: {p}"),
            other => f.write_str(other.name()),
        }
    }
}

impl std::error::Error for SignedCheckError {}
impl std::error::Error for SignError {}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::types::Policy;

    fn key(id: u32) -> GrantKey {
        GrantKey {
            key_id: id,
            secret: vec![id as u8; 32],
        }
    }

    fn signed(scope: &str, token: Token, k: &GrantKey) -> GrantSignature {
        sign(scope, token, "lease-1", k).unwrap_or_else(|e| panic!("{e}"))
    }

    /// RFC 4231 test case 2 through the same MAC construction: the crate
    /// computes HMAC-SHA256, not something close to it.
    #[test]
    fn hmac_is_rfc_4231() {
        let mut mac = match Hmac::<Sha256>::new_from_slice(b"Jefe") {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        mac.update(b"what do ya want for nothing?");
        let tag = mac.finalize().into_bytes();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// The canonical message, byte for byte.
    #[test]
    fn message_layout() {
        let m = grant_message("ab", Token::new(1, 2, 3), 7, "L");
        let mut want = b"fencecheck-grant-v1\0".to_vec();
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"ab");
        for v in [1u64, 2, 3] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        want.extend_from_slice(&7u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(b"L");
        assert_eq!(m, want);
    }

    /// A signed grant is applied; every tampered part, another scope, an
    /// unknown key and no signature are refused before the state is read.
    #[test]
    fn verification() {
        let k3 = key(3);
        let t = Token::new(0, 1, 42);
        let request = Request::new("report/july", t, Policy::Strict);
        let sig = signed("report/july", t, &k3);
        let keys = [k3.clone()];
        assert!(matches!(
            check_signed(None, &request.clone().with_signature(sig.clone()), &keys),
            Ok(Decision::Applied { version: 1, .. })
        ));
        let bad = |r: &Request, s: Option<&GrantSignature>, keys: &[GrantKey]| {
            let mut r = r.clone();
            r.signature = s.cloned();
            check_signed(Some(b"garbage"), &r, keys)
        };
        let refused = SignedCheckError::Unauthenticated(AuthFailure::BadSignature);
        // Tampered counter, epoch and authority.
        for token in [
            Token::new(0, 1, 43),
            Token::new(0, 2, 42),
            Token::new(9, 1, 42),
        ] {
            let r = Request::new("report/july", token, Policy::Strict);
            assert_eq!(bad(&r, Some(&sig), &keys), Err(refused.clone()));
        }
        // Replayed into another scope.
        let other = Request::new("report/june", t, Policy::Strict);
        assert_eq!(bad(&other, Some(&sig), &keys), Err(refused.clone()));
        // Tampered lease id and tag; relabelled to another configured key.
        let mut s = sig.clone();
        s.lease_id = "lease-2".into();
        assert_eq!(bad(&request, Some(&s), &keys), Err(refused.clone()));
        let mut s = sig.clone();
        s.tag[31] ^= 1;
        assert_eq!(bad(&request, Some(&s), &keys), Err(refused.clone()));
        let mut s = sig.clone();
        s.key_id = 4;
        let both = [
            k3.clone(),
            GrantKey {
                key_id: 4,
                secret: k3.secret.clone(),
            },
        ];
        assert_eq!(bad(&request, Some(&s), &both), Err(refused));
        // Unknown key, unsigned, malformed.
        assert_eq!(
            bad(&request, Some(&sig), &[key(4)]),
            Err(SignedCheckError::Unauthenticated(AuthFailure::UnknownKey))
        );
        assert_eq!(
            bad(&request, None, &keys),
            Err(SignedCheckError::Unauthenticated(AuthFailure::Unsigned))
        );
        let mut s = sig.clone();
        s.tag.pop();
        assert_eq!(
            bad(&request, Some(&s), &keys),
            Err(SignedCheckError::Unauthenticated(
                AuthFailure::MalformedSignature
            ))
        );
        // An authenticated request on a garbage state is the state's error.
        assert_eq!(
            bad(&request, Some(&sig), &keys),
            Err(SignedCheckError::Check(CheckError::CorruptState(
                crate::types::Corruption::Truncated
            )))
        );
    }

    /// The lock-out attack of issue 13: unsigned, `u64::MAX` takes the scope
    /// for good; signed, the forger is refused and the honest writer goes on.
    #[test]
    fn forged_maximum_token_is_refused() {
        let k = key(1);
        let honest = Token::new(0, 1, 5);
        let forged = Request::new("s", Token::new(0, u64::MAX, u64::MAX), Policy::Strict);
        let honest_request = Request::new("s", honest, Policy::Strict);
        let sig = signed("s", honest, &k);

        let Ok(Decision::Applied { state, .. }) = crate::check(None, &forged) else {
            panic!("unsigned: the forger is applied")
        };
        assert!(matches!(
            crate::check(Some(&state), &honest_request),
            Ok(Decision::StaleFence { .. })
        ));

        let keys = [k];
        let fake = GrantSignature {
            key_id: 1,
            lease_id: "x".into(),
            tag: vec![0; TAG_BYTES],
        };
        assert_eq!(
            check_signed(None, &forged.clone().with_signature(fake), &keys),
            Err(SignedCheckError::Unauthenticated(AuthFailure::BadSignature))
        );
        assert!(matches!(
            check_signed(None, &honest_request.clone().with_signature(sig), &keys),
            Ok(Decision::Applied { .. })
        ));
    }

    /// Key sets and signing inputs are validated, in the documented order.
    #[test]
    fn key_and_sign_errors() {
        let r = Request::new("s", Token::new(0, 0, 1), Policy::Strict);
        let short = GrantKey {
            key_id: 1,
            secret: vec![0; 15],
        };
        let long = GrantKey {
            key_id: 1,
            secret: vec![0; 65],
        };
        let cases: [(&[GrantKey], KeyProblem); 4] = [
            (&[], KeyProblem::NoKeys),
            (core::slice::from_ref(&short), KeyProblem::ShortSecret),
            (core::slice::from_ref(&long), KeyProblem::LongSecret),
            (&[key(1), key(1)], KeyProblem::DuplicateKeyId),
        ];
        for (keys, problem) in cases {
            assert_eq!(
                check_signed(None, &r, keys),
                Err(SignedCheckError::InvalidKeys(problem))
            );
        }
        let many: Vec<GrantKey> = (0..17).map(key).collect();
        assert_eq!(
            check_signed(None, &r, &many),
            Err(SignedCheckError::InvalidKeys(KeyProblem::TooManyKeys))
        );
        // The request is validated first.
        let missing = Request::new("s", Token::new(0, 0, 0), Policy::Strict);
        assert_eq!(
            check_signed(None, &missing, &[]),
            Err(SignedCheckError::Check(CheckError::InvalidRequest(
                crate::types::InvalidReason::MissingToken
            )))
        );
        let t = Token::new(0, 0, 1);
        let k = key(1);
        assert_eq!(sign("", t, "l", &k), Err(SignError::EmptyScope));
        assert_eq!(
            sign(&"x".repeat(1025), t, "l", &k),
            Err(SignError::ScopeTooLong)
        );
        assert_eq!(
            sign("s", Token::default(), "l", &k),
            Err(SignError::MissingToken)
        );
        assert_eq!(sign("s", t, "", &k), Err(SignError::EmptyLeaseId));
        assert_eq!(
            sign("s", t, &"l".repeat(257), &k),
            Err(SignError::LeaseIdTooLong)
        );
        assert_eq!(
            sign("s", t, "l", &short),
            Err(SignError::InvalidKey(KeyProblem::ShortSecret))
        );
    }

    /// Secrets are not printed.
    #[test]
    fn debug_redacts_secrets() {
        assert!(!format!("{:?}", key(7)).contains("7, 7"));
    }
}
