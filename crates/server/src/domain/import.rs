//! The NDJSON body of an import as a [`RowSource`] for COPY: object rows
//! parsed as the body arrives, so memory holds at most one line (and one
//! network chunk) however large the body is.

use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use pgbatch::pg::copy::{RowSource, RowValues};

use crate::db::queries::objects::ObjectRow;
use crate::domain::failure::Failure;
use crate::domain::input::{self, ObjectBody};
use crate::settings::ImportSettings;

/// The longest import line accepted, in bytes.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Object rows of one repository, one JSON object (with its `path`) per
/// line of a request body. Blank lines are skipped.
///
/// Fails with [`Failure::BadImportLine`] naming the first malformed line,
/// [`Failure::TooLarge`] once the body passes its limit, or
/// [`Failure::BodyStalled`] when no chunk arrives within the idle timeout.
#[derive(Debug)]
pub struct NdjsonObjects {
    body: Body,
    buf: Vec<u8>,
    /// Lines consumed so far.
    line: u64,
    /// Body bytes read so far.
    read: usize,
    limit: usize,
    idle_timeout: Duration,
    done: bool,
    repository: String,
}

impl NdjsonObjects {
    /// The rows of `body` for `repository`, within `settings`' size limit
    /// and idle timeout.
    pub fn new(body: Body, repository: &str, settings: &ImportSettings) -> Self {
        Self {
            body,
            buf: Vec::new(),
            line: 0,
            read: 0,
            limit: settings.max_bytes,
            idle_timeout: settings.idle_timeout,
            done: false,
            repository: repository.to_owned(),
        }
    }

    fn bad_line(line: u64, message: String) -> Failure {
        Failure::BadImportLine { line, message }
    }

    fn parse(&self, bytes: &[u8]) -> Result<ObjectRow, Failure> {
        let bad = |message: String| Self::bad_line(self.line, message);
        let body: ObjectBody = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        let path = body
            .path
            .clone()
            .ok_or_else(|| bad("`path` is required".to_owned()))?;
        input::object_path(&path, "path").map_err(|e| bad(e.to_string()))?;
        body.into_row(&self.repository, path).map_err(bad)
    }
}

impl RowSource for NdjsonObjects {
    type Error = Failure;

    async fn next_row(&mut self) -> Result<Option<RowValues>, Failure> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                self.line += 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue; // blank lines are allowed
                }
                return self.parse(&line).map(|row| Some(row.into_values()));
            }
            if self.done {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                // A last line without a trailing newline.
                self.buf.push(b'\n');
                continue;
            }
            if self.buf.len() > MAX_LINE_BYTES {
                return Err(Self::bad_line(
                    self.line + 1,
                    format!("longer than {MAX_LINE_BYTES} bytes"),
                ));
            }
            // A stalled upload holds an import slot and a connection: it
            // gets a bound of its own, apart from the import's deadline.
            let frame = tokio::time::timeout(self.idle_timeout, self.body.frame())
                .await
                .map_err(|_| Failure::BodyStalled(self.idle_timeout))?;
            match frame {
                None => self.done = true,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.read += data.len();
                        if self.read > self.limit {
                            return Err(Failure::TooLarge(self.limit));
                        }
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(Self::bad_line(
                        self.line + 1,
                        format!("the body could not be read: {e}"),
                    ))
                }
            }
        }
    }
}
