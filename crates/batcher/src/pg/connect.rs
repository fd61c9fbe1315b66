//! Connecting to one of several nodes, as libpq does with a multi-host
//! connection string, with every step bounded.
//!
//! tokio-postgres tries a multi-host config's hosts in order, but its
//! `connect_timeout` bounds only the TCP connect: a host whose port still
//! accepts connections while its server hangs (a frozen or partitioned
//! primary after a failover) holds the login forever, and the next host is
//! never tried. It also knows only `target_session_attrs` `any`,
//! `read-write` and `read-only`. A [`Connector`] connects to each host on
//! its own, under one deadline for the TCP connect, TLS, the login and the
//! check of the node's role together, and moves to the next host when it
//! passes. Hosts that failed recently are tried last, so once a failover
//! is known, new connections go to the promoted node first instead of
//! paying the dead one's deadline each time (pgjdbc keeps hosts' states
//! the same way).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::future::{poll_fn, BoxFuture};
use tokio_postgres::config::Host;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};

/// What a connection's node must be: libpq's `target_session_attrs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TargetSessionAttrs {
    /// Any node (`any`, the default).
    #[default]
    Any,
    /// A node that accepts writes (`read-write`): not in recovery, and
    /// `transaction_read_only` off.
    ReadWrite,
    /// A node that does not accept writes (`read-only`): a standby, or
    /// `default_transaction_read_only` on.
    ReadOnly,
    /// A node not in recovery (`primary`).
    Primary,
    /// A node in recovery (`standby`).
    Standby,
    /// A standby if any host is one, else any node (`prefer-standby`).
    PreferStandby,
}

impl TargetSessionAttrs {
    /// The name libpq gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::ReadWrite => "read-write",
            Self::ReadOnly => "read-only",
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a node in this state is acceptable.
    fn accepts(self, in_recovery: bool, read_only: bool) -> bool {
        match self {
            Self::Any | Self::PreferStandby => true,
            Self::ReadWrite => !in_recovery && !read_only,
            Self::ReadOnly => in_recovery || read_only,
            Self::Primary => !in_recovery,
            Self::Standby => in_recovery,
        }
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `target_session_attrs` value libpq does not know.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown target_session_attrs {0:?} (expected any, read-write, read-only, primary, standby or prefer-standby)")]
pub struct UnknownTargetSessionAttrs(String);

impl FromStr for TargetSessionAttrs {
    type Err = UnknownTargetSessionAttrs;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "any" => Self::Any,
            "read-write" => Self::ReadWrite,
            "read-only" => Self::ReadOnly,
            "primary" => Self::Primary,
            "standby" => Self::Standby,
            "prefer-standby" => Self::PreferStandby,
            other => return Err(UnknownTargetSessionAttrs(other.to_owned())),
        })
    }
}

impl From<tokio_postgres::config::TargetSessionAttrs> for TargetSessionAttrs {
    fn from(attrs: tokio_postgres::config::TargetSessionAttrs) -> Self {
        use tokio_postgres::config::TargetSessionAttrs as Pg;
        match attrs {
            Pg::ReadWrite => Self::ReadWrite,
            Pg::ReadOnly => Self::ReadOnly,
            _ => Self::Any,
        }
    }
}

