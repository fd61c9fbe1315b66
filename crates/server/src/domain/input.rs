//! Validation of request input, so bad input is a 400 that names the
//! problem, never a 500 or a silently altered lookup. Every check returns
//! [`Failure::Invalid`] with the code the API documents.

use percent_encoding::percent_decode;
use pgbatch::pg::copy::ConflictPolicy;

use crate::db::queries::objects::ObjectRow;
use crate::domain::failure::Failure;

/// The longest object path accepted, in bytes (as lakeFS).
pub const MAX_PATH_BYTES: usize = 1024;
/// The longest `random_read_test` key accepted, in bytes.
pub const MAX_PK_BYTES: usize = 256;

/// [`repository`]'s rule as a regular expression, for the OpenAPI
/// document.
pub const REPOSITORY_NAME_PATTERN: &str = "^[a-z0-9][a-z0-9-]{2,62}$";
/// Text without NUL bytes (paths and the other text fields), for the
/// OpenAPI document.
pub const NO_NUL_PATTERN: &str = "^[^\\x00]*$";
/// [`pk`]'s rule, for the OpenAPI document: no control characters.
pub const KEY_PATTERN: &str = "^[^\\x00-\\x1f\\x7f-\\x9f]+$";
/// [`token_id`]'s rule, for the OpenAPI document.
pub const TOKEN_ID_PATTERN: &str = "^[0-9a-f]{16}$";

/// Checks a repository name: 3 to 63 characters of `a-z`, `0-9` and `-`,
/// not starting with `-` (the rule of the `repositories` table).
pub fn repository(name: &str) -> Result<(), Failure> {
    let bytes = name.as_bytes();
    let ok = (3..=63).contains(&bytes.len())
        && bytes[0] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Failure::invalid(
            "invalid_repository_name",
            "repository names are 3 to 63 characters of a-z, 0-9 and '-', not starting with '-'",
        ))
    }
}

/// Checks a user name: 1 to 64 characters of `A-Z`, `a-z`, `0-9`, `.`,
/// `_` and `-`, starting with a letter or digit (the rule of the `users`
/// table).
pub fn user_name(name: &str) -> Result<(), Failure> {
    let bytes = name.as_bytes();
    let ok = (1..=64).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        return Ok(());
    }
    Err(Failure::invalid(
        "invalid_user_name",
        "a user name is 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-', \
         starting with a letter or digit",
    ))
}

/// Checks an object path; `what` names it in the message (`path`,
/// `paths[3]`).
pub fn object_path(path: &str, what: &str) -> Result<(), Failure> {
    let problem = if path.is_empty() {
        format!("{what} must not be empty")
    } else if path.len() > MAX_PATH_BYTES {
        format!(
            "{what} is {} bytes long; the limit is {MAX_PATH_BYTES}",
            path.len()
        )
    } else if path.contains('\0') {
        format!("{what} must not contain NUL bytes")
    } else {
        return Ok(());
    };
    Err(Failure::invalid("invalid_path", problem))
}

/// The required query parameter `path`, decoded strictly and checked.
///
/// # Errors
///
/// `missing_path`, or as [`query_param`] and [`object_path`].
pub fn required_path(raw_query: Option<&str>) -> Result<String, Failure> {
    let path = query_param(raw_query, "path")?
        .ok_or_else(|| Failure::invalid("missing_path", "query parameter `path` is required"))?;
    object_path(&path, "path")?;
    Ok(path)
}

/// Checks the paths of one `POST .../objects/stat`: 1 to `max` of them,
/// each a valid object path.
///
/// # Errors
///
/// `empty_paths`, `too_many_paths`, or `invalid_path` naming the index.
pub fn stat_paths(paths: &[String], max: usize) -> Result<(), Failure> {
    if paths.is_empty() {
        return Err(Failure::invalid("empty_paths", "`paths` must not be empty"));
    }
    if paths.len() > max {
        return Err(Failure::invalid(
            "too_many_paths",
            format!("at most {max} paths per request, got {}", paths.len()),
        ));
    }
    for (i, path) in paths.iter().enumerate() {
        object_path(path, &format!("paths[{i}]"))?;
    }
    Ok(())
}

/// The import's conflict policy from query parameter `policy` (`skip` when
/// absent).
///
/// # Errors
///
/// `invalid_policy`, or as [`query_param`].
pub fn conflict_policy(raw_query: Option<&str>) -> Result<ConflictPolicy, Failure> {
    let Some(given) = query_param(raw_query, "policy")? else {
        return Ok(ConflictPolicy::Skip);
    };
    CONFLICT_POLICIES
        .iter()
        .find(|(name, _)| *name == given)
        .map(|&(_, policy)| policy)
        .ok_or_else(|| {
            Failure::invalid(
                "invalid_policy",
                format!("`policy` is skip, overwrite or fail, not `{given}`"),
            )
        })
}

