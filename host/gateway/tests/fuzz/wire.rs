//! Raw HTTP/1.1 for the fuzzer: the request's bytes exactly as generated,
//! then one response read as HTTP frames it (Content-Length, chunked, or
//! to the close; 1xx skipped), so a keep-alive connection can carry a
//! second request and a garbled answer is told apart from none.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use anyhow::Result;

/// How long the fuzzer waits for any answer: far above the gateway's own
/// header and body timeouts, so reaching it means the gateway hangs.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// One request as bytes, and what may happen to it.
pub struct Raw {
    /// The head (request line, headers, blank line) and what follows it.
    pub bytes: Vec<u8>,
    /// Where the head ends in `bytes`.
    pub head_len: usize,
    /// Why the server may close without an answer (the request is
    /// malformed, or its body is cut short and the client half-closes);
    /// `None`: an answer is owed.
    pub may_close: Option<&'static str>,
    /// Half-close after sending (a body cut short, a framing the server
    /// cannot finish): the server sees the end instead of waiting.
    pub half_close: bool,
    /// A HEAD request (its answer has no body).
    pub head_only: bool,
    /// After the answer, send a health check on the same connection if
    /// neither side asked to close (the request was framed exactly, so the
    /// connection must be usable or closed, never out of step).
    pub probe: bool,
    /// Whether the client sends `Expect: 100-continue` (then the body is
    /// sent whole, without looking for an early answer).
    pub expects: bool,
    /// A short description for findings.
    pub what: String,
    /// Its kind, for the coverage table.
    pub label: String,
}

/// A final response.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Names in lower case; values lossily decoded.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The server will close: it said so, or framed the body by the close.
    pub closes: bool,
}

impl Answer {
    /// A header's value (first of that name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The S3 error code or the problem document's title, if any.
    pub fn code(&self) -> Option<String> {
        let text = String::from_utf8_lossy(&self.body);
        if let Some(start) = text.find("<Code>") {
            let rest = &text[start + 6..];
            return rest.find("</Code>").map(|end| rest[..end].to_owned());
        }
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["title"].as_str().map(str::to_owned))
    }
}

/// What came back for one request.
#[derive(Debug)]
pub enum Got {
    Answer(Answer),
    /// The server closed before any byte of an answer.
    Closed,
    /// The connection was reset before any byte of an answer.
    Reset,
    /// Nothing within [`PATIENCE`].
    Silent,
    /// A well-formed head whose body ended early (the connection closed
    /// or was reset mid-answer).
    Truncated {
        status: u16,
        bytes: Vec<u8>,
        why: String,
    },
    /// Bytes that are not a complete HTTP response.
    Garbled {
        bytes: Vec<u8>,
        why: String,
    },
}

/// A connection: the stream and what was read but not used yet.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

enum Fill {
    Data,
    Eof,
    Reset,
    Timeout,
}