/// Why a connection string could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Its `target_session_attrs` is not one libpq knows.
    #[error(transparent)]
    TargetSessionAttrs(#[from] UnknownTargetSessionAttrs),
    /// tokio-postgres refused the rest of it.
    #[error("invalid connection string")]
    Invalid(#[source] tokio_postgres::Error),
}

/// Parses a connection string in either of libpq's forms (a
/// `postgres://` URL or `key=value` pairs), with every host it names
/// (`postgres://u@h1:5432,h2:5433/db`, `host=h1,h2 port=5432,5433`) and
/// every `target_session_attrs` libpq knows, including those tokio-postgres
/// refuses (`primary`, `standby`, `prefer-standby`).
///
/// ```
/// use pgbatch::pg::{parse_config, TargetSessionAttrs};
///
/// let (config, attrs) =
///     parse_config("postgres://app@db1:5432,db2:5432/app?target_session_attrs=primary")?;
/// assert_eq!(config.get_hosts().len(), 2);
/// assert_eq!(attrs, TargetSessionAttrs::Primary);
/// # Ok::<(), pgbatch::pg::ConfigError>(())
/// ```
///
/// # Errors
///
/// An unknown `target_session_attrs`, or what tokio-postgres refuses.
pub fn parse_config(s: &str) -> Result<(Config, TargetSessionAttrs), ConfigError> {
    let (rest, attrs) = take_parameter(s, "target_session_attrs");
    let attrs = match attrs {
        Some(value) => value.parse()?,
        None => TargetSessionAttrs::Any,
    };
    let config = rest.parse::<Config>().map_err(ConfigError::Invalid)?;
    Ok((config, attrs))
}

/// `s` without the parameter `key`, and its (percent-decoded, unquoted)
/// value. Written by hand: tokio-postgres's parser is private, and it
/// refuses the values this module exists for.
fn take_parameter(s: &str, key: &str) -> (String, Option<String>) {
    if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        let Some((base, query)) = s.split_once('?') else {
            return (s.to_owned(), None);
        };
        let mut value = None;
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| match pair.split_once('=') {
                Some((k, v)) if k == key => {
                    value = Some(
                        percent_encoding::percent_decode_str(v)
                            .decode_utf8_lossy()
                            .into_owned(),
                    );
                    false
                }
                _ => !pair.is_empty(),
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (rest, value)
    } else {
        // `key = value` pairs, a value quoted when it holds spaces: cut out
        // the one pair, leaving the rest byte for byte.
        let mut rest = String::with_capacity(s.len());
        let mut value = None;
        let mut pos = 0;
        while let Some((start, end, k, v)) = next_pair(s, pos) {
            if k == key {
                // The pair and the space before it.
                rest.push_str(s[pos..start].trim_end());
                value = Some(v);
            } else {
                rest.push_str(&s[pos..end]);
            }
            pos = end;
        }
        rest.push_str(&s[pos..]);
        (rest, value)
    }
}

/// The next `key = value` pair of a libpq `key=value` string from byte
/// `from`: where it starts and ends, its key, and its value unquoted.
fn next_pair(s: &str, from: usize) -> Option<(usize, usize, &str, String)> {
    let bytes = s.as_bytes();
    // The index of the first byte from `i` on that `stop` says ends a run.
    let run_to = |mut i: usize, stop: fn(u8) -> bool| {
        while i < bytes.len() && !stop(bytes[i]) {
            i += 1;
        }
        i
    };
    let not_space = |b: u8| !b.is_ascii_whitespace();
    let start = run_to(from, not_space);
    if start >= bytes.len() {
        return None;
    }
    let mut i = run_to(start, |b| b == b'=' || b.is_ascii_whitespace());
    let key = &s[start..i];
    i = run_to(i, not_space);
    if i < bytes.len() && bytes[i] == b'=' {
        i = run_to(i + 1, not_space);
    }
    let mut value = String::new();
    if i < bytes.len() && bytes[i] == b'\'' {
        i += 1;
        while i < bytes.len() && bytes[i] != b'\'' {
            if bytes[i] == b'\\' && i + 1 < bytes.len() {
                i += 1;
            }
            let c = s[i..].chars().next()?;
            value.push(c);
            i += c.len_utf8();
        }
        i = (i + 1).min(bytes.len());
    } else {
        let value_start = i;
        i = run_to(i, |b| b.is_ascii_whitespace());
        value.push_str(&s[value_start..i]);
    }
    Some((start, i, key, value))
}

/// How long a host that failed is tried after the others.
const FAILED_HOST_MEMORY: Duration = Duration::from_secs(30);

/// The kernel's watch over a connection whose peer stopped answering:
/// probes after this much idleness...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// ... every this often ...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// ... this many times before the connection is dropped.
const KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before the kernel drops the
/// connection (`TCP_USER_TIMEOUT`): a peer whose host lost power or
/// network.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(8);

/// Opens connections to the first suitable node of a config's hosts,
/// each host under a deadline of its own. Cheap to clone; clones share
/// which hosts failed lately.
///
/// Each host's attempt (the TCP or socket connect, TLS, the login and,
/// unless [`TargetSessionAttrs::Any`], one query for the node's role)
/// must end within the [`host_timeout`](Self::host_timeout), else the next
/// host is tried. TCP connections get keepalives (after 5 s idle, every
/// 1 s, 3 probes) and an 8 s `TCP_USER_TIMEOUT`, unless the config sets
/// its own, so the kernel drops a connection to a host that lost power or
/// network even while it is idle in a pool.
#[derive(Clone)]
pub struct Connector<T> {
    config: Config,
    attrs: TargetSessionAttrs,
    tls: T,
    host_timeout: Duration,
    hosts: Arc<Hosts>,
}

/// What the clones of a connector learned of its hosts.
#[derive(Debug)]
struct Hosts {
    /// Per host, when it last failed, in milliseconds after [`epoch`]
    /// (0: not lately), with [`TIMED_OUT`] set when it did not answer in
    /// time and [`ABANDONED`] when its caller gave up first.
    failed: Box<[AtomicU64]>,
    /// The host the last connection went to, plus one (0: none yet).
    landed: AtomicUsize,
    /// Connections opened before this (milliseconds after [`epoch`]) went
    /// to a node that is no longer the one connections go to.
    cutoff: AtomicU64,
}

/// Set in [`Hosts::failed`] for a host that did not answer in time, or
/// failed without a server's error (refused at the socket, a TLS or name
/// failure): it is tried after those that answered and refused (a standby
/// that may be promoted any moment).
const TIMED_OUT: u64 = 1 << 63;

/// Set in [`Hosts::failed`] for a host whose attempt was abandoned (its
/// caller's deadline passed first): tried after those that refused and
/// before those that did not answer (or failed without a server's error).
/// An attempt abandoned early proves little of its host: it may have begun
/// just as the caller gave up, a hung host tried first having used up its
/// time, and putting it behind the hung host would make every caller with
/// as short a deadline wait for the hung one again.
const ABANDONED: u64 = 1 << 62;

/// The time part of a [`Hosts::failed`] mark.
const MARK_TIME: u64 = !(TIMED_OUT | ABANDONED);

impl Hosts {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            failed: (0..n.max(1)).map(|_| AtomicU64::new(0)).collect(),
            landed: AtomicUsize::new(0),
            cutoff: AtomicU64::new(0),
        })
    }
}