/// An import's `policy` values as the query string spells them (also the
/// OpenAPI document's enum); none given is `skip`.
pub const CONFLICT_POLICIES: [(&str, ConflictPolicy); 3] = [
    ("skip", ConflictPolicy::Skip),
    ("overwrite", ConflictPolicy::Overwrite),
    ("fail", ConflictPolicy::Fail),
];

/// Checks a `random_read_test` key.
pub fn pk(pk: &str) -> Result<(), Failure> {
    if pk.is_empty() || pk.len() > MAX_PK_BYTES || pk.chars().any(char::is_control) {
        return Err(Failure::invalid(
            "invalid_key",
            format!("keys are 1 to {MAX_PK_BYTES} bytes without control characters"),
        ));
    }
    Ok(())
}

/// The value of query parameter `name`, decoded strictly.
///
/// Hand-written because the usual decoders are lenient by design (WHATWG
/// form decoding): they pass a malformed escape such as `%zz` through as
/// text and replace invalid UTF-8 with U+FFFD, so a client's bad input would
/// silently become a lookup of some other path. Here both are errors.
///
/// # Errors
///
/// 400 for a malformed escape, invalid UTF-8, or a repeated parameter.
pub fn query_param(raw_query: Option<&str>, name: &str) -> Result<Option<String>, Failure> {
    let mut found = None;
    for pair in raw_query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        if decode_component(raw_key)? != name {
            continue;
        }
        if found.is_some() {
            return Err(Failure::invalid(
                "invalid_query",
                format!("query parameter `{name}` is given more than once"),
            ));
        }
        found = Some(decode_component(raw_value).map_err(|e| {
            Failure::invalid("invalid_query", format!("query parameter `{name}`: {e}"))
        })?);
    }
    Ok(found)
}

/// Longest accepted physical address, checksum or content type, in bytes.
pub const MAX_FIELD_BYTES: usize = 2048;
/// Most entries in an object's user metadata.
pub const MAX_METADATA_ENTRIES: usize = 64;

/// A JSON integer, as JSON Schema counts them: `2516154.0` is one too (a
/// number whose fraction is zero), which serde's `i64` refuses but a
/// client generated from the OpenAPI document (`type: integer`) may send.
///
/// # Errors
///
/// When the value is not a number, has a fraction, or is out of `i64`'s
/// range.
pub fn json_integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::de::Error as _;
    let n = <serde_json::Number as serde::Deserialize>::deserialize(d)?;
    if let Some(i) = n.as_i64() {
        return Ok(i);
    }
    // i64::MAX as f64 rounds up to 2^63, which is out of range.
    const BOUND: f64 = 9_223_372_036_854_775_808.0;
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && (-BOUND..BOUND).contains(&f) => Ok(f as i64),
        _ => Err(D::Error::custom(format!(
            "invalid value: `{n}`, expected an integer from {} to {}",
            i64::MIN,
            i64::MAX
        ))),
    }
}

