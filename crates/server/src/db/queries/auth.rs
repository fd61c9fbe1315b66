//! The `users`, `policies` and `tokens` tables.

use std::sync::Arc;

use pgbatch::pg::{BatchQuery, Params};
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Row};

use crate::model::auth::{Grant, Principal, TokenInfo};

/// Principals by token digest: one statement for a batch of digests, each
/// token's user and all their policies in one row (the policies as
/// arrays, in repository order). An expired token is answered with its
/// expiry, so the caller can say so.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrincipalQuery;

impl BatchQuery for PrincipalQuery {
    /// A token's SHA-256 digest.
    type Key = [u8; 32];
    type Value = Arc<Principal>;

    fn batch_sql(&self) -> &str {
        "SELECT t.digest, u.name, \
                coalesce(array_agg(p.repository ORDER BY p.repository) \
                         FILTER (WHERE p.repository IS NOT NULL), '{}'), \
                coalesce(array_agg(p.can_read ORDER BY p.repository) \
                         FILTER (WHERE p.repository IS NOT NULL), '{}'), \
                coalesce(array_agg(p.can_write ORDER BY p.repository) \
                         FILTER (WHERE p.repository IS NOT NULL), '{}'), \
                (extract(epoch FROM t.expires_at) * 1000)::int8, \
                extract(epoch FROM u.created_at)::int8 \
         FROM tokens t JOIN users u ON u.id = t.user_id \
         LEFT JOIN policies p ON p.user_id = u.id \
         WHERE t.digest = ANY($1::bytea[]) \
         GROUP BY t.digest, u.name, t.expires_at, u.created_at"
    }

    fn batch_params<'a>(&self, digests: &'a [[u8; 32]]) -> Params<'a> {
        let digests: Vec<&'a [u8]> = digests.iter().map(<[u8; 32]>::as_slice).collect();
        vec![Box::new(digests)]
    }

    fn map_row(&self, row: &Row) -> Result<([u8; 32], Arc<Principal>), tokio_postgres::Error> {
        let digest: &[u8] = row.try_get(0)?;
        // The table's check keeps every digest at 32 bytes; a row that broke
        // it would answer no key.
        let digest = <[u8; 32]>::try_from(digest).unwrap_or_default();
        let repositories: Vec<String> = row.try_get(2)?;
        let reads: Vec<bool> = row.try_get(3)?;
        let writes: Vec<bool> = row.try_get(4)?;
        let grants = repositories
            .into_iter()
            .zip(reads)
            .zip(writes)
            .map(|((repository, read), write)| Grant {
                repository,
                read,
                write,
            })
            .collect();
        Ok((
            digest,
            Arc::new(Principal {
                user: row.try_get(1)?,
                grants,
                expires_at_ms: row.try_get(5)?,
                user_created_at: row.try_get(6)?,
            }),
        ))
    }
}

/// Whether any user exists.
///
/// # Errors
///
/// When the statement fails.
pub async fn any_user<C: GenericClient>(client: &C) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_typed_opt("SELECT 1 FROM users LIMIT 1", &[])
        .await?
        .is_some())
}

/// Whether user `name` exists.
///
/// # Errors
///
/// When the statement fails.
pub async fn user_exists<C: GenericClient>(
    client: &C,
    name: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_typed_opt(
            "SELECT 1 FROM users WHERE name = $1",
            &[(&name, Type::TEXT)],
        )
        .await?
        .is_some())
}

/// Creates user `name`, returning its id.
///
/// # Errors
///
/// When the name is taken or invalid, or the statement fails.
pub async fn insert_user<C: GenericClient>(
    client: &C,
    name: &str,
) -> Result<i64, tokio_postgres::Error> {
    Ok(client
        .query_typed_one(
            "INSERT INTO users (name) VALUES ($1) RETURNING id",
            &[(&name, Type::TEXT)],
        )
        .await?
        .get(0))
}

/// Lets user `user_id` read `repository` (a name or `*`), and write it if
/// `can_write`; an existing policy keeps any write permission it had.
///
/// # Errors
///
/// When the repository name is invalid, or the statement fails.
pub async fn grant<C: GenericClient>(
    client: &C,
    user_id: i64,
    repository: &str,
    can_write: bool,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute_typed(
            "INSERT INTO policies (user_id, repository, can_read, can_write) VALUES ($1, $2, true, $3) \
             ON CONFLICT (user_id, repository) DO UPDATE SET can_write = policies.can_write OR EXCLUDED.can_write",
            &[
                (&user_id, Type::INT8),
                (&repository, Type::TEXT),
                (&can_write, Type::BOOL),
            ],
        )
        .await?;
    Ok(())
}