impl<T> fmt::Debug for Connector<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("hosts", &describe_hosts(&self.config))
            .field("target_session_attrs", &self.attrs)
            .field("host_timeout", &self.host_timeout)
            .finish_non_exhaustive()
    }
}

/// The per-host deadline when neither the config's `connect_timeout` nor
/// [`Connector::host_timeout`] says otherwise.
pub const DEFAULT_HOST_TIMEOUT: Duration = Duration::from_secs(2);

impl<T> Connector<T>
where
    T: MakeTlsConnect<Socket> + Clone,
{
    /// A connector to `config`'s hosts through `tls`, for nodes that
    /// satisfy the config's own `target_session_attrs` (use
    /// [`target_session_attrs`](Self::target_session_attrs) for those
    /// tokio-postgres cannot hold, or take them from [`parse_config`]).
    /// Each host gets the config's `connect_timeout`, or 2 s.
    pub fn new(config: Config, tls: T) -> Self {
        let hosts = host_count(&config).max(1);
        Self {
            attrs: config.get_target_session_attrs().into(),
            host_timeout: config
                .get_connect_timeout()
                .copied()
                .unwrap_or(DEFAULT_HOST_TIMEOUT),
            config,
            tls,
            hosts: Hosts::new(hosts),
        }
    }

    /// What the node must be.
    #[must_use]
    pub fn target_session_attrs(mut self, attrs: TargetSessionAttrs) -> Self {
        self.attrs = attrs;
        self
    }

    /// How long one host's attempt may take in all.
    #[must_use]
    pub fn host_timeout(mut self, timeout: Duration) -> Self {
        self.host_timeout = timeout;
        self
    }

    /// This connector with `config` instead (another `options` or
    /// `application_name`, say), still sharing what it learned of the
    /// hosts, as long as `config` names as many.
    #[must_use]
    pub fn with_config(&self, config: Config) -> Self {
        let hosts = if host_count(&config).max(1) == self.hosts.failed.len() {
            Arc::clone(&self.hosts)
        } else {
            Hosts::new(host_count(&config))
        };
        Self {
            config,
            attrs: self.attrs,
            tls: self.tls.clone(),
            host_timeout: self.host_timeout,
            hosts,
        }
    }

    /// How long a connection attempt may take when every host uses up its
    /// deadline: what a pool's create timeout must allow for the last host
    /// to be tried.
    pub fn worst_case(&self) -> Duration {
        self.host_timeout * u32::try_from(self.hosts.failed.len()).unwrap_or(u32::MAX)
    }

    /// The config the connector was made from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the node must be.
    pub fn attrs(&self) -> TargetSessionAttrs {
        self.attrs
    }

    /// Connects to the first host, in the order described on [`Connector`],
    /// that answers in time and is what the connector needs. The
    /// connection must be driven (awaited, or polled for its messages) for
    /// the client to work.
    ///
    /// # Errors
    ///
    /// The last host's failure when none would do: its connect or login
    /// error, a timeout, or the server's refusal of the role check
    /// (SQLSTATE 25006 when a writable node or a primary was needed, 08004
    /// when a standby was).
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, T::Stream>), tokio_postgres::Error> {
        let mut last = None;
        // prefer-standby: the first primary that answers is kept in case
        // no host is a standby, rather than connecting to it twice.
        let mut fallback = None;
        for i in self.order() {
            // prefer-standby accepts any node, and asks which it is.
            let attempt = self.attempt(i, self.attrs).await;
            match attempt {
                Ok((client, conn, in_recovery)) => {
                    if self.attrs != TargetSessionAttrs::PreferStandby || in_recovery {
                        self.landed(i);
                        return Ok((client, conn));
                    }
                    if fallback.is_none() {
                        fallback = Some((i, client, conn));
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        match (fallback, last) {
            (Some((i, client, conn)), _) => {
                self.landed(i);
                Ok((client, conn))
            }
            (None, Some(e)) => Err(e),
            (None, None) => Err(tokio_postgres::Error::__private_api_timeout()),
        }
    }

    /// The connection handed out went to host `i`: if the one before went
    /// elsewhere, connections opened before now went to a node that is no
    /// longer the one in use.
    fn landed(&self, i: usize) {
        let slot = i.min(self.hosts.failed.len() - 1);
        let before = self.hosts.landed.swap(slot + 1, Ordering::AcqRel);
        if before != 0 && before != slot + 1 {
            self.hosts.cutoff.store(since_epoch(), Ordering::Release);
            let hosts = describe_hosts(&self.config);
            tracing::warn!(
                from = hosts.get(before - 1).map(String::as_str),
                to = hosts.get(slot).map(String::as_str),
                "database connections now go to another node; older ones are discarded"
            );
        }
    }

    /// Host indexes to try: those that have not failed lately in their
    /// order, then those that refused lately, then those whose attempt
    /// was abandoned, then those that did not answer, each the longest ago
    /// first.
    fn order(&self) -> Vec<usize> {
        let now = since_epoch();
        let failed = &self.hosts.failed;
        let mut order: Vec<(u64, usize)> = (0..failed.len())
            .map(|i| {
                let mark = failed[i].load(Ordering::Relaxed);
                let at = mark & MARK_TIME;
                let recent = mark != 0 && now.saturating_sub(at) < millis(FAILED_HOST_MEMORY);
                (if recent { mark } else { 0 }, i)
            })
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, i)| i).collect()
    }

    /// Whether a connection opened at `created` may still be used: false
    /// once a later connection went to another node than the one before
    /// it (the old one failed over, or stopped being what is wanted).
    pub fn is_current(&self, created: Instant) -> bool {
        let created = millis(created.saturating_duration_since(epoch()));
        created >= self.hosts.cutoff.load(Ordering::Acquire)
    }

    /// One host, under the host deadline: the connection, and whether the
    /// node is in recovery (when asked; false otherwise). A host whose
    /// attempt fails, times out or is abandoned (a caller's deadline
    /// cancels it) is marked as failed, each in its class (see
    /// [`ABANDONED`]).
    async fn attempt(
        &self,
        i: usize,
        attrs: TargetSessionAttrs,
    ) -> Result<(Client, Connection<Socket, T::Stream>, bool), tokio_postgres::Error> {
        let config = host_config(&self.config, i);
        let tls = self.tls.clone();
        let slot = i.min(self.hosts.failed.len() - 1);
        // Marks the host as abandoned unless defused: the
        // attempt may be dropped before it ends.
        let mut pending = Unanswered {
            hosts: &self.hosts,
            slot,
            armed: true,
        };
        let result = tokio::time::timeout(self.host_timeout, async move {
            let (client, mut conn) = config.connect(tls).await?;
            let in_recovery = if attrs == TargetSessionAttrs::Any {
                false
            } else {
                check_role(&client, &mut conn, attrs).await?
            };
            Ok((client, conn, in_recovery))
        })
        .await
        .unwrap_or_else(|_| Err(tokio_postgres::Error::__private_api_timeout()));
        pending.armed = false;
        match &result {
            Ok(_) => self.hosts.failed[slot].store(0, Ordering::Relaxed),
            Err(e) => {
                // A host that answered (even to refuse) is tried before one
                // that did not.
                let answered = e.as_db_error().is_some();
                let mark = since_epoch().max(1) | if answered { 0 } else { TIMED_OUT };
                tracing::debug!(host = i, error = %e, "host not usable; trying the next");
                self.hosts.failed[slot].store(mark, Ordering::Relaxed);
            }
        }
        result
    }
}

/// Marks its host as abandoned when dropped armed.
struct Unanswered<'a> {
    hosts: &'a Hosts,
    slot: usize,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // An attempt begun before another caller's attempt on this host
        // timed out must not downgrade that recent, surer mark.
        let now = since_epoch().max(1);
        let _ = self.hosts.failed[self.slot].fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |mark| {
                let recent = now.saturating_sub(mark & MARK_TIME) < millis(FAILED_HOST_MEMORY);
                (mark & TIMED_OUT == 0 || !recent).then_some(now | ABANDONED)
            },
        );
    }
}

