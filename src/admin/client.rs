//! The client side of the admin API, for `dedup-gateway key --inspect | --forget` and
//! `dedup-gateway queue ...`: one request to a running gateway's admin listener.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::BodyExt;

use crate::body::Body;
use crate::upstream::{self, UpstreamError};

/// What to do with the key.
#[derive(Clone, Copy, Debug)]
pub enum KeyAction {
    Inspect,
    Forget { force: bool },
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--admin {0:?}: expected a URL like http://127.0.0.1:9090")]
    Url(String),
    #[error("admin listener {url}: {source}")]
    Request {
        url: String,
        #[source]
        source: UpstreamError,
    },
    #[error("admin listener {url}: the answer broke off: {source}")]
    Body {
        url: String,
        #[source]
        source: crate::body::BodyError,
    },
}

/// The admin URL for a listener address: a wildcard address is reached on loopback.
pub fn admin_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_owned(),
        ip if ip.is_unspecified() => "[::1]".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{ip}:{}", addr.port())
}

/// Sends `GET` or `DELETE /keys/<route>/<id>` and returns the status and the body.
pub async fn key_request(
    admin: &str,
    route: &str,
    id: &str,
    action: KeyAction,
    token: Option<&str>,
) -> Result<(StatusCode, String), ClientError> {
    let (method, query) = match action {
        KeyAction::Inspect => (Method::GET, ""),
        KeyAction::Forget { force: true } => (Method::DELETE, "?force=true"),
        KeyAction::Forget { force: false } => (Method::DELETE, ""),
    };
    let path = format!("/keys/{}/{}{query}", encode(route), encode(id));
    request(admin, method, &path, token).await
}

/// What `dedup-gateway queue ...` asks.
#[derive(Clone, Debug)]
pub enum QueueAction {
    Status,
    Dead { route: String, limit: Option<usize> },
    Retry { route: String, id: Option<String> },
    Drop { route: String, id: String },
}

/// Sends the queue API request for `action` and returns the status and the body.
pub async fn queue_request(
    admin: &str,
    action: &QueueAction,
    token: Option<&str>,
) -> Result<(StatusCode, String), ClientError> {
    let (method, path) = match action {
        QueueAction::Status => (Method::GET, "/queue".to_owned()),
        QueueAction::Dead { route, limit } => {
            let limit = limit.map_or(String::new(), |n| format!("?limit={n}"));
            (Method::GET, format!("/queue/{}/dead{limit}", encode(route)))
        }
        QueueAction::Retry { route, id: Some(id) } => (
            Method::POST,
            format!("/queue/{}/dead/{}/retry", encode(route), encode(id)),
        ),
        QueueAction::Retry { route, id: None } => (Method::POST, format!("/queue/{}/dead/retry", encode(route))),
        QueueAction::Drop { route, id } => (Method::DELETE, format!("/queue/{}/dead/{}", encode(route), encode(id))),
    };
    request(admin, method, &path, token).await
}

/// Sends `method path` (`path` percent-encoded already) to the admin listener at
/// `admin` and returns the status and the body.
async fn request(
    admin: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> Result<(StatusCode, String), ClientError> {
    let base = admin.trim_end_matches('/');
    let url = format!("{base}{path}");
    let uri: Uri = url.parse().map_err(|_| ClientError::Url(admin.to_owned()))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none_or(|a| a.as_str().contains('@')) {
        return Err(ClientError::Url(admin.to_owned()));
    }
    let (Some(authority), Some(path)) = (uri.authority().cloned(), uri.path_and_query().cloned()) else {
        return Err(ClientError::Url(admin.to_owned()));
    };
    let mut request = Request::builder()
        .method(method)
        .uri(Uri::from(path))
        .header(header::HOST, authority.as_str());
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Body::empty()).map_err(|e| ClientError::Request {
        url: base.to_owned(),
        source: UpstreamError::Request(e),
    })?;
    let response = upstream::call(
        &authority,
        request,
        tokio::time::Instant::now(),
        Duration::from_secs(10),
    )
    .await
    .map_err(|source| ClientError::Request {
        url: base.to_owned(),
        source,
    })?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|source| ClientError::Body {
            url: base.to_owned(),
            source,
        })?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_encoded_whole_and_wildcards_reached_on_loopback() {
        assert_eq!(encode("m 1/2?x=消"), "m%201%2F2%3Fx%3D%E6%B6%88");
        assert_eq!(encode("abc-1.2_~"), "abc-1.2_~");
        assert_eq!(
            admin_url("0.0.0.0:9090".parse().expect("addr")),
            "http://127.0.0.1:9090"
        );
        assert_eq!(admin_url("[::]:9090".parse().expect("addr")), "http://[::1]:9090");
        assert_eq!(
            admin_url("10.0.0.5:9090".parse().expect("addr")),
            "http://10.0.0.5:9090"
        );
    }
}
