//! Query parameters as lakeFS's clients send them: percent-encoded, `+` for
//! a space (Go), booleans spelled `true`, `True` (Python) or `1`.

use crate::domain::failure::Failure;
use crate::domain::input;
use crate::domain::listing::{ListRequest, MAX_AMOUNT};

/// Parameter `name`, `""` when absent: a path or a part of one (a
/// listing's `prefix`, `after` or `delimiter`), so held to a path's rule
/// (at most [`input::MAX_PATH_BYTES`], no NUL), but it may be empty.
///
/// # Errors
///
/// `invalid_query` when it is not decoded, `invalid_path` when it breaks
/// the rule: Postgres refuses a NUL in text, and nothing longer can match.
pub(super) fn text(raw: Option<&str>, name: &str) -> Result<String, Failure> {
    let value = input::query_param(raw, name)?.unwrap_or_default();
    if !value.is_empty() {
        input::object_path(&value, &format!("query parameter `{name}`"))?;
    }
    Ok(value)
}

/// Boolean parameter `name`, `default` when absent.
pub(super) fn flag(raw: Option<&str>, name: &str, default: bool) -> Result<bool, Failure> {
    let Some(value) = input::query_param(raw, name)? else {
        return Ok(default);
    };
    match value.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" => Ok(true),
        "false" | "f" | "0" => Ok(false),
        _ => Err(Failure::invalid(
            "invalid_query",
            format!("query parameter `{name}` must be true or false, not `{value}`"),
        )),
    }
}

/// Integer parameter `name`, if given.
pub(super) fn integer(raw: Option<&str>, name: &str) -> Result<Option<i64>, Failure> {
    input::query_param(raw, name)?
        .map(|value| {
            value.parse().map_err(|_| {
                Failure::invalid(
                    "invalid_query",
                    format!("query parameter `{name}` must be an integer, not `{value}`"),
                )
            })
        })
        .transpose()
}

/// `amount`, a page's size, as lakeFS's API bounds it (-1 to 1,000;
/// 100 when absent, and below 1).
///
/// # Errors
///
/// `invalid_query` for a value out of bounds, worded as lakeFS's request
/// validator words it.
pub(super) fn amount(raw: Option<&str>) -> Result<usize, Failure> {
    let asked = integer(raw, "amount")?;
    if let Some(n) = asked {
        let max = i64::try_from(MAX_AMOUNT).unwrap_or(i64::MAX);
        let bound = if n > max {
            Some(format!("at most {max}"))
        } else if n < -1 {
            Some("at least -1".to_owned())
        } else {
            None
        };
        if let Some(bound) = bound {
            return Err(Failure::invalid(
                "invalid_query",
                format!("parameter \"amount\" in query has an error: number must be {bound}"),
            ));
        }
    }
    Ok(ListRequest::amount_of(asked))
}

/// Refuses `presign=true`, as lakeFS does when its storage cannot sign
/// addresses: this server holds no data to sign an address for (its
/// storage configuration says `pre_sign_support: false`).
///
/// # Errors
///
/// `presign_not_supported` when `presign` is true.
pub(super) fn no_presign(raw: Option<&str>) -> Result<(), Failure> {
    if flag(raw, "presign", false)? {
        return Err(Failure::invalid(
            "presign_not_supported",
            "presigned URL: operation not supported (this server stores metadata only)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amount_is_bounded_as_lakefs_bounds_it() {
        assert_eq!(amount(None).unwrap(), 100);
        assert_eq!(amount(Some("amount=-1")).unwrap(), 100);
        assert_eq!(amount(Some("amount=1000")).unwrap(), 1000);
        for bad in ["amount=1001", "amount=-2"] {
            let Err(Failure::Invalid { message, .. }) = amount(Some(bad)) else {
                panic!("{bad} accepted");
            };
            assert!(
                message.starts_with("parameter \"amount\" in query has an error: number must be")
            );
        }
        assert!(no_presign(Some("presign=true")).is_err());
        assert!(no_presign(Some("presign=false")).is_ok());
        assert!(no_presign(None).is_ok());
    }

    #[test]
    fn booleans_in_any_clients_spelling() {
        for (q, want) in [
            ("user_metadata=True", true),
            ("user_metadata=false", false),
            ("user_metadata=FALSE", false),
            ("user_metadata=1", true),
            ("x=1", true),
        ] {
            assert_eq!(flag(Some(q), "user_metadata", true).unwrap(), want, "{q}");
        }
        assert!(flag(Some("user_metadata=maybe"), "user_metadata", true).is_err());
    }

    #[test]
    fn text_and_integers() {
        assert_eq!(text(Some("prefix=a+b%2Fc"), "prefix").unwrap(), "a b/c");
        assert_eq!(text(None, "prefix").unwrap(), "");
        assert_eq!(integer(Some("amount=-1"), "amount").unwrap(), Some(-1));
        assert_eq!(integer(Some("x=1"), "amount").unwrap(), None);
        assert!(integer(Some("amount=ten"), "amount").is_err());
    }

    #[test]
    fn text_is_held_to_a_paths_rule() {
        for q in ["prefix=a%00b", "after=%00", "delimiter=%00"] {
            let name = q.split('=').next().unwrap();
            match text(Some(q), name) {
                Err(Failure::Invalid { code, message }) => {
                    assert_eq!(code, "invalid_path", "{q}");
                    assert!(message.contains(name), "{q}: {message}");
                }
                other => panic!("{q}: {other:?}"),
            }
        }
        let long = format!("prefix={}", "a".repeat(input::MAX_PATH_BYTES + 1));
        assert!(text(Some(&long), "prefix").is_err());
        let longest = format!("prefix={}", "a".repeat(input::MAX_PATH_BYTES));
        assert!(text(Some(&longest), "prefix").is_ok());
    }
}
