//! Authentication and authorization, as lakeFS does it: a bearer token
//! names a user, whose policies say which repositories they may read or
//! write.
//!
//! Tokens are 256-bit random values, stored only as SHA-256 digests. A
//! request's token is hashed and the digest looked up, through a
//! coalescing cache (TTL 20 s, jitter 3 s by default), so steady traffic
//! makes no database round trip per request. Looking up a digest
//! leaks nothing useful through timing: the time can at most depend on how
//! much of the *digest* matches a stored one, and knowing that does not
//! help anyone construct a token.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use batcher::cache::Cache;
use batcher::pg::{PgError, Pool};
use rand::TryRngCore;
use sha2::{Digest as _, Sha256};

use crate::error::AppError;
use crate::AppState;

/// A token's SHA-256 digest, the only form in which tokens are stored.
pub type TokenDigest = [u8; 32];

/// Hashes a token for storage or lookup.
pub fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// A new random token from the OS's generator: `pgb_` and 64 hex digits
/// (256 bits).
///
/// # Errors
///
/// When the OS random number generator fails.
pub fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .context("the OS random number generator failed")?;
    Ok(format!("pgb_{}", hex::encode(bytes)))
}

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read objects (and, on `*`, the seed benchmark's rows).
    Read,
    /// Create, change or delete objects.
    Write,
}

/// One policy row: what a user may do in one repository, or in all (`*`).
/// Serialized as `GET /api/v1/user` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Grant {
    /// A repository name, or `*`.
    pub repository: String,
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
}

/// The authenticated user of a request, with their policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user's name.
    pub user: String,
    /// The user's policies.
    pub grants: Vec<Grant>,
}

impl Principal {
    /// Whether the user may do `action` in `repository` (`*`: the
    /// service-wide scope, granted only by a `*` policy).
    pub fn may(&self, action: Action, repository: &str) -> bool {
        self.grants.iter().any(|g| {
            let scope = g.repository == "*" || (repository != "*" && g.repository == repository);
            scope
                && match action {
                    Action::Read => g.read || g.write,
                    Action::Write => g.write,
                }
        })
    }

    /// `Ok` if the user may do `action` in `repository`, else a 403.
    ///
    /// # Errors
    ///
    /// 403 `forbidden` naming the action and repository.
    pub fn require(&self, action: Action, repository: &str) -> Result<(), AppError> {
        if self.may(action, repository) {
            return Ok(());
        }
        let verb = match action {
            Action::Read => "read",
            Action::Write => "write",
        };
        let scope = if repository == "*" {
            "this service's shared data".to_owned()
        } else {
            format!("repository `{repository}`")
        };
        Err(AppError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("user `{}` may not {verb} {scope}", self.user),
        ))
    }
}

/// Resolves tokens to principals, through a cache unless it is turned off.
#[derive(Debug, Clone)]
pub struct Authenticator {
    pool: Pool,
    cache: Option<Cache<TokenDigest, Arc<Principal>>>,
}

/// Settings of the token cache.
#[derive(Debug, Clone, Copy)]
pub struct AuthCacheConfig {
    /// Entries (tokens) held at most.
    pub capacity: u64,
    /// How long a resolved token is trusted before it is looked up again.
    pub ttl: Duration,
    /// Up to this much is added to each entry's TTL.
    pub jitter: Duration,
}

impl Authenticator {
    /// An authenticator over `pool`; `cache: None` looks every token up in
    /// the database (for comparison).
    ///
    /// # Errors
    ///
    /// When the cache settings are invalid.
    pub fn new(pool: Pool, cache: Option<AuthCacheConfig>) -> anyhow::Result<Self> {
        let cache = match cache {
            None => None,
            Some(c) => {
                let pool = pool.clone();
                Some(
                    Cache::builder()
                        .name("auth")
                        .max_capacity(c.capacity)
                        .time_to_live(c.ttl)
                        .jitter(c.jitter)
                        .build(move |digest: TokenDigest| {
                            let pool = pool.clone();
                            async move {
                                load_principal(&pool, &digest)
                                    .await
                                    .map(|p| p.map(Arc::new))
                                    .map_err(batcher::Error::load)
                            }
                        })?,
                )
            }
        };
        Ok(Self { pool, cache })
    }