/// Asks the node what it is, driving `conn` meanwhile, and refuses it
/// with a server error when it is not what `attrs` wants, so the caller
/// sees a SQLSTATE (25006 where writes or a primary are wanted, 08004
/// where a standby or a read-only node is). Returns whether it is in
/// recovery.
async fn check_role<S, T>(
    client: &Client,
    conn: &mut Connection<S, T>,
    attrs: TargetSessionAttrs,
) -> Result<bool, tokio_postgres::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // Simple-protocol statements: they work behind a transaction-mode
    // pooler.
    let rows = drive(
        conn,
        client.simple_query(
            "SELECT pg_catalog.pg_is_in_recovery()::text, \
             pg_catalog.current_setting('transaction_read_only')",
        ),
    )
    .await?;
    let (in_recovery, read_only) = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => {
                Some((row.get(0) == Some("true"), row.get(1) == Some("on")))
            }
            _ => None,
        })
        .unwrap_or((false, false));
    if attrs.accepts(in_recovery, read_only) {
        return Ok(in_recovery);
    }
    // Refused: the server raises it, so the error is a real report with a
    // SQLSTATE that says the node is not usable (tokio-postgres's errors
    // cannot be made outside it).
    let (code, why) = match attrs {
        TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary => (
            "25006",
            "the server does not accept writes (a standby, or read-only), and the connection needs a primary",
        ),
        _ => (
            "08004",
            "the server is a primary, and the connection needs a standby or a read-only server",
        ),
    };
    drive(
        conn,
        client.simple_query(&format!(
            "DO $pgbatch$ BEGIN RAISE EXCEPTION '{why}' USING ERRCODE = '{code}'; END $pgbatch$"
        )),
    )
    .await?;
    // A server that did not raise (it cannot happen, but a pooler could
    // answer anything) is still not what was asked for.
    Err(tokio_postgres::Error::__private_api_timeout())
}

