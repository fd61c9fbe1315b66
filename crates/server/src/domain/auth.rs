//! Authentication and authorization, as lakeFS does it: a bearer token
//! names a user, whose policies say which repositories they may read or
//! write.
//!
//! Tokens are 256-bit random values, stored only as SHA-256 digests. A
//! request's token is hashed and the digest looked up through the read
//! registry's token lookup (`Reads::principal`: a coalescing cache over a
//! batcher, TTL 20 s, jitter 3 s by default, invalidated as every other
//! cached read is), so steady traffic makes no database round trip per
//! request, and in front of it a memo of the few tokens seen in the last
//! moments (`memo`). Looking up a digest
//! leaks nothing useful through timing: the time can at most depend on how
//! much of the *digest* matches a stored one, and knowing that does not
//! help anyone construct a token.

use std::sync::Arc;

use anyhow::Context as _;
use pgbatch::pg::PgError;
use rand::TryRngCore;
use sha2::{Digest as _, Sha256};
use tokio_postgres::types::PgLsn;

use crate::cluster::coherence::Coherence;
use crate::cluster::replicas::ReadRouter;
use crate::db::queries::auth::{self as sql, PrincipalQuery};
use crate::db::Postgres;
use crate::domain::failure::Failure;
use crate::domain::input;
use crate::domain::invalidation::Change;
use crate::domain::lookup::Lookup;
use crate::domain::reads::Reads;
use crate::model::auth::TokenInfo;
use crate::settings::AuthSettings;

mod memo;
use memo::Memo;

/// A token's SHA-256 digest, the only form in which tokens are stored.
pub type TokenDigest = [u8; 32];

