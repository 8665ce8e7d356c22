//! AWS Signature V4 for the fuzzer's raw S3 requests, written from AWS's
//! description (and canonicalized the way s3s checks it: the path decoded
//! then encoded again, the query decoded, sorted and encoded), so that a
//! request the fuzzer means to be valid passes the signature check and
//! reaches the operation. Also `aws-chunked` bodies (signed chunks, or
//! unsigned with a checksum trailer) and CRC-32 for their trailers.

use sha2::{Digest, Sha256};

/// The region every request is signed for.
pub const REGION: &str = "us-east-1";

/// Hex SHA-256 of the empty string (an empty chunk's hash).
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(data);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// CRC-32 (IEEE), for `x-amz-checksum-crc32`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// S3's URI encoding: unreserved bytes as they are, `/` kept unless
/// `encode_slash`, every other byte `%XX` (upper case).
pub fn uri_encode(input: &[u8], encode_slash: bool) -> String {
    let mut out = String::with_capacity(input.len());
    for &b in input {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'~' | b'.' => {
                out.push(char::from(b));
            }
            b'/' if !encode_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Percent-decoding; `plus`: `+` is a space (query strings).
fn percent_decode(input: &[u8], plus: bool) -> Vec<u8> {
    let digit = |c: u8| char::from(c).to_digit(16);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        let b = input[i];
        if b == b'%'
            && let (Some(h), Some(l)) = (
                input.get(i + 1).and_then(|c| digit(*c)),
                input.get(i + 2).and_then(|c| digit(*c)),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(if plus && b == b'+' { b' ' } else { b });
        i += 1;
    }
    out
}

/// The canonical URI s3s computes first: the path decoded (it must be
/// UTF-8), encoded again; the raw path if it does not decode.
fn canonical_uri(raw_path: &str) -> String {
    match String::from_utf8(percent_decode(raw_path.as_bytes(), false)) {
        Ok(decoded) => uri_encode(decoded.as_bytes(), false),
        Err(_) => raw_path.to_owned(),
    }
}

/// The canonical query: pairs decoded as a form (`+` a space), each name
/// and value encoded, ordered by name (stable).
fn canonical_query(raw_query: &str) -> String {
    let mut pairs: Vec<(String, String)> = raw_query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (n, v) = p.split_once('=').unwrap_or((p, ""));
            let enc = |s: &str| {
                let decoded = String::from_utf8_lossy(&percent_decode(s.as_bytes(), true))
                    .into_owned()
                    .into_bytes();
                uri_encode(&decoded, true)
            };
            (enc(n), enc(v))
        })
        .filter(|(n, _)| n != "X-Amz-Signature")
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
        .iter()
        .map(|(n, v)| format!("{n}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// Trimmed, inner whitespace collapsed (SigV4's header value form).
fn normalize(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A request's signing facts: its time, scope and credentials.
#[derive(Clone)]
pub struct Signer {
    pub access_key: String,
    pub secret: String,
    /// `YYYYMMDDTHHMMSSZ`.
    pub amz_date: String,
}

impl Signer {
    /// A signer at Unix time `unix` (seconds).
    pub fn at(access_key: &str, secret: &str, unix: i64) -> Self {
        Self {
            access_key: access_key.to_owned(),
            secret: secret.to_owned(),
            amz_date: amz_date(unix),
        }
    }

    fn date(&self) -> &str {
        self.amz_date.get(..8).unwrap_or("")
    }

    fn scope(&self) -> String {
        format!("{}/{REGION}/s3/aws4_request", self.date())
    }

    fn key(&self) -> [u8; 32] {
        let k = hmac(
            format!("AWS4{}", self.secret).as_bytes(),
            self.date().as_bytes(),
        );
        let k = hmac(&k, REGION.as_bytes());
        let k = hmac(&k, b"s3");
        hmac(&k, b"aws4_request")
    }

    fn signature(&self, string_to_sign: &str) -> String {
        hex(&hmac(&self.key(), string_to_sign.as_bytes()))
    }

    /// The `Authorization` value and the signature of a request: `headers`
    /// are (lower-case name, value), `signed` the names to sign (sorted by
    /// the caller or not: sorted here), `payload` the
    /// `x-amz-content-sha256` value.
    pub fn sign(
        &self,
        method: &str,
        raw_path: &str,
        raw_query: &str,
        headers: &[(String, String)],
        signed: &[&str],
        payload: &str,
    ) -> (String, String) {
        let mut names: Vec<&str> = signed.to_vec();
        names.sort_unstable();
        names.dedup();
        let mut canonical_headers = String::new();
        for name in &names {
            let values: Vec<String> = headers
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| normalize(v))
                .collect();
            canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
        }
        let signed_names = names.join(";");
        let canonical = format!(
            "{method}\n{}\n{}\n{canonical_headers}\n{signed_names}\n{payload}",
            canonical_uri(raw_path),
            canonical_query(raw_query),
        );
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{}\n{}\n{}",
            self.amz_date,
            self.scope(),
            sha256_hex(canonical.as_bytes())
        );
        let signature = self.signature(&to_sign);
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={signed_names}, Signature={signature}",
            self.access_key,
            self.scope()
        );
        (authorization, signature)
    }

    /// `data` as an `aws-chunked` body with chunk signatures chained from
    /// `seed` (the request's signature), chunks of `chunk` bytes.
    pub fn signed_chunks(&self, data: &[u8], chunk: usize, seed: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut previous = seed.to_owned();
        let mut pieces: Vec<&[u8]> = data.chunks(chunk.max(1)).collect();
        pieces.push(&[]);
        for piece in pieces {
            let hash = if piece.is_empty() {
                EMPTY_SHA256.to_owned()
            } else {
                sha256_hex(piece)
            };
            let to_sign = format!(
                "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{previous}\n{EMPTY_SHA256}\n{hash}",
                self.amz_date,
                self.scope()
            );
            let signature = self.signature(&to_sign);
            out.extend_from_slice(
                format!("{:x};chunk-signature={signature}\r\n", piece.len()).as_bytes(),
            );
            out.extend_from_slice(piece);
            out.extend_from_slice(b"\r\n");
            previous = signature;
        }
        out
    }
}

/// `data` as an unsigned `aws-chunked` body whose trailer is
/// `trailer_name:trailer_value`.
pub fn unsigned_chunks(data: &[u8], chunk: usize, trailer: (&str, &str)) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("0\r\n{}:{}\r\n\r\n", trailer.0, trailer.1).as_bytes());
    out
}

/// `YYYYMMDDTHHMMSSZ` of Unix time `unix` (UTC).
pub fn amz_date(unix: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(unix) {
        Ok(t) => format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => "19700101T000000Z".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{amz_date, crc32, hmac, uri_encode};

    /// The primitives agree with published vectors: RFC 4231 case 2 for
    /// HMAC-SHA256, the CRC-32 check value, AWS's date format.
    #[test]
    fn primitives() -> anyhow::Result<()> {
        let mac = hmac(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        anyhow::ensure!(
            hex == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            "{hex}"
        );
        anyhow::ensure!(crc32(b"123456789") == 0xcbf4_3926);
        anyhow::ensure!(amz_date(1_440_938_160) == "20150830T123600Z");
        anyhow::ensure!(uri_encode("a b/é".as_bytes(), false) == "a%20b/%C3%A9");
        Ok(())
    }
}