    /// The principal of `token`, or `None` if no such token exists.
    ///
    /// # Errors
    ///
    /// When the database fails.
    pub async fn principal(&self, token: &str) -> anyhow::Result<Option<Arc<Principal>>> {
        let digest = digest(token);
        match &self.cache {
            Some(cache) => Ok(cache.get(digest).await?),
            None => Ok(load_principal(&self.pool, &digest).await?.map(Arc::new)),
        }
    }

    /// The token cache's counters, if the cache is on.
    pub fn cache_stats(&self) -> Option<batcher::cache::CacheStats> {
        self.cache.as_ref().map(Cache::stats)
    }
}

/// One round trip: the token's user and all their policies.
async fn load_principal(pool: &Pool, digest: &TokenDigest) -> Result<Option<Principal>, PgError> {
    let client = pool.get().await?;
    let stmt = client
        .prepare_cached(
            "SELECT u.name, p.repository, p.can_read, p.can_write \
             FROM tokens t JOIN users u ON u.id = t.user_id \
             LEFT JOIN policies p ON p.user_id = u.id \
             WHERE t.digest = $1",
        )
        .await?;
    let rows = client.query(&stmt, &[&digest.as_slice()]).await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let mut principal = Principal {
        user: first.try_get(0)?,
        grants: Vec::new(),
    };
    for row in &rows {
        if let Some(repository) = row.try_get::<_, Option<String>>(1)? {
            principal.grants.push(Grant {
                repository,
                read: row.try_get(2)?,
                write: row.try_get(3)?,
            });
        }
    }
    Ok(Some(principal))
}

/// The longest token accepted; anything longer is malformed.
const MAX_TOKEN_BYTES: usize = 256;

/// Middleware for `/api`: resolves `Authorization: Bearer <token>` and puts
/// the [`Principal`] into the request's extensions.
pub async fn require_token(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let token = match bearer_token(req.headers().get(header::AUTHORIZATION)) {
        Ok(token) => token.to_owned(),
        Err(e) => return unauthorized(e),
    };
    match state.auth.principal(&token).await {
        Ok(Some(principal)) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Ok(None) => unauthorized(AppError::new(
            StatusCode::UNAUTHORIZED,
            "unknown_token",
            "the bearer token is not valid",
        )),
        Err(e) => {
            tracing::error!(error = ?e, "token lookup failed");
            AppError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                "the database is unavailable; retry later",
            )
            .into_response()
        }
    }
}

fn bearer_token(value: Option<&HeaderValue>) -> Result<&str, AppError> {
    let malformed = |msg: &str| AppError::new(StatusCode::UNAUTHORIZED, "malformed_token", msg);
    let value = value.ok_or_else(|| {
        AppError::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "this route needs an `Authorization: Bearer <token>` header",
        )
    })?;
    let value = value
        .to_str()
        .map_err(|_| malformed("the Authorization header is not visible ASCII"))?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or_else(|| malformed("expected `Authorization: Bearer <token>`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(malformed("expected `Authorization: Bearer <token>`"));
    }
    let token = token.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES || token.contains(' ') {
        return Err(malformed(
            "the bearer token is empty, too long or contains spaces",
        ));
    }
    Ok(token)
}

