//! Decoding a provider's answer as it arrives: `text/event-stream` events
//! (OpenAI, Anthropic) and NDJSON lines (Ollama), each chunk awaited for at
//! most the idle timeout and never past the turn's deadline.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::ProviderError;

/// The waits of one stream for its next item: each ends after `idle` of
/// quiet, and none goes past `deadline`.
///
/// One timer serves every wait, and it is moved only when it fires
/// early. A timeout made per item took the runtime's timer lock twice
/// a token (armed at its first poll, taken out when dropped): a paced
/// stream's items each wait, so every one of them armed it.
/// Here the timer is armed at the end of the first wait; when it fires,
/// a wait that has since moved on sets it to its own end and goes on.
pub(super) struct Waits {
    idle: Duration,
    deadline: Instant,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Waits {
    pub(super) fn new(idle: Duration, deadline: Instant) -> Self {
        let first = deadline.min(Instant::now() + idle);
        Self {
            idle,
            deadline,
            timer: Box::pin(tokio::time::sleep_until(first)),
        }
    }

    /// Waits for the next item for at most `idle` from now.
    pub(super) async fn next<S: Stream + Unpin>(
        &mut self,
        stream: &mut S,
    ) -> Result<Option<S::Item>, ProviderError> {
        self.next_before(stream, Instant::now() + self.idle).await
    }

    /// Waits for the next item until `quiet_until` (the end of `idle`
    /// since the stream last said something).
    async fn next_before<S: Stream + Unpin>(
        &mut self,
        stream: &mut S,
        quiet_until: Instant,
    ) -> Result<Option<S::Item>, ProviderError> {
        let wait_until = self.deadline.min(quiet_until);
        if self.timer.deadline() > wait_until {
            // Not expected (a stream's waits only end later and later),
            // but a wait must never outlast its own end.
            self.timer.as_mut().reset(wait_until);
        }
        loop {
            tokio::select! {
                biased;
                item = stream.next() => return Ok(item),
                () = self.timer.as_mut() => {
                    if Instant::now() >= wait_until {
                        return Err(self.timed_out(wait_until));
                    }
                    // Fired at an earlier wait's end: this one ends later.
                    self.timer.as_mut().reset(wait_until);
                }
            }
        }
    }

    fn timed_out(&self, wait_until: Instant) -> ProviderError {
        if wait_until >= self.deadline {
            ProviderError::Timeout("the turn's deadline passed mid-stream".into())
        } else {
            ProviderError::Timeout(format!(
                "nothing from the provider for {} s",
                self.idle.as_secs_f64()
            ))
        }
    }
}

/// One server-sent event: its type (`message` when the stream names none)
/// and its `data:` lines joined by `\n`. `id:` and `retry:` are not used
/// by any adapter and are skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub event: String,
    pub data: String,
}

/// An incremental `text/event-stream` parser (the WHATWG rules: lines end
/// in CRLF, LF or CR; a blank line dispatches; `:` starts a comment; one
/// space after the field's colon is dropped; an event without data is
/// not dispatched; an unfinished event at the end is dropped).
///
/// Bytes are kept as they come and lines are read in place, so a chunk
/// costs one copy however many events it holds.
#[derive(Debug, Default)]
struct SseParser {
    buffer: Vec<u8>,
    /// Where the unread part of `buffer` begins.
    read: usize,
    /// Whether the first line (which may begin with a byte-order mark) was read.
    started: bool,
    event: String,
    data: String,
}

impl SseParser {
    fn feed(&mut self, chunk: &[u8]) {
        if self.read == self.buffer.len() {
            self.buffer.clear();
            self.read = 0;
        } else if self.read > 0 {
            self.buffer.drain(..self.read);
            self.read = 0;
        }
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete event in what was fed. `at_end`: no more bytes
    /// will come, so a final CR ends its line.
    fn next_event(&mut self, at_end: bool) -> Result<Option<SseEvent>, ProviderError> {
        while let Some(line_end) = self.buffer[self.read..]
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
        {
            let end = self.read + line_end;
            let next = match (self.buffer[end], self.buffer.get(end + 1)) {
                (b'\r', Some(b'\n')) => end + 2,
                // A CR at the end of what came so far may be half of a CRLF.
                (b'\r', None) if !at_end => return Ok(None),
                _ => end + 1,
            };
            let line = std::str::from_utf8(&self.buffer[self.read..end]).map_err(|_| {
                ProviderError::Protocol("malformed event stream: a line is not UTF-8".into())
            })?;
            let line = if self.started {
                line
            } else {
                self.started = true;
                line.strip_prefix('\u{feff}').unwrap_or(line)
            };
            let dispatched = if line.is_empty() {
                let event = std::mem::take(&mut self.event);
                let mut data = std::mem::take(&mut self.data);
                (!data.is_empty()).then(|| {
                    data.pop(); // the newline after the last data line
                    SseEvent {
                        event: if event.is_empty() {
                            "message".to_owned()
                        } else {
                            event
                        },
                        data,
                    }
                })
            } else {
                if !line.starts_with(':') {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "event" => value.clone_into(&mut self.event),
                        "data" => {
                            self.data.push_str(value);
                            self.data.push('\n');
                        }
                        _ => {}
                    }
                }
                None
            };
            self.read = next;
            if dispatched.is_some() {
                return Ok(dispatched);
            }
        }
        Ok(None)
    }
}