/// Stores a token's `digest` for user `user`; `false` if there is no such
/// user or the digest is stored already.
///
/// # Errors
///
/// When the statement fails.
pub async fn insert_token<C: GenericClient>(
    client: &C,
    digest: &[u8],
    user: &str,
    description: &str,
    expires_in: Option<std::time::Duration>,
) -> Result<bool, tokio_postgres::Error> {
    let seconds = expires_in.map(|d| d.as_secs_f64());
    let n = client
        .execute_typed(
            "INSERT INTO tokens (digest, user_id, description, expires_at) \
             SELECT $1, id, $3, now() + $4::float8 * interval '1 second' \
             FROM users WHERE name = $2 ON CONFLICT (digest) DO NOTHING",
            &[
                (&digest, Type::BYTEA),
                (&user, Type::TEXT),
                (&description, Type::TEXT),
                (&seconds, Type::FLOAT8),
            ],
        )
        .await?;
    Ok(n > 0)
}

/// The tokens of `user`, or of every user.
///
/// # Errors
///
/// When the statement fails.
pub async fn list_tokens<C: GenericClient>(
    client: &C,
    user: Option<&str>,
) -> Result<Vec<TokenInfo>, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            "SELECT left(encode(t.digest, 'hex'), 16), u.name, t.description, \
                    extract(epoch FROM t.created_at)::bigint, \
                    extract(epoch FROM t.expires_at)::bigint \
             FROM tokens t JOIN users u ON u.id = t.user_id \
             WHERE $1::text IS NULL OR u.name = $1 \
             ORDER BY u.name, t.created_at",
            &[(&user, Type::TEXT)],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(TokenInfo {
                id: r.try_get(0)?,
                user: r.try_get(1)?,
                description: r.try_get(2)?,
                created_at: r.try_get(3)?,
                expires_at: r.try_get(4)?,
            })
        })
        .collect()
}

/// Deletes the token whose id (16 lowercase hex digits, see [`TokenInfo`])
/// is `id`, if it belongs to `user` (any user with `None`); returns the
/// digests deleted.
///
/// # Errors
///
/// When the statement fails.
pub async fn delete_token<C: GenericClient>(
    client: &C,
    id: &str,
    user: Option<&str>,
) -> Result<Vec<Vec<u8>>, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            "DELETE FROM tokens t USING users u \
             WHERE u.id = t.user_id AND left(encode(t.digest, 'hex'), 16) = $1 \
               AND ($2::text IS NULL OR u.name = $2) \
             RETURNING t.digest",
            &[(&id, Type::TEXT), (&user, Type::TEXT)],
        )
        .await?;
    rows.iter().map(|r| r.try_get(0)).collect()
}

/// Every user's name, with their grants.
///
/// # Errors
///
/// When the statement fails.
pub async fn list_users<C: GenericClient>(
    client: &C,
) -> Result<Vec<(String, Vec<Grant>)>, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            "SELECT u.name, p.repository, p.can_read, p.can_write \
             FROM users u LEFT JOIN policies p ON p.user_id = u.id \
             ORDER BY u.name, p.repository",
            &[],
        )
        .await?;
    let mut users: Vec<(String, Vec<Grant>)> = Vec::new();
    for row in &rows {
        let name: String = row.try_get(0)?;
        if users.last().is_none_or(|(last, _)| *last != name) {
            users.push((name, Vec::new()));
        }
        if let Some(repository) = row.try_get::<_, Option<String>>(1)? {
            let grants = &mut users.last_mut().expect("pushed above").1;
            grants.push(Grant {
                repository,
                read: row.try_get(2)?,
                write: row.try_get(3)?,
            });
        }
    }
    Ok(users)
}

/// Deletes user `name` with their tokens and policies; `false` if there
/// was none. Returns the digests of the tokens deleted with them.
///
/// # Errors
///
/// When the statement fails.
pub async fn delete_user<C: GenericClient>(
    client: &C,
    name: &str,
) -> Result<Option<Vec<Vec<u8>>>, tokio_postgres::Error> {
    let tokens = client
        .query_typed(
            "SELECT t.digest FROM tokens t JOIN users u ON u.id = t.user_id WHERE u.name = $1",
            &[(&name, Type::TEXT)],
        )
        .await?;
    let deleted = client
        .execute_typed("DELETE FROM users WHERE name = $1", &[(&name, Type::TEXT)])
        .await?;
    if deleted == 0 {
        return Ok(None);
    }
    tokens
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map(Some)
}
