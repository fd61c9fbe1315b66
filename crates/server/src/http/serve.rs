//! Serving a router over HTTP/1 so that slow or greedy clients cannot hold
//! the server: what `axum::serve` does, plus the limits it leaves out.
//!
//! `axum::serve` sets no timer on hyper's connection builder, so hyper's
//! header-read timeout never runs: a client that trickles its request head,
//! or opens a connection and says nothing, keeps it (and a file descriptor)
//! forever; it takes any head up to hyper's 400 KiB read buffer; it accepts
//! every connection; and its graceful shutdown waits for every connection
//! to end on its own. [`serve`] builds each connection with hyper's own
//! [`http1::Builder`] instead:
//!
//! - **Header-read timeout** ([`EdgeSettings::header_read_timeout`]): the
//!   wait for a request head starts right after accept, and again once a
//!   keep-alive connection's response is handed to hyper whole (it may
//!   still be on its way to the client, which so has the timeout to read
//!   it and send its next head); a head not complete by then closes the
//!   connection without a response. It is not reset by each byte
//!   received, and it does not run while a request is being handled. So
//!   it is also the idle keep-alive timeout: there is no separate one.
//!   This is what hyper's own `header_read_timeout` does, but hyper 1.12
//!   (`poll_read_head` in `src/proto/h1/conn.rs`) allocates, registers
//!   and cancels a new timer for every request, a few percent of the
//!   no-database route's throughput (BENCHMARKS.md, "Over HTTP"). Here each
//!   connection has one timer, which only moves when it fires: the
//!   connection records when it started waiting (one clock read per
//!   response), and the timer, on firing, closes the connection or sets
//!   itself to the true deadline.
//! - **Head size** ([`EdgeSettings::max_header_bytes`]), hyper's
//!   `max_header_size`: a larger request line plus headers gets hyper's
//!   431 and the connection is closed. (`max_buf_size`, which the default
//!   of about 400 KiB came from, has a floor of 8 KiB and also bounds the
//!   write buffer; `max_header_size` bounds the head alone.)
//! - **Connection cap** ([`EdgeSettings::max_connections`], lowered to fit
//!   the open-files limit less a reserve): past it a new
//!   connection is accepted, sent a canned 503 if its socket takes it at
//!   once, and closed, so the accept loop never stalls and the backlog
//!   never fills with connections nobody will serve.
//! - **Accept errors**: a reset connection is skipped; anything else (such
//!   as `EMFILE` when out of file descriptors) is logged and accepting
//!   pauses briefly instead of spinning, as `axum::serve` does.
//! - **Graceful shutdown** within [`EdgeSettings::shutdown_grace`]: see
//!   [`serve`].
//! - **Every answer reaches its client.** A handler may answer before it
//!   has read the request body (401, 413, 503 on overload, 504). Hyper then
//!   reads only what it already buffered and closes the connection after
//!   the response (`poll_drain_or_close_read` in `src/proto/h1/conn.rs`);
//!   closing a socket with unread data in it makes the kernel send RST
//!   instead of FIN, and a client's kernel that receives RST throws away
//!   the response it had received but its application had not read yet.
//!   nginx and Apache avoid this with a lingering close; hyper leaves it to
//!   the application, so this module does two things:
//!   - after the handler answers, what is left of its request body is read
//!     and thrown away, up to [`EdgeSettings::drain_bytes`] within
//!     [`EdgeSettings::drain_time`], before the response goes out, so the
//!     connection stays open for the client's next request. Past either
//!     bound the response says `Connection: close`;
//!   - a connection that hyper ends is not just dropped: its write side is
//!     shut down (the client sees the whole response, then end of file),
//!     and whatever the client still sends is read and thrown away until it
//!     closes its side, goes quiet for half a second, or
//!     [`EdgeSettings::linger_time`] passes. Only then is the socket
//!     closed.
//!
//! Hyper answers a malformed or oversized head itself (400, 414 or 431)
//! with an empty body (`Server::on_error` in hyper's
//! `src/proto/h1/role.rs`); neither hyper nor hyper-util has a hook to
//! change those responses, so they do not carry the JSON error body of the
//! app's own errors. A connection past the header-read timeout is closed
//! without a response, as hyper's own timeout does. The 503 for a
//! connection over the cap is written here and does.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::header::CONNECTION;
use axum::http::HeaderValue;
use axum::Router;
use http_body_util::BodyExt as _;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinError, JoinSet};
use tower::ServiceExt as _;

pub use crate::settings::EdgeSettings;

/// How long a lingering close waits for the client to send more, or to
/// close, before closing anyway: a client still sending a body keeps it
/// open (up to [`EdgeSettings::linger_time`]), one that has read its
/// answer and sends nothing does not hold the socket (or a shutdown) for
/// long.
const LINGER_IDLE: Duration = Duration::from_millis(500);