/// Server-sent events parsed from byte chunks, never past `deadline`. The
/// stream must dispatch an event within `idle` of the last one (of its
/// start): comments and blank lines keep a connection open but say
/// nothing, so they do not hold the idle timer off.
pub(crate) fn sse_events<S>(
    bytes: S,
    idle: Duration,
    deadline: Instant,
) -> impl Stream<Item = Result<SseEvent, ProviderError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, ProviderError>> + Send + 'static,
{
    let mut bytes = Box::pin(bytes);
    async_stream::stream! {
        let mut parser = SseParser::default();
        let mut waits = Waits::new(idle, deadline);
        let mut at_end = false;
        let mut quiet_until = Instant::now() + idle;
        loop {
            loop {
                match parser.next_event(at_end) {
                    Ok(Some(event)) => {
                        quiet_until = Instant::now() + idle;
                        yield Ok(event);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        yield Err(e);
                        return;
                    }
                }
            }
            if at_end {
                return;
            }
            match waits.next_before(&mut bytes, quiet_until).await {
                Err(e) => {
                    yield Err(e);
                    return;
                }
                Ok(Some(Ok(chunk))) => parser.feed(&chunk),
                Ok(Some(Err(e))) => {
                    yield Err(e);
                    return;
                }
                Ok(None) => at_end = true,
            }
        }
    }
}

/// Longest NDJSON line accepted.
const MAX_LINE_BYTES: usize = 1024 * 1024;

/// Newline-delimited JSON lines parsed from byte chunks (Ollama), each
/// awaited for at most `idle` and never past `deadline`. A last line
/// without its newline is still returned.
pub(crate) fn ndjson_lines<S>(
    bytes: S,
    idle: Duration,
    deadline: Instant,
) -> impl Stream<Item = Result<String, ProviderError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, ProviderError>> + Send + 'static,
{
    let mut bytes = Box::pin(bytes);
    async_stream::stream! {
        let mut buffer: Vec<u8> = Vec::new();
        let mut waits = Waits::new(idle, deadline);
        loop {
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                match String::from_utf8(line) {
                    Ok(line) if line.trim().is_empty() => {}
                    Ok(line) => yield Ok(line.trim_end().to_owned()),
                    Err(_) => {
                        yield Err(ProviderError::Protocol("a line is not UTF-8".into()));
                        return;
                    }
                }
            }
            if buffer.len() > MAX_LINE_BYTES {
                yield Err(ProviderError::Protocol("a line exceeds 1 MiB".into()));
                return;
            }
            match waits.next(&mut bytes).await {
                Err(e) => {
                    yield Err(e);
                    return;
                }
                Ok(Some(Ok(chunk))) => buffer.extend_from_slice(&chunk),
                Ok(Some(Err(e))) => {
                    yield Err(e);
                    return;
                }
                Ok(None) => {
                    let rest = String::from_utf8_lossy(&buffer).trim().to_owned();
                    if !rest.is_empty() {
                        yield Ok(rest);
                    }
                    return;
                }
            }
        }
    }
}

/// Every adapter's recorded streams, cut anywhere, parse as they do whole.
#[cfg(test)]
mod any_split {
    use std::time::Duration;

    use bytes::Bytes;
    use futures::StreamExt;
    use tokio::time::Instant;

    use super::{ndjson_lines, sse_events};
    use crate::providers::{
        ProviderError, ProviderEvent, anthropic, drain::Drains, ollama, openai,
    };

