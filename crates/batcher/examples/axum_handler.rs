//! An axum handler holding a batcher in its state: each request asks for
//! one key, and concurrent requests share loads. Overload becomes a 503
//! the client can retry, not a queue that grows.
//!
//! ```sh
//! cargo run -p pgbatch --example axum_handler            # serves on 127.0.0.1:3000
//! curl -i 127.0.0.1:3000/users/7
//! cargo run -p pgbatch --example axum_handler -- --once  # answers one request in process and exits
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use pgbatch::{loader_fn, Batcher, Error};
use tower::ServiceExt as _;

/// The handler's state: cloning a `Batcher` clones a handle to one worker.
type Users = Batcher<u64, String>;

async fn user(State(users): State<Users>, Path(id): Path<u64>) -> Response {
    match users.load(id).await {
        Ok(Some(name)) => Json(serde_json::json!({ "id": id, "name": name })).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "no such user").into_response(),
        // Shed load early, with a hint to retry: the accepted requests
        // still finish in time.
        Err(Error::Overloaded) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "overloaded",
        )
            .into_response(),
        Err(Error::Timeout(_)) => (StatusCode::GATEWAY_TIMEOUT, "timed out").into_response(),
        Err(e) => {
            eprintln!("user {id}: {e}");
            (StatusCode::SERVICE_UNAVAILABLE, "lookup failed").into_response()
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // In a real service: `PgLoader::new(pool, UsersById)` (see the
    // `pg_loader` example).
    let users: Users = Batcher::builder()
        .name("users")
        .timeout(Duration::from_millis(500))
        .channel_capacity(4_096)
        .build(loader_fn(|ids: Vec<u64>| async move {
            Ok::<_, Infallible>(
                ids.into_iter()
                    .filter(|id| *id < 1_000)
                    .map(|id| (id, format!("user {id}")))
                    .collect::<HashMap<_, _>>(),
            )
        }))?;
    let app = Router::new()
        .route("/users/{id}", get(user))
        .with_state(users);

    if std::env::args().any(|a| a == "--once") {
        let request = axum::http::Request::get("/users/7").body(axum::body::Body::empty())?;
        let response = app.oneshot(request).await?;
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await?;
        println!("GET /users/7 -> {}", String::from_utf8_lossy(&body));
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("serving on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