/// Refused connections (over the cap) lingering at once; beyond these a
/// refused connection is closed at once, so refusals cannot hold an
/// unbounded number of sockets.
const MAX_LINGERING_REFUSALS: usize = 64;

/// How long accepting pauses after an accept error other than a reset
/// connection (typically `EMFILE`): long enough not to spin or flood the
/// log, short enough to resume soon after descriptors are freed.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(250);

/// At most one warning per this interval about refused connections, so a
/// flood of them does not flood the log.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// File descriptors kept for everything but client connections: the
/// database pools, the listener, logs, a cap refusal's own socket.
const RESERVED_FDS: u64 = 64;

/// `max_connections`, lowered to fit the process's open-files limit:
/// connections past that limit would make `accept` fail with `EMFILE` and
/// the server stop answering anyone, where refusing them with 503 keeps it
/// serving the connections it has.
fn within_open_files_limit(max_connections: usize) -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return max_connections;
    };
    let fit = usize::try_from(soft.saturating_sub(RESERVED_FDS).max(1)).unwrap_or(usize::MAX);
    if fit < max_connections {
        tracing::warn!(
            max_connections,
            open_files_limit = soft,
            using = fit,
            "the open-files limit is too low for the connection cap; lowering the cap"
        );
    }
    max_connections.min(fit)
}

/// Serves `router` on `listener` with the limits in `settings` until
/// `shutdown` completes, then shuts down gracefully.
///
/// On shutdown it stops accepting (the listener is closed), lets each
/// connection finish the request it is handling and the response it is
/// writing (with `Connection: close`), and closes at once every connection
/// with neither: idle keep-alive ones, silent ones, and ones in the middle
/// of sending a request head. Whatever is still open after
/// [`EdgeSettings::shutdown_grace`] is dropped, so this returns within
/// about that time.
///
/// # Errors
///
/// Only an invalid `settings`; accept errors are logged and retried.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: EdgeSettings,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    settings.validate()?;
    let max_connections = within_open_files_limit(settings.max_connections);
    let mut http = http1::Builder::new();
    // The header-read timeout is this module's (see its docs); `None`, not
    // hyper's default, which would want a timer.
    http.header_read_timeout(None)
        .max_header_size(settings.max_header_bytes);
    let overloaded = overloaded_response();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut refusals = Refusals::default();
    let lingering = Arc::new(AtomicUsize::new(0));
    let mut shutdown = pin!(shutdown);

    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(ended) = connections.join_next() => {
                log_panic(ended);
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::error!(error = %e, "accept failed; pausing before accepting again");
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                }
            }
        };
        // Ended connections not yet reaped by the branch above would
        // otherwise count against the cap.
        while let Some(ended) = connections.try_join_next() {
            log_panic(ended);
        }
        if connections.len() >= max_connections {
            // Never waits: a client that does not read must not stall the
            // accept loop.
            let _ = stream.try_write(&overloaded);
            refusals.note(max_connections);
            // The client may already have sent its request: closing now
            // could reset the connection and lose the 503. A bounded number
            // of refusals linger; the rest are closed at once.
            if lingering.load(Ordering::Relaxed) < MAX_LINGERING_REFUSALS {
                lingering.fetch_add(1, Ordering::Relaxed);
                let lingering = Arc::clone(&lingering);
                tokio::spawn(async move {
                    linger(stream, settings.linger_time).await;
                    lingering.fetch_sub(1, Ordering::Relaxed);
                });
            }
            continue;
        }
        connections.spawn(serve_connection(
            stream,
            peer,
            router.clone(),
            http.clone(),
            stop_rx.clone(),
            settings,
        ));
    }

    drop(listener);
    let open = connections.len();
    tracing::info!(open, "no longer accepting; closing connections");
    // Receivers are never all dropped: `stop_rx` lives until we return.
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(settings.shutdown_grace, async {
        while let Some(ended) = connections.join_next().await {
            log_panic(ended);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            dropped = connections.len(),
            grace = ?settings.shutdown_grace,
            "connections still busy after the shutdown grace period; dropping them"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// The future answering one request: boxed, so the connection is `Unpin`
/// and can be polled without hyper shutting its socket down.
type Answer = Pin<Box<dyn Future<Output = Result<axum::response::Response, Infallible>> + Send>>;

/// Serves one connection until it ends or, after `stop`, until its
/// in-flight request and response are done; then closes it with a
/// lingering close.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    http: http1::Builder,
    mut stop: watch::Receiver<bool>,
    settings: EdgeSettings,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: Request<Incoming>| -> Answer {
            let in_flight = InFlight::enter(&activity);
            let (parts, body) = request.into_parts();
            // No body (most GETs): nothing the handler could leave unread,
            // so no drain to arrange.
            let left = (!body.is_end_stream()).then(|| Arc::new(Mutex::new(None)));
            let body = match &left {
                Some(left) => Body::new(Returning {
                    body: Some(body),
                    ended: false,
                    left: Arc::clone(left),
                }),
                None => Body::new(body),
            };
            let response = router.clone().oneshot(Request::from_parts(parts, body));
            Box::pin(async move {
                let mut response = response.await?;
                let unread = left
                    .and_then(|left| left.lock().unwrap_or_else(PoisonError::into_inner).take());
                if let Some(unread) = unread {
                    if !drain(unread, &settings).await {
                        response
                            .headers_mut()
                            .insert(CONNECTION, HeaderValue::from_static("close"));
                    }
                }
                Ok(response.map(|body| holding(body, in_flight)))
            })
        })
    };
    let mut conn = http.serve_connection(io, service);
    let mut stopped = pin!(stopped(&mut stop));
    let mut stopping = false;
    let head_timeout = settings.header_read_timeout;
    let mut head_timer = pin!(tokio::time::sleep(head_timeout));
    let ended = std::future::poll_fn(|cx| {
        if !stopping && stopped.as_mut().poll(cx).is_ready() {
            stopping = true;
            // Closes an idle connection; otherwise the current response is
            // sent with `Connection: close` and the connection then ends.
            Pin::new(&mut conn).graceful_shutdown();
            if activity.is_quiet() {
                // Idle, silent, or part way through a request head (which
                // hyper would otherwise wait for until the header timeout).
                return Poll::Ready(Ended::Stopped);
            }
        }
        // The connection first, as hyper reads before it checks its own
        // timeout: a head that arrived in time but is read late (a busy
        // worker) is served, not cut.
        if let Poll::Ready(served) = conn.poll_without_shutdown(cx) {
            return Poll::Ready(Ended::Served(served));
        }
        // Ends once the timer, set again, is pending: a deadline set is
        // always after now.
        while head_timer.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            match activity.head_deadline(head_timeout) {
                Some(deadline) if deadline <= now => return Poll::Ready(Ended::HeadTimeout),
                Some(deadline) => head_timer.as_mut().reset(deadline),
                None => head_timer.as_mut().reset(now + head_timeout),
            }
        }
        Poll::Pending
    })
    .await;
    match ended {
        Ended::Stopped => return,
        Ended::HeadTimeout => {
            tracing::debug!(%peer, timeout = ?head_timeout, "no complete request head in time; closing");
        }
        Ended::Served(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
        Ended::Served(Ok(())) => {}
    }
    let stream = conn.into_parts().io.into_inner().stream;
    linger(stream, settings.linger_time).await;
}

