//! What lakeFS's clients ask before anything else: the server's
//! configuration and version, who they are, and health.

use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::shapes::{CurrentUser, User};
use crate::extract::Caller;

/// The storage this service describes to lakeFS's clients: any namespace
/// the service stores, no pre-signed URLs (no data moves through it), no
/// import from object stores.
fn storage_config() -> Value {
    let namespaces = "^(s3|gs|azure|https?|mem|local|transient)://";
    json!({
        "blockstore_type": "s3",
        "blockstore_namespace_example": "s3://example-bucket/",
        "blockstore_namespace_ValidityRegex": namespaces,
        "pre_sign_support": false,
        "pre_sign_support_ui": false,
        "import_support": false,
        "import_validity_regex": namespaces,
        "blockstore_id": "",
        "default_namespace_prefix": "",
    })
}

fn version_config() -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        // lakectl warns about an "enterprise" server otherwise.
        "version_context": "lakeFS",
        "upgrade_recommended": false,
    })
}

/// `GET /config` (getConfig).
pub(crate) async fn config(_: Caller) -> Json<Value> {
    Json(json!({
        "storage_config": storage_config(),
        "storage_config_list": [],
        "version_config": version_config(),
        "ui_config": {},
        "capabilities_config": {},
    }))
}

/// `GET /config/version` (getLakeFSVersion, deprecated).
pub(crate) async fn version(_: Caller) -> Json<Value> {
    Json(version_config())
}

/// `GET /config/storage` (getStorageConfig, deprecated).
pub(crate) async fn storage(_: Caller) -> Json<Value> {
    Json(storage_config())
}

/// `GET /user` (getCurrentUser): `{user: {id, creation_date}}`.
pub(crate) async fn current_user(Caller(caller): Caller) -> Json<CurrentUser> {
    Json(CurrentUser {
        user: User {
            id: caller.user.clone(),
            creation_date: caller.user_created_at,
        },
    })
}

/// `POST /statistics` (what lakectl sends before each command): taken and
/// dropped.
pub(crate) async fn statistics(_: Caller) -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `GET /healthcheck` (no credentials needed): 204 while the process is up.
pub(crate) async fn healthcheck() -> StatusCode {
    StatusCode::NO_CONTENT
}