/// An object's fields as a client sends them: the body of `PUT
/// .../objects?path=P`, or one line of an import (which also names the
/// `path`).
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectBody {
    /// Only in import lines; a `PUT` takes the path from its query string.
    #[serde(default)]
    pub path: Option<String>,
    /// Where the object's data is stored.
    pub physical_address: String,
    /// Size of the data in bytes, at least 0.
    #[serde(deserialize_with = "json_integer")]
    pub size_bytes: i64,
    /// The data's checksum.
    pub checksum: String,
    /// MIME type; `application/octet-stream` when absent.
    #[serde(default)]
    pub content_type: Option<String>,
    /// User metadata: an object of string values.
    #[serde(default)]
    #[schema(value_type = Option<std::collections::HashMap<String, String>>)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ObjectBody {
    /// The row a `PUT` of `path` in `repository` writes.
    ///
    /// # Errors
    ///
    /// `invalid_body` naming the first invalid field, or a `path` in the
    /// body.
    pub fn into_put_row(self, repository: &str, path: String) -> Result<ObjectRow, Failure> {
        if self.path.is_some() {
            return Err(Failure::invalid(
                "invalid_body",
                "`path` goes in the query string, not the body",
            ));
        }
        self.into_row(repository, path)
            .map_err(|m| Failure::invalid("invalid_body", m))
    }

    /// Checks the fields and makes the row to write at `repository`/`path`.
    ///
    /// # Errors
    ///
    /// A message naming the first invalid field.
    pub fn into_row(self, repository: &str, path: String) -> Result<ObjectRow, String> {
        let text = |name: &str, value: &str, required: bool| {
            if required && value.is_empty() {
                Err(format!("`{name}` must not be empty"))
            } else if value.len() > MAX_FIELD_BYTES {
                Err(format!("`{name}` is longer than {MAX_FIELD_BYTES} bytes"))
            } else if value.contains('\0') {
                Err(format!("`{name}` must not contain NUL bytes"))
            } else {
                Ok(())
            }
        };
        text("physical_address", &self.physical_address, true)?;
        text("checksum", &self.checksum, true)?;
        let content_type = self
            .content_type
            .unwrap_or_else(|| "application/octet-stream".to_owned());
        text("content_type", &content_type, true)?;
        if self.size_bytes < 0 {
            return Err("`size_bytes` must not be negative".to_owned());
        }
        let metadata = self.metadata.unwrap_or_default();
        if metadata.len() > MAX_METADATA_ENTRIES {
            return Err(format!(
                "`metadata` has more than {MAX_METADATA_ENTRIES} entries"
            ));
        }
        for (key, value) in &metadata {
            text("metadata key", key, true)?;
            let serde_json::Value::String(v) = value else {
                return Err(format!("`metadata.{key}` must be a string"));
            };
            text("metadata value", v, false)?;
        }
        Ok(ObjectRow {
            repository: repository.to_owned(),
            path,
            physical_address: self.physical_address,
            size_bytes: self.size_bytes,
            checksum: self.checksum,
            content_type,
            metadata: serde_json::Value::Object(metadata),
            mtime: None,
        })
    }
}

/// Checks a storage namespace (where a repository's data lives).
///
/// # Errors
///
/// 400 naming the problem.
pub fn storage_namespace(ns: &str) -> Result<(), Failure> {
    if ns.is_empty() || ns.len() > MAX_FIELD_BYTES || ns.contains('\0') {
        return Err(Failure::invalid(
            "invalid_storage_namespace",
            format!("`storage_namespace` must be 1 to {MAX_FIELD_BYTES} bytes without NUL"),
        ));
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum DecodeError {
    #[error("malformed percent-encoding (`%` must be followed by two hex digits)")]
    BadEscape,
    #[error("not valid UTF-8 once percent-decoded")]
    NotUtf8,
}

impl From<DecodeError> for Failure {
    fn from(e: DecodeError) -> Self {
        Failure::invalid("invalid_query", e.to_string())
    }
}

/// Checks that every `%` in `raw` starts a two-hex-digit escape.
fn check_escapes(raw: &str) -> Result<(), DecodeError> {
    let bytes = raw.as_bytes();
    for (i, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'%') {
        let hex = bytes.get(i + 1..i + 3).unwrap_or(&[]);
        if hex.len() != 2 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return Err(DecodeError::BadEscape);
        }
    }
    Ok(())
}

/// Checks a token id: the 16 lowercase hex digits `token list` and
/// `GET /api/v1/user/tokens` show.
///
/// # Errors
///
/// [`Failure::Invalid`] with code `invalid_token_id`.
pub fn token_id(id: &str) -> Result<(), Failure> {
    if id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(Failure::invalid(
            "invalid_token_id",
            "a token id is 16 lowercase hex digits, as the token list shows",
        ))
    }
}

/// Checks a request path's percent-escapes as strictly as a query
/// string's: axum's `Path` keeps a malformed escape such as `%ZZ` as
/// literal text, which would look up a key nobody meant.
///
/// # Errors
///
/// [`Failure::Invalid`] with code `invalid_path_parameter`.
pub fn path_escapes(raw_path: &str) -> Result<(), Failure> {
    check_escapes(raw_path).map_err(|e| Failure::invalid("invalid_path_parameter", e.to_string()))
}