/// Awaits `query` while driving `conn`; notices are dropped. The
/// connection's failure ends the wait with its error: polling it again
/// would only repeat it, and the query would never be answered.
async fn drive<S, T, F, R>(
    conn: &mut Connection<S, T>,
    query: F,
) -> Result<R, tokio_postgres::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    F: std::future::Future<Output = Result<R, tokio_postgres::Error>>,
{
    use std::task::Poll;
    let mut query = std::pin::pin!(query);
    poll_fn(|cx| {
        if let Poll::Ready(r) = query.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        loop {
            match conn.poll_message(cx) {
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                // Ended, or nothing yet: the host deadline bounds the wait.
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}

/// `config` narrowed to its host `i` (and its port and address), with the
/// keepalive settings filled in where the config leaves tokio-postgres's
/// defaults. Built field by field: tokio-postgres has no way to drop hosts
/// from a config.
fn host_config(config: &Config, i: usize) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .channel_binding(config.get_channel_binding());
    match config.get_hosts().get(i) {
        Some(Host::Tcp(host)) => {
            one.host(host);
        }
        Some(Host::Unix(path)) => {
            one.host_path(path);
        }
        None => {}
    }
    if let Some(addr) = config.get_hostaddrs().get(i) {
        one.hostaddr(*addr);
    }
    let ports = config.get_ports();
    if let Some(port) = ports.get(i).or_else(|| ports.first()) {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    // Each keepalive setting the config leaves at tokio-postgres's default
    // (after 2 hours idle, the kernel's interval and count) gets ours.
    let defaults = Config::new();
    one.keepalives(config.get_keepalives());
    one.keepalives_idle(
        if config.get_keepalives_idle() == defaults.get_keepalives_idle() {
            KEEPALIVE_IDLE
        } else {
            config.get_keepalives_idle()
        },
    );
    one.keepalives_interval(
        config
            .get_keepalives_interval()
            .unwrap_or(KEEPALIVE_INTERVAL),
    );
    one.keepalives_retries(config.get_keepalives_retries().unwrap_or(KEEPALIVE_RETRIES));
    one.load_balance_hosts(config.get_load_balance_hosts());
    one.tcp_user_timeout(
        config
            .get_tcp_user_timeout()
            .copied()
            .unwrap_or(TCP_USER_TIMEOUT),
    );
    one
}

fn host_count(config: &Config) -> usize {
    config.get_hosts().len().max(config.get_hostaddrs().len())
}

/// `host:port` of each host, never a password: for logs.
pub(crate) fn describe_hosts(config: &Config) -> Vec<String> {
    let ports = config.get_ports();
    (0..host_count(config))
        .map(|i| {
            let port = ports
                .get(i)
                .or_else(|| ports.first())
                .copied()
                .unwrap_or(5432);
            match (config.get_hosts().get(i), config.get_hostaddrs().get(i)) {
                (Some(Host::Tcp(h)), _) => format!("{h}:{port}"),
                (Some(Host::Unix(p)), _) => format!("{}:{port}", p.display()),
                (None, Some(addr)) => format!("{addr}:{port}"),
                (None, None) => format!("localhost:{port}"),
            }
        })
        .collect()
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch() -> u64 {
    millis(epoch().elapsed())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// deadpool-postgres opens the pool's connections through the connector.
impl<T> deadpool_postgres::Connect for Connector<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        _: &Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        Box::pin(async move {
            let (client, conn) = Connector::connect(self).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "database connection ended");
                }
            });
            Ok((client, task))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_session_attrs_are_taken_out_of_both_forms() {
        let (config, attrs) = parse_config(
            "postgres://u@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=primary",
        )
        .unwrap();
        assert_eq!(attrs, TargetSessionAttrs::Primary);
        assert_eq!(config.get_ports(), &[5432, 5433]);
        assert_eq!(describe_hosts(&config), ["h1:5432", "h2:5433"]);

        let (config, attrs) =
            parse_config("host=a,b port=1,2 user=u target_session_attrs=prefer-standby").unwrap();
        assert_eq!(attrs, TargetSessionAttrs::PreferStandby);
        assert_eq!(config.get_user(), Some("u"));
        assert_eq!(describe_hosts(&config), ["a:1", "b:2"]);

        let (_, attrs) = parse_config("postgres://u@h/db?target_session_attrs=read-write").unwrap();
        assert_eq!(attrs, TargetSessionAttrs::ReadWrite);
        let (_, attrs) = parse_config("postgres://u@h/db").unwrap();
        assert_eq!(attrs, TargetSessionAttrs::Any);
        assert!(matches!(
            parse_config("host=a target_session_attrs=leader"),
            Err(ConfigError::TargetSessionAttrs(_))
        ));
    }

    #[test]
    fn each_attribute_accepts_what_libpq_does() {
        use TargetSessionAttrs as A;
        // (in recovery, read only)
        let primary = (false, false);
        let read_only_primary = (false, true);
        let standby = (true, true);
        for (attrs, accepted) in [
            (A::Any, [true, true, true]),
            (A::ReadWrite, [true, false, false]),
            (A::ReadOnly, [false, true, true]),
            (A::Primary, [true, true, false]),
            (A::Standby, [false, false, true]),
        ] {
            let got = [primary, read_only_primary, standby].map(|(r, ro)| attrs.accepts(r, ro));
            assert_eq!(got, accepted, "{attrs}");
        }
        for a in [
            A::Any,
            A::ReadWrite,
            A::ReadOnly,
            A::Primary,
            A::Standby,
            A::PreferStandby,
        ] {
            assert_eq!(a.as_str().parse::<A>().unwrap(), a);
        }
    }

    #[test]
    fn a_host_narrowed_keeps_the_rest_and_gets_keepalives() {
        let (config, _) = parse_config(
            "postgres://u:secret@h1:5432,h2:5433/db?application_name=app&connect_timeout=3",
        )
        .unwrap();
        let second = host_config(&config, 1);
        assert_eq!(describe_hosts(&second), ["h2:5433"]);
        assert_eq!(second.get_user(), Some("u"));
        assert_eq!(second.get_password(), Some(&b"secret"[..]));
        assert_eq!(second.get_dbname(), Some("db"));
        assert_eq!(second.get_application_name(), Some("app"));
        assert_eq!(second.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(second.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(second.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
    }

    #[test]
    fn hosts_that_failed_lately_go_last() {
        let (config, _) = parse_config("host=a,b,c").unwrap();
        let connector = Connector::new(config, tokio_postgres::NoTls);
        let failed = &connector.hosts.failed;
        assert_eq!(connector.order(), [0, 1, 2]);
        failed[0].store(since_epoch().max(1), Ordering::Relaxed);
        assert_eq!(connector.order(), [1, 2, 0]);
        failed[2].store(since_epoch().max(2) + 1, Ordering::Relaxed);
        assert_eq!(connector.order(), [1, 0, 2]);
        // A host that did not answer goes after one that refused later.
        failed[0].store(since_epoch().max(1) | TIMED_OUT, Ordering::Relaxed);
        assert_eq!(connector.order(), [1, 2, 0]);
        // One abandoned later goes before it: its caller's deadline may
        // have passed just as its turn began.
        failed[1].store((since_epoch().max(3) + 2) | ABANDONED, Ordering::Relaxed);
        assert_eq!(connector.order(), [2, 1, 0]);
    }

    #[test]
    fn the_rest_of_a_string_is_kept_as_it_was() {
        let (rest, value) = take_parameter(
            "host=a password='x  y' target_session_attrs = 'standby' dbname=d",
            "target_session_attrs",
        );
        assert_eq!(value.as_deref(), Some("standby"));
        assert_eq!(rest, "host=a password='x  y' dbname=d");
        let (rest, value) = take_parameter(
            "postgresql://u@h/d?target_session_attrs=read%2Dwrite&sslmode=disable",
            "target_session_attrs",
        );
        assert_eq!(value.as_deref(), Some("read-write"));
        assert_eq!(rest, "postgresql://u@h/d?sslmode=disable");
        let (rest, value) = take_parameter("host=a", "target_session_attrs");
        assert_eq!((rest.as_str(), value), ("host=a", None));
    }
}
