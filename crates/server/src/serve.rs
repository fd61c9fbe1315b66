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
//! - **Header-read timeout** ([`EdgeSettings::header_read_timeout`]),
//!   hyper's `header_read_timeout` with a [`TokioTimer`]. In hyper 1.12
//!   (`src/proto/h1/conn.rs`) the timer starts whenever the connection
//!   waits for a request head: right after accept, and again when a
//!   keep-alive connection goes idle after a response (`State::idle` sets
//!   `notify_read` when the timeout is set, so the next `poll_read_head`
//!   starts it). It is not reset by each byte received, and it does not run
//!   while a request is being handled. So it is also the idle keep-alive
//!   timeout: there is no separate one.
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
//!
//! Hyper answers a malformed or oversized head itself (400, 414 or 431)
//! with an empty body, and closes a connection past the header-read
//! timeout without a response (`Server::on_error` in hyper's
//! `src/proto/h1/role.rs`); neither hyper nor hyper-util has a hook to
//! change those responses, so they do not carry the JSON error body of the
//! app's own errors. The 503 for a connection over the cap is written here
//! and does.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinError, JoinSet};
use tower::ServiceExt as _;

/// Default of [`EdgeSettings::header_read_timeout`]: long enough for a
/// client on a slow link to send a few KiB of headers, short enough that a
/// silent or trickling connection is not held for long.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`EdgeSettings::max_header_bytes`]: the service's requests
/// need a token and a path or two; 32 KiB leaves room for long object
/// paths in the query string.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;

/// Default of [`EdgeSettings::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Default of [`EdgeSettings::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long accepting pauses after an accept error other than a reset
/// connection (typically `EMFILE`): long enough not to spin or flood the
/// log, short enough to resume soon after descriptors are freed.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(250);

/// At most one warning per this interval about refused connections, so a
/// flood of them does not flood the log.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Limits on clients, below the router: how long a request head may take,
/// how large it may be, how many connections may be open, and how long a
/// shutdown waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeSettings {
    /// Longest wait for a complete request head, counted from when the
    /// connection starts waiting for it: at accept, or when a keep-alive
    /// connection goes idle after a response. Past it the connection is
    /// closed without a response. This is also the idle keep-alive
    /// timeout.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers), in bytes; a larger
    /// one is answered 431 and its connection closed.
    pub max_header_bytes: usize,
    /// Most connections open at once; a connection beyond them is answered
    /// 503 and closed at once.
    pub max_connections: usize,
    /// On shutdown, how long in-flight requests (and responses still being
    /// written) may take before their connections are dropped.
    pub shutdown_grace: Duration,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

impl EdgeSettings {
    /// An error naming the first setting that would make the server refuse
    /// or drop every request.
    fn validate(&self) -> io::Result<()> {
        let invalid = |what: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if self.header_read_timeout.is_zero() {
            return invalid("the header read timeout must be above zero");
        }
        if self.max_header_bytes == 0 {
            return invalid("the request head limit must be above zero");
        }
        if self.max_connections == 0 {
            return invalid("the connection limit must be above zero");
        }
        Ok(())
    }
}

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
    http.timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_header_size(settings.max_header_bytes);
    let overloaded = overloaded_response();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut refusals = Refusals::default();
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
            // accept loop. Dropping the stream closes it.
            let _ = stream.try_write(&overloaded);
            refusals.note(max_connections);
            continue;
        }
        connections.spawn(serve_connection(
            stream,
            peer,
            router.clone(),
            http.clone(),
            stop_rx.clone(),
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

/// Serves one connection until it ends or, after `stop`, until its
/// in-flight request and response are done.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    http: http1::Builder,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Tracked {
        stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let in_flight = InFlight::enter(&activity);
            let response = router.clone().oneshot(request);
            async move {
                let response = response.await?;
                Ok::<_, Infallible>(response.map(|body| holding(body, in_flight)))
            }
        })
    };
    let mut conn = pin!(http.serve_connection(io, service));
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stopped(&mut stop) => {
            // Closes an idle connection; otherwise the current response is
            // sent with `Connection: close` and the connection then ends.
            conn.as_mut().graceful_shutdown();
            if activity.is_quiet() {
                // Idle, silent, or part way through a request head (which
                // hyper would otherwise wait for until the header timeout).
                return;
            }
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// What a connection is doing, as far as shutdown needs to know.
#[derive(Debug, Default)]
struct Activity {
    /// Requests whose response body has not been dropped by hyper yet.
    requests: AtomicUsize,
    /// The socket's send buffer was full at the last write: hyper still
    /// holds response bytes to send (it writes until the socket refuses).
    write_blocked: AtomicBool,
}

impl Activity {
    /// Nothing to finish: no request being handled and nothing left to
    /// write.
    fn is_quiet(&self) -> bool {
        // The connection, its service and its socket are polled by one
        // task, so no ordering with other memory is needed.
        self.requests.load(Ordering::Relaxed) == 0 && !self.write_blocked.load(Ordering::Relaxed)
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
        self.0.requests.fetch_sub(1, Ordering::Relaxed);
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
    let body = serde_json::json!({
        "error": {
            "code": "overloaded",
            "message": "too many open connections; retry later",
        }
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
