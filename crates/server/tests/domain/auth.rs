//! Authentication and authorization against a real Postgres: bearer tokens
//! stored hashed, policies per repository, and the token cache.

use crate::support;

use std::time::Duration;

use crate::support::{client, get, get_as, send, send_full, stat_uri};
use axum::http::StatusCode;
use clap::Parser;
use server::cli::{Cli, Command, TokenCommand, UserCommand};
use server::db::queries::kv::kv_pk;
use server::db::seed::object_path;
use server::domain::auth;
use server::settings::{AuthSettings, CacheSettings, Settings};

/// The default settings with the token cache on or off.
fn auth_cache(on: bool) -> Settings {
    Settings {
        auth: AuthSettings {
            cache: on.then(|| AuthSettings::default().cache).flatten(),
        },
        ..Settings::default()
    }
}

/// Creates a user with `read`/`write` grants and returns a new token.
async fn user_with_token(
    config: &tokio_postgres::Config,
    name: &str,
    read: &[&str],
    write: &[&str],
) -> String {
    let mut c = client(config).await;
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    auth::create_user(&mut c, name, &owned(read), &owned(write))
        .await
        .unwrap();
    let token = auth::new_token().unwrap();
    auth::add_token(&c, name, &token, "test").await.unwrap();
    token
}

#[tokio::test]
async fn requests_without_a_valid_token_are_401_and_health_stays_open() {
    let config = support::database().await;
    for cache in [true, false] {
        let app = support::app_on(&config, &auth_cache(cache)).await;
        let uri = stat_uri("demo", &object_path(1));
        let cases = [
            (None, "missing_token"),
            // Basic is a token's id and the token (lakeFS's clients):
            // `user:pass` names none.
            (Some("Basic dXNlcjpwYXNz"), "unknown_token"),
            (Some("Basic not-base64!"), "malformed_token"),
            (Some("Bearer"), "malformed_token"),
            (Some("Bearer pgb_not-a-real-token"), "unknown_token"),
        ];
        for (header, code) in cases {
            let mut req = axum::http::Request::get(&uri);
            if let Some(h) = header {
                req = req.header("authorization", h);
            }
            let (status, headers, body) =
                send_full(&app.router, req.body(axum::body::Body::empty()).unwrap()).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "cache {cache}, {header:?}: {body}"
            );
            assert_eq!(body["error"]["code"], code, "cache {cache}, {header:?}");
            assert_eq!(headers["www-authenticate"], "Bearer");
        }
        for open in ["/healthz", "/readyz", "/metrics"] {
            let res = tower::ServiceExt::oneshot(app.router.clone(), get_as(open, None))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK, "{open} must not need a token");
        }
    }
}