/// Hashes a token for storage or lookup.
pub fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// A token's id: the first 16 hex digits of its digest. It names the token
/// in listings and revocations without revealing it, and serves as the
/// access key id of lakeFS's Basic authentication (the token itself is the
/// secret).
pub fn token_id(token: &str) -> String {
    hex::encode(&digest(token)[..8])
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

use crate::model::auth::unix_millis;
pub use crate::model::auth::{Action, Principal};

impl Principal {
    /// `Ok` if the user may do `action` in `repository`.
    ///
    /// # Errors
    ///
    /// [`Failure::Forbidden`] naming the user, action and repository.
    pub fn require(&self, action: Action, repository: &str) -> Result<(), Failure> {
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
        Err(Failure::Forbidden(format!(
            "user `{}` may not {verb} {scope}",
            self.user
        )))
    }
}

/// Resolves tokens to principals through the read registry's token lookup
/// (its cache unless turned off), with a memo of the last moments' tokens
/// in front; changes tokens on the primary.
#[derive(Debug, Clone)]
pub struct Authenticator {
    router: ReadRouter,
    /// The registry's token lookup (`Reads::principal`).
    lookup: Lookup<PrincipalQuery>,
    /// In front of the lookup's cache, when there is one.
    memo: Option<Arc<Memo>>,
    /// The memo, as the cache, is used only while this allows.
    coherence: Coherence,
    /// Token changes report here, to every lookup that reads tokens.
    reads: Reads,
}

impl Authenticator {
    /// An authenticator reading tokens through `reads`' token lookup, with
    /// a memo in front when `settings` ask for a token cache, used only
    /// while `coherence` allows. Token changes go to the primary.
    pub fn new(reads: &Reads, settings: &AuthSettings, coherence: &Coherence) -> Self {
        Self {
            router: reads.router().clone(),
            lookup: reads.principal.clone(),
            memo: settings.cache.map(|c| Arc::new(Memo::new(c.ttl))),
            coherence: coherence.clone(),
            reads: reads.clone(),
        }
    }

    /// The principal of `token`, or `None` if no such token exists.
    ///
    /// # Errors
    ///
    /// Classified as a lookup's errors are: [`Failure::Overloaded`] when no
    /// connection is free in time, [`Failure::Timeout`] when Postgres
    /// cancelled the statement, else [`Failure::Unavailable`].
    pub async fn principal(&self, token: &str) -> Result<Option<Arc<Principal>>, Failure> {
        self.principal_at(token, None).await
    }

    /// As [`principal`](Self::principal); with a `position` (a write's,
    /// presented by the client), from a database that has replayed it,
    /// past the cache: a token created on another instance works at once.
    ///
    /// # Errors
    ///
    /// As [`principal`](Self::principal).
    pub async fn principal_at(
        &self,
        token: &str,
        position: Option<PgLsn>,
    ) -> Result<Option<Arc<Principal>>, Failure> {
        let digest = digest(token);
        let memo = self
            .memo
            .as_ref()
            .filter(|_| position.is_none() && self.coherence.caches_usable());
        let Some(memo) = memo else {
            return self.lookup.get_at(digest, position).await;
        };
        if let Some(principal) = memo.get(&digest) {
            return Ok(Some(principal));
        }
        // Read before the lookup: see `Memo::put`.
        let generation = memo.generation();
        let found = self.lookup.get(digest).await?;
        if let Some(principal) = &found {
            memo.put(&digest, principal, generation);
        }
        Ok(found)
    }

    /// The tokens of `user` (ids and descriptions, never the tokens).
    ///
    /// # Errors
    ///
    /// As a lookup's: the pool or the database failing.
    pub async fn tokens_of(&self, user: &str) -> Result<Vec<TokenInfo>, Failure> {
        let client = crate::db::lease(self.router.primary())
            .await
            .map_err(PgError::from)?;
        let listed = sql::list_tokens(&**client, Some(user)).await;
        client.settle(&listed);
        Ok(listed.map_err(PgError::from)?)
    }

    /// Revokes the token with id `id` (see [`TokenInfo`]): one of
    /// `caller`'s own, or anyone's when `caller` may write everything. The
    /// token stops working on this instance at once; other instances drop
    /// it from their caches when the change notification reaches them
    /// (see [`crate::service::invalidation`]).
    ///
    /// # Errors
    ///
    /// [`Failure::Invalid`] for a malformed id; [`Failure::NoSuchToken`]
    /// when the caller has no such token (whether someone else does is not
    /// told); else as the database fails.
    pub async fn revoke(&self, caller: &Principal, id: &str) -> Result<(), Failure> {
        input::token_id(id)?;
        let owner = (!caller.may(Action::Write, "*")).then_some(caller.user.as_str());
        let client = crate::db::lease(self.router.primary())
            .await
            .map_err(PgError::from)?;
        let deleted = sql::delete_token(&**client, id, owner).await;
        client.settle(&deleted);
        let digests = deleted.map_err(PgError::from)?;
        if digests.is_empty() {
            return Err(Failure::NoSuchToken(id.to_owned()));
        }
        self.forget(&digests).await;
        Ok(())
    }

    /// A new token for `user`, made as `caller` asks: for themselves, or for
    /// anyone when `caller` may write everything (an admin). It expires when
    /// the caller's own token does, if that one expires: a short-lived
    /// token (or whoever took it) cannot mint one that outlives it. Only
    /// its digest is stored; the token is returned this once. Its id
    /// ([`token_id`]) is the access key id of lakeFS's Basic credentials,
    /// the token their secret.
    ///
    /// # Errors
    ///
    /// [`Failure::Forbidden`] for another user's token without the right
    /// (whether that user exists is not told), or when the caller's token
    /// has just expired; [`Failure::NoSuchUser`]; else as the database
    /// fails.
    pub async fn create_token(
        &self,
        caller: &Principal,
        user: &str,
        description: &str,
    ) -> Result<String, Failure> {
        if caller.user != user && !caller.may(Action::Write, "*") {
            return Err(Failure::Forbidden(format!(
                "user `{}` may not create credentials for user `{user}`",
                caller.user
            )));
        }
        let expires_in = match caller.expires_at_ms {
            None => None,
            Some(at) => {
                let now = unix_millis(std::time::SystemTime::now());
                let left = u64::try_from(at.saturating_sub(now)).unwrap_or(0);
                if left == 0 {
                    return Err(Failure::Forbidden(format!(
                        "the token of user `{}` has expired",
                        caller.user
                    )));
                }
                Some(std::time::Duration::from_millis(left))
            }
        };
        let token = new_token().map_err(Failure::Unavailable)?;
        let client = crate::db::lease(self.router.primary())
            .await
            .map_err(PgError::from)?;
        let inserted =
            sql::insert_token(&**client, &digest(&token), user, description, expires_in).await;
        client.settle(&inserted);
        let stored = inserted.map_err(PgError::from)?;
        // Nothing inserted: a new random token collides with none, so
        // there is no such user.
        if !stored {
            return Err(Failure::NoSuchUser(user.to_owned()));
        }
        Ok(token)
    }

    /// Drops every cached principal (after a user or policy change).
    pub async fn forget_all(&self) {
        // Also without a cache: uncached lookups follow the fill rule.
        self.router.begin_invalidation();
        self.reads.changed(Change::Auth).await;
        self.forget_memo();
    }

    /// Drops the cached principals of tokens with these digests.
    pub async fn forget(&self, digests: &[Vec<u8>]) {
        // Also without a cache: uncached lookups follow the fill rule.
        self.router.begin_invalidation();
        for digest in digests {
            if let Ok(digest) = TokenDigest::try_from(digest.as_slice()) {
                self.reads.changed(Change::Token(&digest)).await;
            }
        }
        self.forget_memo();
    }

    /// All of the memo, after the lookup's cache (see `Memo::invalidate`):
    /// a token's change is rare next to its reads, and the memo is
    /// refilled in one cache lookup per token.
    fn forget_memo(&self) {
        if let Some(memo) = &self.memo {
            memo.invalidate();
        }
    }

    /// The memo's hits, which the token cache's counters leave out.
    pub fn memo_hits(&self) -> u64 {
        self.memo.as_ref().map_or(0, |memo| memo.hits())
    }

    /// The token cache's counters, if the cache is on; its hits count the
    /// memo's.
    pub fn cache_stats(&self) -> Option<pgbatch::cache::CacheStats> {
        self.lookup.cache_stats().map(|mut stats| {
            stats.hits += self.memo_hits();
            stats
        })
    }

    /// Applies the token cache's pending bookkeeping, before reading counts.
    pub async fn sync_cache(&self) {
        self.lookup.sync_cache().await;
    }
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
    let id = sql::insert_user(&tx, name).await.with_context(|| {
        format!("could not create user `{name}` (taken, or not 1-64 of A-Z a-z 0-9 . _ -)")
    })?;
    for (repos, can_write) in [(read, false), (write, true)] {
        for repo in repos {
            sql::grant(&tx, id, repo, can_write)
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
    add_expiring_token(client, user, token, description, None).await
}

/// Like [`add_token`], for a token that stops working `expires_in` from
/// now (`None`: never).
///
/// # Errors
///
/// As [`add_token`].
pub async fn add_expiring_token(
    client: &tokio_postgres::Client,
    user: &str,
    token: &str,
    description: &str,
    expires_in: Option<std::time::Duration>,
) -> anyhow::Result<()> {
    let digest = digest(token);
    if !sql::insert_token(client, &digest, user, description, expires_in).await? {
        // Nothing inserted: no such user, or the token is stored already.
        anyhow::ensure!(
            sql::user_exists(client, user).await?,
            "no user named `{user}`"
        );
    }
    Ok(())
}

/// The admin user created on first start.
pub const ADMIN_USER: &str = "admin";

/// On first start (no users yet), creates user `admin` with read-write
/// access to everything and a token: `preset` if given (for example from
/// an environment variable), else a new random one. Returns the token so
/// the caller can show it once and store it where it chooses. With users
/// present, only makes sure `preset` (if any) is an admin token, and
/// returns `None`.
///
/// # Errors
///
/// When the database fails.
pub async fn bootstrap_admin(
    target: impl Into<Postgres>,
    preset: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let mut client = target.into().connect().await?;
    let created = if sql::any_user(&client).await? {
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
        Some(token)
    };
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::auth::Grant;

    fn principal(grants: &[(&str, bool, bool)]) -> Principal {
        Principal {
            user: "u".into(),
            expires_at_ms: None,
            user_created_at: 0,
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
        assert!(matches!(
            reader.require(Action::Write, "demo"),
            Err(Failure::Forbidden(m)) if m == "user `u` may not write repository `demo`"
        ));
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