/// Why [`serve_connection`] stopped serving a connection.
enum Ended {
    /// Hyper ended it, with this result.
    Served(Result<(), hyper::Error>),
    /// It waited for a request head longer than the header-read timeout.
    HeadTimeout,
    /// The server is shutting down and the connection had nothing to
    /// finish.
    Stopped,
}

/// A request body that, dropped before its end, leaves what is left of it
/// in `left`, for the connection to [`drain`].
struct Returning {
    body: Option<Incoming>,
    /// The body's last frame was read.
    ended: bool,
    left: Arc<Mutex<Option<Incoming>>>,
}

impl HttpBody for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = ready!(Pin::new(body).poll_frame(cx));
        if frame.is_none() {
            self.ended = true;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Some(body) = self.body.take().filter(|b| !b.is_end_stream()) {
            *self.left.lock().unwrap_or_else(PoisonError::into_inner) = Some(body);
        }
    }
}

/// Reads and throws away `body`, what a handler left of its request, so
/// that hyper can keep the connection for the client's next request.
/// Whether it reached the end within [`EdgeSettings::drain_bytes`] and
/// [`EdgeSettings::drain_time`]; a body that declares a longer length is
/// not read at all.
async fn drain(mut body: Incoming, settings: &EdgeSettings) -> bool {
    let most = u64::try_from(settings.drain_bytes).unwrap_or(u64::MAX);
    if body.size_hint().lower() > most {
        return false;
    }
    let deadline = tokio::time::Instant::now() + settings.drain_time;
    let mut read = 0u64;
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(None) => return true,
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |d| d.len() as u64);
                if read > most {
                    return false;
                }
            }
            // The client went away, or is too slow.
            Ok(Some(Err(_))) | Err(_) => return false,
        }
    }
}

