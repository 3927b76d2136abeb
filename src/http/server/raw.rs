//! A connection's bytes, below hyper: what the service must know of them
//! that hyper's parsed request no longer says, and the answers hyper
//! writes on its own.
//!
//! - [`TrackedIo`] reports each read to the connection's [`Activity`] (the
//!   head timer's input) and runs the [`FramingScanner`] over it.
//! - A request head with both `Content-Length` and `Transfer-Encoding` is a
//!   smuggling attempt behind a gateway that reads the other one (RFC 9112
//!   §6.1). Hyper drops the `Content-Length` and reads the chunks, so the
//!   parsed request looks like any chunked one: the scanner sees the head
//!   as sent, and the service refuses the request.
//! - Hyper answers a head it cannot parse (too large, malformed) itself,
//!   with a bare status line and no body. [`bare_error_replacement`] turns
//!   such an answer into the service's problem document as it is written,
//!   only while no request of the connection is in flight (hyper answers
//!   so for requests that never reached the service; bytes of a response
//!   the service is sending are never looked at).

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};

use axum::body::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::slots::Slot;
use crate::{
    http::{
        conn_timer::Activity,
        limits::{MAX_HEADER_BYTES, MAX_URI_BYTES},
    },
    protocols::error::ApiError,
};

/// Header names (lowercase, with their colon) that frame a request body.
const CONTENT_LENGTH: &[u8] = b"content-length:";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding:";

/// Finds header blocks that carry both `Content-Length` and
/// `Transfer-Encoding`, one byte at a time, across reads.
///
/// It does not know where bodies end: a block is what lies between two
/// empty lines, so a body travels in the block of the head after it. A
/// JSON body has no line that starts with a header name, and a finding
/// only matters for a request whose parsed head is chunked (see
/// [`Framing::refuses`]), so a body cannot make a plain request refused.
#[derive(Debug)]
pub struct FramingScanner {
    /// Bytes of the current line so far, `\r` left out.
    line_len: usize,
    /// The current line may still be `Content-Length:` / `Transfer-Encoding:`.
    may_be_cl: bool,
    may_be_te: bool,
    /// Seen in the current block.
    saw_cl: bool,
    saw_te: bool,
    /// Set for good once a block had both.
    both: Arc<AtomicBool>,
}

impl FramingScanner {
    pub fn new(both: Arc<AtomicBool>) -> Self {
        Self {
            line_len: 0,
            may_be_cl: true,
            may_be_te: true,
            saw_cl: false,
            saw_te: false,
            both,
        }
    }

    pub fn scan(&mut self, bytes: &[u8]) {
        for &b in bytes {
            match b {
                b'\n' => {
                    if self.line_len == 0 {
                        if self.saw_cl && self.saw_te {
                            self.both.store(true, Ordering::Release);
                        }
                        self.saw_cl = false;
                        self.saw_te = false;
                    }
                    self.line_len = 0;
                    self.may_be_cl = true;
                    self.may_be_te = true;
                }
                b'\r' => {}
                _ => {
                    let at = self.line_len;
                    let lower = b.to_ascii_lowercase();
                    self.may_be_cl &= CONTENT_LENGTH.get(at) == Some(&lower);
                    self.may_be_te &= TRANSFER_ENCODING.get(at) == Some(&lower);
                    self.saw_cl |= self.may_be_cl && at + 1 == CONTENT_LENGTH.len();
                    self.saw_te |= self.may_be_te && at + 1 == TRANSFER_ENCODING.len();
                    self.line_len += 1;
                }
            }
        }
    }
}

/// What the scanner found on one connection, for its requests.
#[derive(Debug, Clone, Default)]
pub struct Framing(Arc<AtomicBool>);

impl Framing {
    /// Whether to refuse a request whose parsed head is chunked: a head on
    /// this connection framed its body both ways. Hyper closes such a
    /// connection after its answer, so no later request shares it.
    pub fn refuses(&self, chunked: bool) -> bool {
        chunked && self.0.load(Ordering::Acquire)
    }

    pub fn scanner(&self) -> FramingScanner {
        FramingScanner::new(self.0.clone())
    }
}