fn unauthorized(e: AppError) -> Response {
    let mut res = e.into_response();
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// Creates a user with read access to `read` and read-write access to
/// `write` (repository names or `*`).
///
/// # Errors
///
/// When the name is taken or invalid, or the database fails.
pub async fn create_user(
    client: &mut tokio_postgres::Client,
    name: &str,
    read: &[String],
    write: &[String],
) -> anyhow::Result<()> {
    let tx = client.transaction().await?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO users (name) VALUES ($1) RETURNING id",
            &[&name],
        )
        .await
        .with_context(|| {
            format!("could not create user `{name}` (taken, or not 1-64 of A-Z a-z 0-9 . _ -)")
        })?
        .get(0);
    for (repos, can_write) in [(read, false), (write, true)] {
        for repo in repos {
            tx.execute(
                "INSERT INTO policies (user_id, repository, can_read, can_write) VALUES ($1, $2, true, $3) \
                 ON CONFLICT (user_id, repository) DO UPDATE SET can_write = policies.can_write OR EXCLUDED.can_write",
                &[&id, repo, &can_write],
            )
            .await
            .with_context(|| format!("invalid repository `{repo}` in a policy"))?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Stores `token` (as its digest) for user `user`.
///
/// # Errors
///
/// When the user does not exist or the database fails.
pub async fn add_token(
    client: &tokio_postgres::Client,
    user: &str,
    token: &str,
    description: &str,
) -> anyhow::Result<()> {
    let digest = digest(token);
    let n = client
        .execute(
            "INSERT INTO tokens (digest, user_id, description) \
             SELECT $1, id, $3 FROM users WHERE name = $2 ON CONFLICT (digest) DO NOTHING",
            &[&digest.as_slice(), &user, &description],
        )
        .await?;
    if n == 0 {
        let exists = client
            .query_opt("SELECT 1 FROM users WHERE name = $1", &[&user])
            .await?
            .is_some();
        anyhow::ensure!(exists, "no user named `{user}`");
    }
    Ok(())
}

/// The admin user created on first start.
pub const ADMIN_USER: &str = "admin";

/// On first start (no users yet), creates user `admin` with read-write
/// access to everything and a token: `preset` if given (for example from
/// an environment variable), else a new random one. The token is written
/// to `token_file` (mode 0600) and returned so it can be shown once. With
/// users present, only makes sure `preset` (if any) is an admin token.
///
/// # Errors
///
/// When the database fails or the token file cannot be written.
pub async fn bootstrap_admin(
    config: &tokio_postgres::Config,
    preset: Option<&str>,
    token_file: &Path,
) -> anyhow::Result<Option<String>> {
    let (mut client, conn) = config.connect(tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(conn);
    let has_users = client
        .query_opt("SELECT 1 FROM users LIMIT 1", &[])
        .await?
        .is_some();
    let created = if has_users {
        if let Some(token) = preset {
            add_token(&client, ADMIN_USER, token, "preset admin token").await?;
        }
        None
    } else {
        create_user(&mut client, ADMIN_USER, &[], &["*".to_owned()]).await?;
        let token = match preset {
            Some(t) => t.to_owned(),
            None => new_token()?,
        };
        add_token(&client, ADMIN_USER, &token, "created on first start").await?;
        write_secret(token_file, &token)?;
        Some(token)
    };
    drop(client);
    let _ = conn.await; // ends as the client is dropped; nothing to report
    Ok(created)
}

fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("could not create {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("could not write {}", path.display()))?;
    writeln!(f, "{secret}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(grants: &[(&str, bool, bool)]) -> Principal {
        Principal {
            user: "u".into(),
            grants: grants
                .iter()
                .map(|&(r, read, write)| Grant {
                    repository: r.into(),
                    read,
                    write,
                })
                .collect(),
        }
    }

    #[test]
    fn policies_scope_actions_to_repositories() {
        let reader = principal(&[("demo", true, false)]);
        assert!(reader.may(Action::Read, "demo"));
        assert!(!reader.may(Action::Write, "demo"));
        assert!(!reader.may(Action::Read, "other"));
        assert!(
            !reader.may(Action::Read, "*"),
            "a repository grant is not global"
        );
        let admin = principal(&[("*", true, true)]);
        assert!(admin.may(Action::Write, "anything") && admin.may(Action::Read, "*"));
        let writer = principal(&[("demo", false, true)]);
        assert!(writer.may(Action::Read, "demo"), "write implies read");
        assert_eq!(
            reader.require(Action::Write, "demo").unwrap_err().code(),
            "forbidden"
        );
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let h = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(bearer_token(Some(&h("Bearer abc"))).unwrap(), "abc");
        assert_eq!(bearer_token(Some(&h("bearer abc"))).unwrap(), "abc");
        assert_eq!(bearer_token(None).unwrap_err().code(), "missing_token");
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc", "Bearer a b"] {
            assert_eq!(
                bearer_token(Some(&h(bad))).unwrap_err().code(),
                "malformed_token",
                "{bad}"
            );
        }
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(
            bearer_token(Some(&h(&long))).unwrap_err().code(),
            "malformed_token"
        );
    }

    #[test]
    fn tokens_are_random_and_hashed() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with("pgb_") && a.len() == 68);
        assert_eq!(digest(&a), digest(&a));
        assert_ne!(digest(&a), digest(&b));
    }
}
