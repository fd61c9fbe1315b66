//! A fresh, migrated and seeded database per test, and an app over it.
#![allow(dead_code, unreachable_pub, missing_docs)]

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use server::settings::{CacheSettings, ReadPath, ReadSettings, Settings};
use server::{app, AppState};
use tower::ServiceExt;

pub mod http1;

/// Demo objects and `random_read_test` rows in every test database.
pub const SEEDED: u64 = 300;
/// The admin token of every test database.
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// Every read path.
pub const READ_PATHS: [ReadPath; 3] = [ReadPath::Naive, ReadPath::Batched, ReadPath::Cached];

pub struct TestApp {
    pub router: Router,
    pub state: AppState,
    pub config: tokio_postgres::Config,
}

/// A connection to `config`, driven by a task of its own.
pub async fn client(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// A migrated database seeded with [`SEEDED`] objects in repository `demo`
/// and as many `random_read_test` rows, plus an empty repository `empty`.
pub async fn database() -> tokio_postgres::Config {
    let config = server::testing::seeded_database(SEEDED, SEEDED, ADMIN_TOKEN)
        .await
        .expect("seeded test database");
    let client = client(&config).await;
    server::db::queries::repositories::insert(&client, "empty", "s3://e/")
        .await
        .unwrap()
        .expect("a new repository");
    config
}

/// The default settings with reads through `path`.
pub fn read_path(path: ReadPath) -> Settings {
    Settings {
        read: ReadSettings {
            path,
            // The tests prime a cache with one read, to see what a stored
            // value does next; the default (second miss) is tested apart.
            cache: CacheSettings {
                admission: pgbatch::cache::Admission::Always,
                ..CacheSettings::default()
            },
            ..ReadSettings::default()
        },
        ..Settings::default()
    }
}

/// `config` as `key=value` connection settings (host, port, user,
/// password, dbname), for a `DATABASE_URL`: the test cluster is reached
/// over a Unix socket, which a URL spells awkwardly.
pub fn key_values(config: &tokio_postgres::Config) -> String {
    let mut parts = Vec::new();
    for host in config.get_hosts() {
        match host {
            tokio_postgres::config::Host::Tcp(name) => parts.push(format!("host={name}")),
            tokio_postgres::config::Host::Unix(path) => {
                parts.push(format!("host={}", path.display()));
            }
        }
    }
    if let Some(port) = config.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = config.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(password) = config.get_password() {
        let password = String::from_utf8_lossy(password)
            .replace('\\', "\\\\")
            .replace('\'', "\\'");
        parts.push(format!("password='{password}'"));
    }
    if let Some(dbname) = config.get_dbname() {
        parts.push(format!("dbname={dbname}"));
    }
    parts.join(" ")
}

/// An app over `target` (a config, or a config with its TLS connector)
/// with `settings`, on a read pool of 4 connections.
pub async fn app_on(target: impl Into<server::db::Postgres>, settings: &Settings) -> TestApp {
    let target = target.into();
    let state = AppState::connect(&target, 4, settings).expect("valid settings");
    // The caches are bypassed until the invalidation listener is up: wait
    // for it (or for it to fail, on a database that is not there).
    let start = std::time::Instant::now();
    while state.coherence.connects() == 0
        && state.coherence.failures() == 0
        && start.elapsed() < std::time::Duration::from_secs(10)
    {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    TestApp {
        router: app(state.clone()),
        state,
        config: target.config,
    }
}

pub async fn setup(settings: &Settings) -> TestApp {
    let config = database().await;
    app_on(&config, settings).await
}

/// The status, and the body parsed as JSON (`Null` if it is not JSON).
pub async fn send(router: &Router, req: Request<Body>) -> (StatusCode, serde_json::Value) {
    let (status, _, body) = send_full(router, req).await;
    (status, body)
}

pub async fn send_full(
    router: &Router,
    req: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
    let res: Response<Body> = router.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, headers, json)
}

/// A GET with the admin token.
pub fn get(uri: &str) -> Request<Body> {
    get_as(uri, Some(ADMIN_TOKEN))
}

/// A GET with `token` (`None`: no Authorization header).
pub fn get_as(uri: &str, token: Option<&str>) -> Request<Body> {
    let mut req = Request::get(uri);
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    req.body(Body::empty()).unwrap()
}

/// A JSON POST with the admin token.
pub fn post_json(uri: &str, body: impl Into<String>) -> Request<Body> {
    Request::post(uri)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Body::from(body.into()))
        .unwrap()
}