/// The service's answer in place of a bare one hyper wrote for a head it
/// could not parse: `None` when `written` does not start such an answer
/// (everything the service answers has a content type).
pub fn bare_error_replacement(written: &[u8]) -> Option<Bytes> {
    let error = match written.get(..13)? {
        b"HTTP/1.1 400 " | b"HTTP/1.0 400 " => {
            ApiError::MalformedRequest("the request is not valid HTTP/1.1".into())
        }
        b"HTTP/1.1 414 " | b"HTTP/1.0 414 " => ApiError::UriTooLong(MAX_URI_BYTES),
        b"HTTP/1.1 431 " | b"HTTP/1.0 431 " => ApiError::HeadersTooLarge(MAX_HEADER_BYTES),
        _ => return None,
    };
    let end = written.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = written[..end].to_ascii_lowercase();
    if head.windows(13).any(|w| w == b"content-type:") {
        return None;
    }
    let status = error.status();
    let body = serde_json::to_vec(&error.to_problem()).unwrap_or_default();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/problem+json\r\n\
         x-content-type-options: nosniff\r\ncache-control: no-store\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error"),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    Some(Bytes::from(answer))
}

/// A connection's stream: reports reads to its [`Activity`], scans them
/// for double framing, and writes the service's answer in place of
/// hyper's bare ones.
#[derive(Debug)]
pub struct TrackedIo<T> {
    inner: T,
    activity: Arc<Activity>,
    slot: Arc<Slot>,
    scanner: FramingScanner,
    /// A replacement answer and how much of it is written.
    replacing: Option<(Bytes, usize)>,
}

impl<T> TrackedIo<T> {
    pub fn new(inner: T, activity: Arc<Activity>, slot: Arc<Slot>, framing: &Framing) -> Self {
        Self {
            inner,
            activity,
            slot,
            scanner: framing.scanner(),
            replacing: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> TrackedIo<T> {
    /// Writes what is left of a replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some((answer, written)) = &mut self.replacing {
            if *written == answer.len() {
                self.replacing = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &answer[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `buf` as written when it is a bare error answer to replace.
    fn replaced(&mut self, buf: &[u8]) -> bool {
        // Most writes are a body's chunks: no lock for those.
        if !buf.starts_with(b"HTTP/1.") || self.slot.has_request_in_flight() {
            return false;
        }
        match bare_error_replacement(buf) {
            Some(answer) => {
                self.replacing = Some((answer, 0));
                true
            }
            None => false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TrackedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.note_read();
            let this = &mut *self;
            this.scanner.scan(&buf.filled()[before..]);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TrackedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        ready!(self.poll_replacement(cx))?;
        // Taken as written at once (a retry of the same bytes would
        // replace them twice); the replacement goes out on the next flush.
        if self.replaced(buf) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.poll_replacement(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.poll_replacement(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        ready!(self.poll_replacement(cx))?;
        // Hyper writes a head as the first slice of its own.
        if let Some(first) = bufs.first()
            && self.replaced(first)
        {
            return Poll::Ready(Ok(first.len()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> bool {
        let framing = Framing::default();
        let mut scanner = framing.scanner();
        for chunk in chunks {
            scanner.scan(chunk);
        }
        framing.refuses(true)
    }

    #[test]
    fn a_head_framed_both_ways_is_found_whatever_the_case_order_and_split() {
        let head: &[u8] = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\ncontent-LENGTH: 5\r\n\r\n0\r\n\r\n";
        assert!(scan(&[head]));
        for at in 1..head.len() {
            assert!(scan(&[&head[..at], &head[at..]]), "split at {at}");
        }
        assert!(scan(&[
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
    }

    #[test]
    fn heads_framed_one_way_are_not_found() {
        assert!(!scan(&[
            b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            b"POST /y HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            b"GET /z HTTP/1.1\r\nX-Content-Length: 1\r\nX-Transfer-Encoding: chunked\r\n\r\n",
        ]));
        // Found, but only a chunked request is refused for it.
        let framing = Framing::default();
        framing
            .scanner()
            .scan(b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(!framing.refuses(false));
    }

    #[test]
    fn hypers_bare_answers_become_problem_documents() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Tue, 24 Nov 2026 13:59:18 GMT\r\n\r\n";
        let answer = bare_error_replacement(bare).unwrap();
        let answer = std::str::from_utf8(&answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "));
        assert!(head.contains("content-type: application/problem+json"));
        assert!(head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["code"], "headers_too_large");
        let bare_400 =
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert!(bare_error_replacement(bare_400).is_some());
    }

    #[test]
    fn the_services_own_answers_are_left_alone() {
        for written in [
            &b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/problem+json\r\ncontent-length: 2\r\n\r\n{}"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\r\n",
            b"{\"a\":1}",
        ] {
            assert!(bare_error_replacement(written).is_none());
        }
    }
}