impl Conn {
    pub fn open(addr: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(PATIENCE))?;
        stream.set_write_timeout(Some(PATIENCE))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
            eof: false,
        })
    }

    /// Send `raw`: the head, then the body in pieces, stopping early if
    /// the server has already answered (or closed, or reset): a server that
    /// refuses early need not read the rest, and writing on would only
    /// turn its close into a reset that loses the answer. Returns whether
    /// every byte was written.
    pub fn send(&mut self, raw: &Raw) -> Result<bool> {
        let mut sent = 0;
        let mut whole = true;
        while sent < raw.bytes.len() {
            let end = if sent == 0 {
                raw.head_len.max(1).min(raw.bytes.len())
            } else {
                (sent + (64 << 10)).min(raw.bytes.len())
            };
            if let Err(e) = self.stream.write_all(&raw.bytes[sent..end]) {
                match e.kind() {
                    ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted => {
                        whole = false;
                        break;
                    }
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                        // The server neither reads nor answers.
                        whole = false;
                        break;
                    }
                    _ => return Err(e.into()),
                }
            }
            sent = end;
            if sent < raw.bytes.len() && !raw.expects && self.answered()? {
                whole = false;
                break;
            }
        }
        if raw.half_close {
            let _ = self.stream.shutdown(Shutdown::Write);
        }
        Ok(whole)
    }

    /// Whether the server has sent something (or closed) already.
    fn answered(&mut self) -> Result<bool> {
        self.stream.set_nonblocking(true)?;
        let mut byte = [0u8; 1];
        let seen = match self.stream.peek(&mut byte) {
            Ok(_) => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(_) => true,
        };
        self.stream.set_nonblocking(false)?;
        Ok(seen)
    }

    fn fill(&mut self) -> Fill {
        if self.eof {
            return Fill::Eof;
        }
        let mut chunk = [0u8; 64 << 10];
        match self.stream.read(&mut chunk) {
            Ok(0) => {
                self.eof = true;
                Fill::Eof
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Fill::Data
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Fill::Timeout
            }
            Err(_) => Fill::Reset,
        }
    }

    /// At least `n` bytes buffered; `Err` names what happened instead.
    fn need(&mut self, n: usize) -> Result<(), Fill> {
        while self.buf.len() < n {
            match self.fill() {
                Fill::Data => {}
                other => return Err(other),
            }
        }
        Ok(())
    }

    /// One CRLF-terminated line (without it) from the buffer's front.
    fn line(&mut self) -> Result<Vec<u8>, Fill> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            match self.fill() {
                Fill::Data => {}
                other => return Err(other),
            }
        }
    }

    /// The next final response.
    pub fn response(&mut self, head_only: bool) -> Got {
        let mut consumed: Vec<u8> = Vec::new();
        let garbled = |consumed: &[u8], buf: &[u8], why: &str| Got::Garbled {
            bytes: [consumed, buf].concat(),
            why: why.to_owned(),
        };
        loop {
            // The head.
            let end = loop {
                if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i;
                }
                match self.fill() {
                    Fill::Data => {}
                    Fill::Eof if self.buf.is_empty() && consumed.is_empty() => {
                        return Got::Closed;
                    }
                    Fill::Reset if self.buf.is_empty() && consumed.is_empty() => {
                        return Got::Reset;
                    }
                    Fill::Timeout if self.buf.is_empty() && consumed.is_empty() => {
                        return Got::Silent;
                    }
                    _ => return garbled(&consumed, &self.buf, "the head ended early"),
                }
            };
            let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
            let raw_head: Vec<u8> = self.buf.drain(..end + 4).collect();
            consumed.extend_from_slice(&raw_head);
            let mut lines = head.split("\r\n");
            let status_line = lines.next().unwrap_or("");
            let status = match status_line
                .strip_prefix("HTTP/1.1 ")
                .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
                .and_then(|rest| rest.get(..3))
                .and_then(|code| code.parse::<u16>().ok())
            {
                Some(s) => s,
                None => return garbled(&consumed, &self.buf, "no status line"),
            };
            let mut headers = Vec::new();
            for line in lines {
                match line.split_once(':') {
                    Some((n, v)) => {
                        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                    }
                    None => return garbled(&consumed, &self.buf, "a header line without a colon"),
                }
            }
            if (100..200).contains(&status) {
                continue;
            }
            let closes = headers
                .iter()
                .any(|(n, v)| n == "connection" && v.eq_ignore_ascii_case("close"));
            let chunked = headers.iter().any(|(n, v)| {
                n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked")
            });
            let length = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .map(|(_, v)| v.parse::<usize>());
            let mut answer = Answer {
                status,
                headers,
                body: Vec::new(),
                closes,
            };
            let truncated = |consumed: &[u8], buf: &[u8], why: &str| Got::Truncated {
                status,
                bytes: [consumed, buf].concat(),
                why: why.to_owned(),
            };
            if head_only || matches!(status, 204 | 304) {
                return Got::Answer(answer);
            }
            if chunked {
                loop {
                    let size_line = match self.line() {
                        Ok(l) => l,
                        Err(_) => {
                            return truncated(
                                &consumed,
                                &self.buf,
                                "a chunk size line ended early",
                            );
                        }
                    };
                    let text = String::from_utf8_lossy(&size_line);
                    let size = match usize::from_str_radix(
                        text.split(';').next().unwrap_or("").trim(),
                        16,
                    ) {
                        Ok(s) => s,
                        Err(_) => return garbled(&consumed, &self.buf, "a bad chunk size"),
                    };
                    if size == 0 {
                        // Trailers, then the blank line.
                        loop {
                            match self.line() {
                                Ok(l) if l.is_empty() => return Got::Answer(answer),
                                Ok(_) => {}
                                Err(_) => {
                                    return truncated(
                                        &consumed,
                                        &self.buf,
                                        "the last chunk ended early",
                                    );
                                }
                            }
                        }
                    }
                    if self.need(size + 2).is_err() {
                        return truncated(&consumed, &self.buf, "a chunk ended early");
                    }
                    answer.body.extend_from_slice(&self.buf[..size]);
                    if &self.buf[size..size + 2] != b"\r\n" {
                        return garbled(&consumed, &self.buf, "a chunk without its CRLF");
                    }
                    self.buf.drain(..size + 2);
                }
            }
            match length {
                Some(Ok(n)) => {
                    if self.need(n).is_err() {
                        return truncated(
                            &consumed,
                            &self.buf,
                            "the body is shorter than Content-Length",
                        );
                    }
                    answer.body = self.buf.drain(..n).collect();
                }
                Some(Err(_)) => return garbled(&consumed, &self.buf, "a bad Content-Length"),
                None => {
                    // Framed by the close.
                    loop {
                        match self.fill() {
                            Fill::Data => {}
                            Fill::Eof | Fill::Reset => break,
                            Fill::Timeout => {
                                return truncated(
                                    &consumed,
                                    &self.buf,
                                    "a close-framed body never ended",
                                );
                            }
                        }
                    }
                    answer.body = std::mem::take(&mut self.buf);
                    answer.closes = true;
                }
            }
            return Got::Answer(answer);
        }
    }

    /// Send `bytes` (a follow-up request on this connection); false if the
    /// server has closed it.
    pub fn send_more(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).is_ok()
    }
}