/// Closes `stream` without losing what was sent on it: shuts its write
/// side (the client gets every byte, then end of file), then reads and
/// throws away what the client still sends until it closes too, sends
/// nothing for [`LINGER_IDLE`], or `linger_time` passes. Closing a socket
/// that holds unread data sends a reset, which makes the client's kernel
/// discard a response its application has not read yet; this is nginx's
/// lingering close (`lingering_time`, `lingering_timeout`).
async fn linger(mut stream: TcpStream, linger_time: Duration) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + linger_time;
    let mut buf = vec![0; 16 * 1024];
    loop {
        let wait = deadline.min(tokio::time::Instant::now() + LINGER_IDLE);
        match tokio::time::timeout_at(wait, stream.read(&mut buf)).await {
            Ok(Ok(1..)) => {}
            // End of file, an error, or quiet for long enough.
            _ => return,
        }
    }
}

/// What a connection is doing, as far as shutdown and the header-read
/// timeout need to know.
#[derive(Debug)]
struct Activity {
    /// Requests whose response body has not been dropped by hyper yet.
    requests: AtomicUsize,
    /// The socket's send buffer was full at the last write: hyper still
    /// holds response bytes to send (it writes until the socket refuses).
    write_blocked: AtomicBool,
    /// When the connection last started waiting for a request head (it
    /// was accepted, or its last response was handed over), in
    /// nanoseconds after `born`.
    waiting_since: AtomicU64,
    born: tokio::time::Instant,
}

impl Activity {
    /// A connection accepted now, waiting for its first request head.
    fn new() -> Self {
        Self {
            requests: AtomicUsize::new(0),
            write_blocked: AtomicBool::new(false),
            waiting_since: AtomicU64::new(0),
            born: tokio::time::Instant::now(),
        }
    }

    /// Nothing to finish: no request being handled and nothing left to
    /// write.
    fn is_quiet(&self) -> bool {
        // The connection, its service and its socket are polled by one
        // task, so no ordering with other memory is needed.
        self.requests.load(Ordering::Relaxed) == 0 && !self.write_blocked.load(Ordering::Relaxed)
    }

    /// The wait for a request head starts now.
    fn start_waiting(&self) {
        let since = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waiting_since.store(since, Ordering::Relaxed);
    }

    /// When the wait for the next request head times out; `None` while a
    /// request is being handled.
    fn head_deadline(&self, timeout: Duration) -> Option<tokio::time::Instant> {
        (self.requests.load(Ordering::Relaxed) == 0).then(|| {
            self.born + Duration::from_nanos(self.waiting_since.load(Ordering::Relaxed)) + timeout
        })
    }
}

/// Counts a request as in flight until dropped: it lives in the response
/// body, which hyper drops once it has taken the body's last frame.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: &Arc<Activity>) -> Self {
        activity.requests.fetch_add(1, Ordering::Relaxed);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.requests.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.start_waiting();
        }
    }
}

/// `body`, holding `in_flight` until hyper drops it.
fn holding(body: Body, in_flight: InFlight) -> Body {
    Body::new(body.map_frame(move |frame| {
        let _in_flight = &in_flight;
        frame
    }))
}

/// Completes once `serve` asks connections to stop, or is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// A TCP stream that records whether its last write was refused.
#[derive(Debug)]
struct Tracked {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl Tracked {
    fn note<T>(&self, poll: Poll<T>) -> Poll<T> {
        self.activity
            .write_blocked
            .store(poll.is_pending(), Ordering::Relaxed);
        poll
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.note(poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.note(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Connections refused over the cap since the last warning.
#[derive(Debug, Default)]
struct Refusals {
    count: u64,
    last_warning: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, max_connections: usize) {
        self.count += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|last| now.duration_since(last) >= REFUSAL_LOG_INTERVAL)
        {
            tracing::warn!(
                refused = self.count,
                max_connections,
                "too many open connections; refusing new ones"
            );
            self.count = 0;
            self.last_warning = Some(now);
        }
    }
}

/// The whole HTTP/1.1 response to a connection over the cap, in the shape
/// of the app's error responses.
fn overloaded_response() -> Vec<u8> {
    let message = "too many open connections; retry later";
    let body = serde_json::json!({
        "error": {
            "code": "overloaded",
            "message": message,
        },
        "message": message,
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         content-type: application/json\r\n\
         retry-after: 1\r\n\
         connection: close\r\n\
         content-length: {}\r\n\
         \r\n\
         {body}",
        body.len()
    )
    .into_bytes()
}

/// An error about one connection rather than the listener: the next
/// accept may well succeed.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Logs a connection task that panicked (hyper or the router, since
/// handlers' panics are caught by the app's layer).
fn log_panic(ended: Result<(), JoinError>) {
    if let Err(e) = ended {
        if e.is_panic() {
            tracing::error!(error = %e, "connection task panicked");
        }
    }
}
