//! The metrics endpoint: `GET /metrics` (or `HEAD`) over HTTP/1.x, one
//! request per connection, answered with the exposition of
//! [`super::Sources`]. Whatever a peer sends, an endpoint holds at most
//! [`MAX_CONNECTIONS`] connections, reads at most [`MAX_HEAD`] bytes of a
//! request, and drops a connection that has not sent its request within
//! [`REQUEST_TIMEOUT`].

use super::Sources;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 8;
/// The longest request head read.
pub const MAX_HEAD: usize = 8192;
/// How long a connection may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `sources` on `listener` until `shutdown` turns true.
pub async fn serve(listener: TcpListener, sources: Sources, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics endpoint: accept failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let sources = sources.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &sources).await {
                tracing::debug!(%peer, error = %e, "metrics endpoint: connection ended");
            }
            drop(permit);
        });
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `GET /metrics` (body wanted) or `HEAD /metrics` (not).
    Metrics {
        /// False for HEAD.
        body: bool,
    },
    /// Another path.
    NotFound,
    /// A method other than GET and HEAD.
    BadMethod,
    /// Not an HTTP/1.x request line.
    Malformed,
}

/// Parses the request line of `head` (the bytes up to the blank line).
pub fn parse(head: &[u8]) -> Request {
    let line_end = head.iter().position(|b| *b == b'\n').unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Request::Malformed;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Malformed;
    };
    if !version.starts_with("HTTP/1.") || target.is_empty() {
        return Request::Malformed;
    }
    let body = match method {
        "GET" => true,
        "HEAD" => false,
        _ => return Request::BadMethod,
    };
    let path = target.split('?').next().unwrap_or_default();
    if path == "/metrics" {
        Request::Metrics { body }
    } else {
        Request::NotFound
    }
}

async fn answer(mut stream: TcpStream, sources: &Sources) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let complete = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        loop {
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Ok(true);
            }
            if head.len() >= MAX_HEAD {
                return Ok(false);
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            head.extend_from_slice(&buf[..n.min(MAX_HEAD - head.len())]);
        }
    })
    .await;
    let response = match complete {
        Err(_) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(false)) => response(
            "431 Request Header Fields Too Large",
            "text/plain",
            b"request head too large\n",
            true,
            "",
        ),
        Ok(Ok(true)) => match parse(&head) {
            Request::Metrics { body } => {
                let text = sources.render();
                response(
                    "200 OK",
                    prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                    text.as_bytes(),
                    body,
                    "",
                )
            }
            Request::NotFound => response(
                "404 Not Found",
                "text/plain",
                b"not found: the metrics are at /metrics\n",
                true,
                "",
            ),
            Request::BadMethod => response(
                "405 Method Not Allowed",
                "text/plain",
                b"only GET and HEAD\n",
                true,
                "Allow: GET, HEAD\r\n",
            ),
            Request::Malformed => response(
                "400 Bad Request",
                "text/plain",
                b"not an HTTP/1 request\n",
                true,
                "",
            ),
        },
    };
    stream.write_all(&response).await?;
    stream.shutdown().await
}

fn response(status: &str, kind: &str, body: &[u8], with_body: bool, extra: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    if with_body {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Metrics { body: true }
        );
        assert_eq!(
            parse(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Request::Metrics { body: false }
        );
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(parse(b"POST /metrics HTTP/1.1\r\n\r\n"), Request::BadMethod);
        assert_eq!(parse(b"GET /metrics\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"GET /metrics HTTP/2\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"GET  /metrics HTTP/1.1\r\n\r\n"), Request::Malformed);
        assert_eq!(
            parse(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"),
            Request::Malformed
        );
        assert_eq!(parse(b""), Request::Malformed);
    }
}