#[tokio::test]
async fn policies_limit_users_to_their_repositories() {
    let config = support::database().await;
    let token = user_with_token(&config, "reader", &["demo"], &[]).await;
    let app = support::app_on(&config, &Settings::default()).await;
    let as_reader = |uri: &str| get_as(uri, Some(&token));

    let (status, body) = send(&app.router, as_reader(&stat_uri("demo", &object_path(1)))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for uri in [stat_uri("empty", "a"), format!("/api/v1/kv/{}", kv_pk(1))] {
        let (status, body) = send(&app.router, as_reader(&uri)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{uri}: {body}");
        assert_eq!(body["error"]["code"], "forbidden");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("reader"),
            "{body}"
        );
    }
    let post = axum::http::Request::post("/api/v1/repositories/empty/objects/stat")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"paths": ["a"]}"#))
        .unwrap();
    assert_eq!(send(&app.router, post).await.0, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_current_user_route_shows_the_token_owner_and_grants() {
    let config = support::database().await;
    let token = user_with_token(&config, "bob", &["demo"], &["scratch"]).await;
    let app = support::app_on(&config, &auth_cache(true)).await;

    let (status, body) = send(&app.router, get_as("/api/v1/user", Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["user"], "bob");
    let mut grants: Vec<_> = body["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["repository"].as_str().unwrap().to_owned(),
                g["read"].as_bool().unwrap(),
                g["write"].as_bool().unwrap(),
            )
        })
        .collect();
    grants.sort();
    assert_eq!(
        grants,
        [
            ("demo".to_owned(), true, false),
            ("scratch".to_owned(), true, true)
        ]
    );

    let (status, body) = send(&app.router, get("/api/v1/user")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["user"], auth::ADMIN_USER);

    // It needs a token like every /api route; once the token is cached,
    // answering it takes no query.
    let (status, body) = send(&app.router, get_as("/api/v1/user", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "missing_token");
    let before = app.state.auth.cache_stats().unwrap();
    for _ in 0..20 {
        assert_eq!(
            send(&app.router, get_as("/api/v1/user", Some(&token)))
                .await
                .0,
            StatusCode::OK
        );
    }
    let after = app.state.auth.cache_stats().unwrap();
    assert_eq!(after.misses, before.misses, "{after:?}");
    assert_eq!(after.hits, before.hits + 20, "{after:?}");
}

#[tokio::test]
async fn tokens_are_stored_only_as_digests() {
    let config = support::database().await;
    let token = user_with_token(&config, "someone", &["demo"], &[]).await;
    let c = client(&config).await;
    let columns: Vec<String> = c
        .query(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_name = 'tokens' ORDER BY ordinal_position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        columns,
        [
            "digest",
            "user_id",
            "description",
            "created_at",
            "expires_at"
        ]
    );
    let stored: Vec<u8> = c
        .query_one(
            "SELECT t.digest FROM tokens t JOIN users u ON u.id = t.user_id WHERE u.name = 'someone'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, auth::digest(&token));
    let plaintext_anywhere: i64 = c
        .query_one(
            "SELECT count(*) FROM tokens WHERE position(convert_to($1, 'UTF8') IN digest) > 0 \
             OR position($1 IN description) > 0",
            &[&token],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plaintext_anywhere, 0);
}

#[tokio::test]
async fn the_auth_cache_makes_steady_traffic_free_of_token_lookups() {
    let config = support::database().await;
    let app = support::app_on(&config, &auth_cache(true)).await;
    let uri = stat_uri("demo", &object_path(1));

    // A cold token asked by 100 requests at once is looked up once.
    let burst: Vec<_> = (0..100)
        .map(|_| {
            let router = app.router.clone();
            let req = get(&uri);
            tokio::spawn(async move { send(&router, req).await.0 })
        })
        .collect();
    for b in burst {
        assert_eq!(b.await.unwrap(), StatusCode::OK);
    }
    for _ in 0..50 {
        assert_eq!(send(&app.router, get(&uri)).await.0, StatusCode::OK);
    }
    let stats = app.state.auth.cache_stats().expect("cache on");
    assert_eq!(stats.misses, 1, "{stats:?}");
    assert_eq!(stats.hits + stats.coalesced, 149, "{stats:?}");

    let off = support::app_on(&config, &auth_cache(false)).await;
    assert!(off.state.auth.cache_stats().is_none());
    assert_eq!(send(&off.router, get(&uri)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_revoked_token_stops_working_within_the_cache_ttl() {
    let config = support::database().await;
    let token = user_with_token(&config, "leaving", &["demo"], &[]).await;
    let uri = stat_uri("demo", &object_path(1));
    let cached = support::app_on(
        &config,
        &Settings {
            auth: AuthSettings {
                cache: Some(CacheSettings {
                    ttl: Duration::from_millis(200),
                    jitter: Duration::ZERO,
                    ..AuthSettings::default().cache.unwrap()
                }),
            },
            ..Settings::default()
        },
    )
    .await;
    let uncached = support::app_on(&config, &auth_cache(false)).await;
    for app in [&cached, &uncached] {
        assert_eq!(
            send(&app.router, get_as(&uri, Some(&token))).await.0,
            StatusCode::OK
        );
    }
    client(&config)
        .await
        .execute(
            "DELETE FROM tokens WHERE digest = $1",
            &[&auth::digest(&token).as_slice()],
        )
        .await
        .unwrap();
    assert_eq!(
        send(&uncached.router, get_as(&uri, Some(&token))).await.0,
        StatusCode::UNAUTHORIZED,
        "without the cache, revocation is immediate"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        send(&cached.router, get_as(&uri, Some(&token))).await.0,
        StatusCode::UNAUTHORIZED,
        "with the cache, revocation takes effect once the entry expires"
    );
}

/// What the invalidation listener calls when another instance changes
/// tokens or policies: it takes effect on the next request, though the
/// token was just used (so its principal is in the memo in front of the
/// cache as well as in the cache). Users and rows are changed with
/// triggers off, so no notification races the calls made here.
#[tokio::test]
async fn forgetting_a_token_or_all_principals_takes_effect_on_the_next_request() {
    let config = support::database().await;
    let app = support::app_on(&config, &auth_cache(true)).await;
    let mut c = client(&config).await;
    c.batch_execute("SET session_replication_role = replica")
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for name in ["dana", "erin"] {
        auth::create_user(&mut c, name, &["demo".to_owned()], &[])
            .await
            .unwrap();
        let token = auth::new_token().unwrap();
        auth::add_token(&c, name, &token, "test").await.unwrap();
        tokens.push(token);
    }
    let [dana, erin] = <[String; 2]>::try_from(tokens).unwrap();
    let uri = stat_uri("demo", &object_path(1));
    let status = |token: &str| {
        let request = get_as(&uri, Some(token));
        async { send(&app.router, request).await.0 }
    };
    for _ in 0..3 {
        assert_eq!(status(&dana).await, StatusCode::OK);
        assert_eq!(status(&erin).await, StatusCode::OK);
    }

    let digest = auth::digest(&dana);
    c.execute(
        "DELETE FROM tokens WHERE digest = $1",
        &[&digest.as_slice()],
    )
    .await
    .unwrap();
    assert_eq!(status(&dana).await, StatusCode::OK, "still cached");
    app.state.auth.forget(&[digest.to_vec()]).await;
    assert_eq!(status(&dana).await, StatusCode::UNAUTHORIZED, "forgotten");

    c.execute(
        "DELETE FROM policies WHERE user_id = (SELECT id FROM users WHERE name = 'erin')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(status(&erin).await, StatusCode::OK, "still cached");
    app.state.auth.forget_all().await;
    assert_eq!(status(&erin).await, StatusCode::FORBIDDEN, "forgotten");
}

/// The token file itself is `main`'s, tested there: written once, for its
/// owner only.
#[tokio::test]
async fn the_first_start_creates_an_admin_and_returns_its_token_once() {
    let db = embedded_pg::testing::database().await.unwrap();
    server::db::migrate(&db.config).await.unwrap();

    let token = auth::bootstrap_admin(&db.config, None)
        .await
        .unwrap()
        .expect("created");
    assert!(token.starts_with("pgb_"));
    assert_eq!(auth::bootstrap_admin(&db.config, None).await.unwrap(), None);

    let app = support::app_on(&db.config, &Settings::default()).await;
    let principal = app
        .state
        .auth
        .principal(&token)
        .await
        .unwrap()
        .expect("admin");
    assert_eq!(principal.user, auth::ADMIN_USER);
    assert!(principal.may(auth::Action::Write, "anything"));

    // A preset token given later is accepted as an admin token too.
    auth::bootstrap_admin(&db.config, Some("preset-token"))
        .await
        .unwrap();
    assert!(app
        .state
        .auth
        .principal("preset-token")
        .await
        .unwrap()
        .is_some());
}

#[test]
fn the_admin_cli_parses() {
    let cli = Cli::parse_from([
        "server", "user", "create", "bob", "--read", "demo", "--write", "logs",
    ]);
    let Some(Command::User(UserCommand::Create { name, read, write })) = cli.command else {
        panic!("not a user command");
    };
    assert_eq!(
        (name.as_str(), read, write),
        ("bob", vec!["demo".to_owned()], vec!["logs".to_owned()])
    );
    let cli = Cli::parse_from(["server", "token", "create", "bob", "--description", "ci"]);
    assert!(matches!(
        cli.command,
        Some(Command::Token(TokenCommand::Create {
            expires_in: None,
            ..
        }))
    ));
    let cli = Cli::parse_from(["server", "token", "create", "bob", "--expires-in", "90d"]);
    let Some(Command::Token(TokenCommand::Create { expires_in, .. })) = cli.command else {
        panic!("not a token command");
    };
    assert_eq!(expires_in, Some(Duration::from_secs(90 * 86_400)));
    for bad in ["90", "d", "+1d", "1y", "0s", "1.5h", "99999999999999999d"] {
        let err = Cli::try_parse_from(["server", "token", "create", "bob", "--expires-in", bad])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--expires-in"), "{bad}: {err}");
    }
}

#[tokio::test]
async fn an_expiring_token_is_refused_at_its_expiry_even_while_cached() {
    let app = support::setup(&auth_cache(true)).await;
    let c = client(&app.config).await;
    auth::create_user(
        &mut client(&app.config).await,
        "temp",
        &["demo".to_owned()],
        &[],
    )
    .await
    .unwrap();
    let token = auth::new_token().unwrap();
    auth::add_expiring_token(&c, "temp", &token, "short", Some(Duration::from_secs(2)))
        .await
        .unwrap();
    let stat = stat_uri("demo", &object_path(1));
    assert_eq!(
        send(&app.router, get_as(&stat, Some(&token))).await.0,
        StatusCode::OK,
        "valid until it expires; now cached for the cache's TTL (20 s)"
    );
    let listed = send(&app.router, get_as("/api/v1/user/tokens", Some(&token)))
        .await
        .1;
    let expires_at = listed["tokens"][0]["expires_at"].as_i64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now..=now + 3).contains(&expires_at), "{listed}");

    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let (status, body) = send(&app.router, get_as(&stat, Some(&token))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "expired_token");
    // A token without expiry lists `null`.
    let admin = send(&app.router, get("/api/v1/user/tokens")).await.1;
    assert!(admin["tokens"][0]["expires_at"].is_null(), "{admin}");
}

#[tokio::test]
async fn creating_users_and_tokens_reports_bad_input() {
    let config = support::database().await;
    let mut c = client(&config).await;
    let err = auth::create_user(&mut c, "bad name!", &[], &[])
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("could not create user"),
        "{err:#}"
    );
    let err = auth::create_user(&mut c, "ok-name", &["Not_A_Repo".to_owned()], &[])
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("invalid repository"), "{err:#}");
    let err = auth::add_token(&c, "nobody", "t", "").await.unwrap_err();
    assert!(err.to_string().contains("no user named `nobody`"), "{err}");
}

/// A DELETE with `token`.
fn delete_as(uri: &str, token: &str) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::delete(uri)
        .header("authorization", format!("Bearer {token}"))
        .body(axum::body::Body::empty())
        .unwrap()
}

#[tokio::test]
async fn a_user_lists_and_revokes_their_tokens_and_revocation_is_immediate() {
    // With the token cache on: revocation must not wait for the TTL.
    let app = support::setup(&auth_cache(true)).await;
    let alice = user_with_token(&app.config, "alice", &["demo"], &[]).await;
    let alice_laptop = {
        let c = client(&app.config).await;
        let token = auth::new_token().unwrap();
        auth::add_token(&c, "alice", &token, "laptop")
            .await
            .unwrap();
        token
    };
    let bob = user_with_token(&app.config, "bob", &["demo"], &[]).await;
    let stat = stat_uri("demo", &object_path(1));
    // Both of alice's tokens are cached now.
    assert_eq!(
        send(&app.router, get_as(&stat, Some(&alice))).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app.router, get_as(&stat, Some(&alice_laptop)))
            .await
            .0,
        StatusCode::OK
    );

    let (status, body) = send(&app.router, get_as("/api/v1/user/tokens", Some(&alice))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tokens = body["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 2, "only alice's own: {body}");
    assert!(tokens.iter().all(|t| t["user"] == "alice"));
    assert!(!body.to_string().contains(&alice), "never the token itself");
    let laptop = tokens
        .iter()
        .find(|t| t["description"] == "laptop")
        .unwrap();
    let laptop_id = laptop["id"].as_str().unwrap().to_owned();
    assert_eq!(laptop_id.len(), 16);

    // Bob can neither see nor revoke alice's token.
    let bob_tokens = send(&app.router, get_as("/api/v1/user/tokens", Some(&bob)))
        .await
        .1;
    assert!(!bob_tokens.to_string().contains(&laptop_id));
    let uri = format!("/api/v1/user/tokens/{laptop_id}");
    let (status, body) = send(&app.router, delete_as(&uri, &bob)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "token_not_found");

    // Alice revokes it: refused at once, though it was cached; her other
    // token still works.
    assert_eq!(
        send(&app.router, delete_as(&uri, &alice)).await.0,
        StatusCode::NO_CONTENT
    );
    let (status, body) = send(&app.router, get_as(&stat, Some(&alice_laptop))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(
        send(&app.router, get_as(&stat, Some(&alice))).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app.router, delete_as(&uri, &alice)).await.0,
        StatusCode::NOT_FOUND
    );

    // The admin may revoke anyone's.
    let bob_id = bob_tokens["tokens"][0]["id"].as_str().unwrap().to_owned();
    let uri = format!("/api/v1/user/tokens/{bob_id}");
    let (status, _) = send(&app.router, delete_as(&uri, support::ADMIN_TOKEN)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        send(&app.router, get_as(&stat, Some(&bob))).await.0,
        StatusCode::UNAUTHORIZED
    );

    let (status, body) = send(&app.router, delete_as("/api/v1/user/tokens/XYZ", &alice)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_token_id");
}