/// Decodes one `application/x-www-form-urlencoded` component strictly.
fn decode_component(raw: &str) -> Result<String, DecodeError> {
    check_escapes(raw)?;
    let bytes = raw.as_bytes();
    let plus_as_space: Vec<u8> = bytes
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    let decoded: Vec<u8> = percent_decode(&plus_as_space).collect();
    String::from_utf8(decoded).map_err(|_| DecodeError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_as_the_users_table_has_them() {
        for ok in ["a", "Alice.B_c-1", &"x".repeat(64)] {
            assert!(user_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".a", "-a", "_a", "a b", "é", &"x".repeat(65)] {
            assert!(user_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn integers_as_json_schema_counts_them() {
        let size = |v: &str| {
            serde_json::from_str::<ObjectBody>(&format!(
                r#"{{"physical_address": "a", "checksum": "c", "size_bytes": {v}}}"#
            ))
            .map(|b| b.size_bytes)
            .map_err(|e| e.to_string())
        };
        assert_eq!(size("7"), Ok(7));
        assert_eq!(size("2516154.0"), Ok(2_516_154));
        assert_eq!(size("-0.0"), Ok(0));
        assert_eq!(size("9223372036854775807"), Ok(i64::MAX));
        assert_eq!(size("1e3"), Ok(1000));
        for bad in ["1.5", "1e19", "9223372036854775808", "\"7\"", "null"] {
            assert!(size(bad).is_err(), "{bad}: {:?}", size(bad));
        }
    }

    fn param(q: &str) -> Result<Option<String>, String> {
        query_param(Some(q), "path").map_err(|e| match e {
            Failure::Invalid { code, .. } => code.to_owned(),
            other => panic!("not an input error: {other}"),
        })
    }

    #[test]
    fn decodes_escapes_plus_and_utf8() {
        assert_eq!(param("path=a%2Fb+c").unwrap().as_deref(), Some("a/b c"));
        assert_eq!(
            param("x=1&path=%C3%A9t%C3%A9").unwrap().as_deref(),
            Some("été")
        );
        assert_eq!(param("path=").unwrap().as_deref(), Some(""));
        assert_eq!(param("other=1").unwrap(), None);
        assert_eq!(query_param(None, "path").unwrap(), None);
    }

    #[test]
    fn rejects_malformed_escapes_bad_utf8_and_repeats() {
        for q in [
            "path=%zz",
            "path=abc%",
            "path=%4",
            "path=%C3%28",
            "path=a&path=b",
        ] {
            assert_eq!(param(q).unwrap_err(), "invalid_query", "{q}");
        }
    }

    fn body(json: serde_json::Value) -> Result<ObjectRow, String> {
        serde_json::from_value::<ObjectBody>(json)
            .map_err(|e| e.to_string())?
            .into_row("demo", "a/b".to_owned())
    }

    #[test]
    fn object_bodies_are_checked_field_by_field() {
        let ok = body(
            serde_json::json!({"physical_address": "s3://x", "size_bytes": 3, "checksum": "c"}),
        )
        .unwrap();
        assert_eq!(ok.content_type, "application/octet-stream");
        assert_eq!(ok.metadata, serde_json::json!({}));
        let cases = [
            (
                serde_json::json!({"physical_address": "", "size_bytes": 1, "checksum": "c"}),
                "physical_address",
            ),
            (
                serde_json::json!({"physical_address": "a", "size_bytes": -1, "checksum": "c"}),
                "size_bytes",
            ),
            (
                serde_json::json!({"physical_address": "a", "size_bytes": 1, "checksum": "c\u{0}"}),
                "NUL",
            ),
            (
                serde_json::json!({"physical_address": "a", "size_bytes": 1, "checksum": "c", "metadata": {"k": 1}}),
                "metadata.k",
            ),
            (
                serde_json::json!({"physical_address": "a", "size_bytes": 1, "checksum": "c", "extra": 1}),
                "unknown field",
            ),
            (
                serde_json::json!({"size_bytes": 1, "checksum": "c"}),
                "physical_address",
            ),
        ];
        for (json, says) in cases {
            let err = body(json.clone()).unwrap_err();
            assert!(err.contains(says), "{json}: {err}");
        }
    }

    #[test]
    fn checks_paths_names_and_keys() {
        assert!(object_path("a/b.parquet", "path").is_ok());
        assert!(object_path("", "path").is_err());
        assert!(object_path(&"x".repeat(MAX_PATH_BYTES + 1), "path").is_err());
        assert!(object_path(&"x".repeat(MAX_PATH_BYTES), "path").is_ok());
        assert!(object_path("a\0b", "path").is_err());
        assert!(repository("demo").is_ok());
        for bad in ["de", "-demo", "Demo", "de_mo", &"a".repeat(64)] {
            assert!(repository(bad).is_err(), "{bad}");
        }
        assert!(pk("00000000000000000042").is_ok());
        assert!(pk("").is_err());
        assert!(pk("a\u{7}").is_err());
    }
}
