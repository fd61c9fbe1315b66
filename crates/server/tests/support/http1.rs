//! Raw HTTP/1.1 over a socket, for tests that must see what a client sees
//! on the wire (a reset, a close, a response sent before the body was read),
//! which a client library would hide.

use std::io;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

/// How a response read ended.
#[derive(Debug)]
pub enum Outcome {
    /// A whole response: status, lower-cased head, body.
    Answered(u16, String, Vec<u8>),
    /// The connection was reset before the whole response arrived.
    Reset,
    /// The connection was closed before the whole response arrived.
    Closed,
}

impl Outcome {
    /// The status of a whole response.
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Answered(status, ..) => Some(*status),
            _ => None,
        }
    }

    /// The body of a whole response as JSON (`Null` otherwise).
    pub fn json(&self) -> serde_json::Value {
        match self {
            Outcome::Answered(_, _, body) => serde_json::from_slice(body).unwrap_or_default(),
            _ => serde_json::Value::Null,
        }
    }

    /// Whether the response announced `Connection: close`.
    pub fn closes(&self) -> bool {
        matches!(self, Outcome::Answered(_, head, _) if head.contains("connection: close"))
    }

    /// The head and body of a whole response; panics on a reset or close.
    pub fn answered(self) -> (String, Vec<u8>) {
        match self {
            Outcome::Answered(_, head, body) => (head, body),
            other => panic!("expected a whole response, got {other:?}"),
        }
    }
}

/// Reads one response with a `content-length` (none means an empty body)
/// from `stream`, within `patience`.
///
/// # Panics
///
/// When nothing ends within `patience`, or reading fails otherwise than by
/// a reset.
pub async fn read_response(stream: &mut TcpStream, patience: Duration) -> Outcome {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = vec![0; 64 * 1024];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) => return Outcome::Closed,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Outcome::Reset,
                Err(e) => panic!("reading a response: {e}"),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
        let status: u16 = head[9..12].parse().expect("a status code");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().expect("a content length"));
        let mut body = buf[head_end..].to_vec();
        while body.len() < length {
            match stream.read(&mut chunk).await {
                Ok(0) => return Outcome::Closed,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Outcome::Reset,
                Err(e) => panic!("reading a response body: {e}"),
            }
        }
        Outcome::Answered(status, head, body)
    };
    tokio::time::timeout(patience, read)
        .await
        .expect("a response or a closed connection in time")
}