/// Sends each request and checks its status, error code, and that the
/// message mentions `says`.
pub async fn assert_error_cases(
    router: &Router,
    cases: Vec<(Request<Body>, StatusCode, &str, &str)>,
) {
    for (req, status, code, says) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let (got, body) = send(router, req).await;
        assert_eq!(got, status, "{what}: {body}");
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(says),
            "{what}: message {message:?} should mention {says:?}"
        );
    }
}

/// How many objects `repo` holds, straight from the database.
pub async fn objects_in(config: &tokio_postgres::Config, repo: &str) -> i64 {
    client(config)
        .await
        .query_one(
            "SELECT count(*) FROM objects WHERE repository = $1",
            &[&repo],
        )
        .await
        .unwrap()
        .get(0)
}

pub fn stat_uri(repo: &str, raw_path_query: &str) -> String {
    format!("/api/v1/repositories/{repo}/objects/stat?path={raw_path_query}")
}

/// The admin's `PUT` of an object at `path` in `demo` with `address`.
pub fn put_object(path: &str, address: &str) -> Request<Body> {
    let body = serde_json::json!({
        "physical_address": address,
        "size_bytes": 1,
        "checksum": "c",
    });
    Request::put(format!("/api/v1/repositories/demo/objects?path={path}"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// A new user `name` who may read repository `demo`, and a new
/// token of theirs (description `laptop`), created in `config`'s database.
pub async fn user_with_token(config: &tokio_postgres::Config, name: &str) -> String {
    let mut c = client(config).await;
    server::domain::auth::create_user(&mut c, name, &["demo".to_owned()], &[])
        .await
        .unwrap();
    let token = server::domain::auth::new_token().unwrap();
    server::domain::auth::add_token(&c, name, &token, "laptop")
        .await
        .unwrap();
    token
}

/// The `/metrics` page of `router`.
pub async fn metrics_text(router: &Router) -> String {
    let res = router.clone().oneshot(get("/metrics")).await.unwrap();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The text of the sample `sample`'s value (name and labels, as
/// exported) in a scrape's text, if it is there.
pub fn metric_text<'a>(metrics: &'a str, sample: &str) -> Option<&'a str> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map(str::trim)
}

/// The value of the sample `sample` (name and labels, as exported) in a
/// scrape's text; panics, showing the scrape, when it is not there.
pub fn metric_value(metrics: &str, sample: &str) -> u64 {
    metric_text(metrics, sample)
        .unwrap_or_else(|| panic!("no {sample} in:\n{metrics}"))
        .parse()
        .unwrap()
}

/// The python of a tool's private virtual environment, made (once) by the
/// project's script `scripts/<script>`, which prints it.
pub fn venv_python(script: &str) -> std::path::PathBuf {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join("scripts").join(script))
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{script}: {e}"));
    assert!(
        out.status.success(),
        "scripts/{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `router` served on a loopback port through the service's own HTTP
/// edge, for clients in other processes, until [`stop`](Self::stop).
pub struct LiveServer {
    pub addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl LiveServer {
    pub async fn start(router: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server::http::serve::serve(
            listener,
            router,
            server::http::serve::EdgeSettings::default(),
            async {
                let _ = stopped.await;
            },
        ));
        Self { addr, stop, task }
    }

    /// Stops serving, after the requests in flight.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Polls `done` every millisecond until it holds; panics naming `what`
/// after 20 s (background work such as a listener or a replica poll).
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "never: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// The `physical_address` of object `path` of repository `demo`, read
/// through `router` (200 expected).
pub async fn physical_address(router: &Router, path: &str) -> String {
    let (status, body) = send(router, get(&stat_uri("demo", path))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["physical_address"].as_str().unwrap().to_owned()
}