    type Chunks = futures::stream::Iter<std::vec::IntoIter<Result<Bytes, ProviderError>>>;
    type Parsed = futures::stream::LocalBoxStream<'static, Result<ProviderEvent, ProviderError>>;
    /// An adapter's framing and parser, over chunks, the idle timeout and
    /// the deadline.
    type Parse = fn(Chunks, Duration, Instant) -> Parsed;

    /// `body` cut at `cuts` (each taken modulo its length, so any value is a
    /// valid cut; a cut may fall inside a line, a field or a multi-byte
    /// UTF-8 character).
    fn split(body: &str, cuts: &[usize]) -> Vec<Result<Bytes, ProviderError>> {
        let bytes = body.as_bytes();
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut chunks = Vec::new();
        let mut start = 0;
        for cut in cuts.into_iter().chain(std::iter::once(bytes.len())) {
            chunks.push(Ok(Bytes::copy_from_slice(&bytes[start..cut])));
            start = cut;
        }
        chunks
    }

    /// Each adapter's framing and parser, with its recorded bodies.
    fn adapters() -> [(Parse, &'static str); 6] {
        fn openai(c: Chunks, idle: Duration, until: Instant) -> Parsed {
            openai::parse_stream(sse_events(c, idle, until), Drains::default()).boxed_local()
        }
        fn anthropic(c: Chunks, idle: Duration, until: Instant) -> Parsed {
            anthropic::parse_stream(sse_events(c, idle, until), Drains::default()).boxed_local()
        }
        fn ollama(c: Chunks, idle: Duration, until: Instant) -> Parsed {
            ollama::parse_stream(ndjson_lines(c, idle, until), Drains::default()).boxed_local()
        }
        [
            (openai, "openai/after_tool.sse"),
            (openai, "openai/multi_tool_interleaved.sse"),
            (anthropic, "anthropic/tool_use.sse"),
            (anthropic, "anthropic/thinking.sse"),
            (ollama, "ollama/text.ndjson"),
            (ollama, "ollama/tool_calls.ndjson"),
        ]
    }

    proptest::proptest! {
        #[test]
        fn any_split_of_a_stream_parses_the_same(
            cuts in proptest::collection::vec(0usize..100_000, 0..60)
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime");
            for (parse, fixture) in adapters() {
                let path = format!("{}/../../tests/fixtures/{fixture}", env!("CARGO_MANIFEST_DIR"));
                let body = &std::fs::read_to_string(path).expect("a recorded body");
                let run = |cuts: &[usize]| {
                    runtime.block_on(async {
                        let chunks = futures::stream::iter(split(body, cuts));
                        let minute = Duration::from_secs(60);
                        parse(chunks, minute, Instant::now() + minute).collect::<Vec<_>>().await
                    })
                };
                let whole = run(&[]);
                proptest::prop_assert!(!whole.is_empty() && whole.iter().all(Result::is_ok));
                proptest::prop_assert_eq!(run(&cuts), whole);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `chunks` as one stream (`at_end` after the last).
    fn parse(chunks: &[&[u8]]) -> Result<Vec<SseEvent>, ProviderError> {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for chunk in chunks {
            parser.feed(chunk);
            while let Some(event) = parser.next_event(false)? {
                events.push(event);
            }
        }
        while let Some(event) = parser.next_event(true)? {
            events.push(event);
        }
        Ok(events)
    }

    fn event(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn events_follow_the_event_stream_rules() {
        let body = "\u{feff}: a comment\r\nevent: ping\ndata: {\"a\":1}\n\n\
                    data:no space\ndata:  two spaces\n\n\
                    event: empty\n\n\
                    data\n\n\
                    id: 7\nretry: 10\nunknown: x\ndata: last\r\r\
                    data: unfinished";
        let expected = vec![
            event("ping", "{\"a\":1}"),
            event("message", "no space\n two spaces"),
            // `event:` alone dispatches nothing; a bare `data` line is empty data.
            event("message", ""),
            event("message", "last"),
        ];
        assert_eq!(parse(&[body.as_bytes()]).unwrap(), expected);
        // Cut anywhere, even inside a CRLF or a UTF-8 character: the same.
        let bytes = body.as_bytes();
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(parse(&[a, b]).unwrap(), expected, "cut at {cut}");
        }
        let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse(&one_by_one).unwrap(), expected);
    }

    #[test]
    fn a_cr_then_an_lf_in_the_next_chunk_is_one_line_end() {
        let events = parse(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]).unwrap();
        assert_eq!(events, vec![event("message", "a\nb")]);
        // At the end of the stream a lone CR ends its line.
        assert_eq!(
            parse(&[b"data: c\r\r"]).unwrap(),
            vec![event("message", "c")]
        );
    }

    /// `chunks` sent one by one, each after its delay.
    fn paced(
        chunks: Vec<(u64, &'static str)>,
    ) -> impl Stream<Item = Result<Bytes, ProviderError>> + Send + 'static {
        futures::stream::iter(chunks).then(|(after_ms, chunk)| async move {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            Ok(Bytes::from_static(chunk.as_bytes()))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn idle_means_no_event_so_comments_alone_do_not_keep_a_stream_alive() {
        let idle = Duration::from_secs(1);
        let deadline = Instant::now() + Duration::from_secs(60);
        // Events 0.6 s apart: never idle.
        let kept: Vec<_> = sse_events(
            paced(vec![
                (600, "data: a\n\n"),
                (600, "data: b\n\n"),
                (600, "data: c\n\n"),
            ]),
            idle,
            deadline,
        )
        .collect()
        .await;
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(kept.iter().all(Result::is_ok), "{kept:?}");
        // Keep-alive comments 0.6 s apart say nothing: 1 s after the last
        // event (here, the start) the stream is idle, bytes or not.
        let commented: Vec<_> = sse_events(
            paced(vec![
                (600, ":\n\n"),
                (600, ": ping\n\n"),
                (600, ":\n\n"),
                (600, "data: x\n\n"),
            ]),
            idle,
            deadline,
        )
        .collect()
        .await;
        assert!(
            matches!(commented.as_slice(), [Err(ProviderError::Timeout(m))] if m.contains("nothing from the provider for 1 s")),
            "{commented:?}"
        );
        // After an event, the same: its comments do not extend it.
        let after: Vec<_> = sse_events(
            paced(vec![
                (100, "data: a\n\n"),
                (600, ":\n\n"),
                (600, "data: b\n\n"),
            ]),
            idle,
            deadline,
        )
        .collect()
        .await;
        assert!(
            matches!(after.as_slice(), [Ok(_), Err(ProviderError::Timeout(_))]),
            "{after:?}"
        );
    }

    /// One timer serves a stream's waits: it fires at an earlier wait's
    /// end and is moved on, so a stream that keeps talking is never
    /// idle, and the turn's deadline still ends it wherever it falls.
    #[tokio::test(start_paused = true)]
    async fn a_streams_waits_share_one_timer_that_still_ends_at_the_deadline() {
        let idle = Duration::from_secs(1);
        let start = Instant::now();
        let chunks = || {
            paced(vec![
                (600, "data: a\n\n"),
                (900, "data: b\n\n"),
                (900, "data: c\n\n"),
                (900, "data: d\n\n"),
            ])
        };
        let whole: Vec<_> = sse_events(chunks(), idle, start + Duration::from_secs(60))
            .collect()
            .await;
        assert_eq!(whole.len(), 4, "{whole:?}");
        assert!(whole.iter().all(Result::is_ok), "{whole:?}");
        assert_eq!(Instant::now() - start, Duration::from_millis(3_300));
        // A deadline between c and d: three events, then the deadline's
        // error at the deadline itself.
        let start = Instant::now();
        let cut: Vec<_> = sse_events(chunks(), idle, start + Duration::from_millis(2_700))
            .collect()
            .await;
        assert!(
            matches!(cut.as_slice(), [Ok(_), Ok(_), Ok(_), Err(ProviderError::Timeout(m))] if m.contains("deadline")),
            "{cut:?}"
        );
        assert_eq!(Instant::now() - start, Duration::from_millis(2_700));
        // NDJSON lines: the same timer, the idle error 1 s after the last.
        let start = Instant::now();
        let lines: Vec<_> = ndjson_lines(
            paced(vec![(600, "{}\n"), (900, "{}\n"), (1_100, "{}\n")]),
            idle,
            start + Duration::from_secs(60),
        )
        .collect()
        .await;
        assert!(
            matches!(lines.as_slice(), [Ok(_), Ok(_), Err(ProviderError::Timeout(m))] if m.contains("for 1 s")),
            "{lines:?}"
        );
        assert_eq!(Instant::now() - start, Duration::from_millis(2_500));
    }

    #[test]
    fn a_line_that_is_not_utf8_is_a_protocol_error() {
        let error = parse(&[b"data: \xff\xfe\n\n"]).unwrap_err();
        assert!(
            matches!(&error, ProviderError::Protocol(m) if m.contains("not UTF-8")),
            "{error:?}"
        );
    }
}
