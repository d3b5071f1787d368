//! A route's `upstream`: where its requests go. Only `http://host:port`: the gateway
//! runs next to the bot, and the request's own path and query are forwarded.

use http::Uri;
use http::uri::{Authority, Scheme};

/// Where a route forwards to: scheme and authority; the path comes from the request.
#[derive(Clone, Debug)]
pub struct Target {
    pub scheme: Scheme,
    pub authority: Authority,
}

impl Target {
    /// Parses `http://host:port`. A path would be silently dropped, so it is refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        let uri: Uri = text.parse().map_err(|e| format!("invalid URL {text:?}: {e}"))?;
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            return Err(format!(
                "{text:?} must be an absolute URL like \"http://127.0.0.1:5000\""
            ));
        };
        if *scheme != Scheme::HTTP {
            return Err(format!(
                "{text:?}: only http:// upstreams are supported (run the gateway next to the bot)"
            ));
        }
        if authority.as_str().contains('@') {
            return Err(format!(
                "{text:?}: credentials in an upstream URL are not supported (they would be sent as the Host)"
            ));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(format!(
                "{text:?}: an upstream has no path; the request's path and query are forwarded unchanged"
            ));
        }
        Ok(Target {
            scheme: scheme.clone(),
            authority: authority.clone(),
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_scheme_and_authority_only() {
        assert!(Target::parse("http://127.0.0.1:5000").is_ok());
        assert!(Target::parse("http://127.0.0.1:5000/").is_ok());
        assert!(Target::parse("http://127.0.0.1:5000/base").is_err());
        assert!(Target::parse("https://example.com").is_err());
        assert!(Target::parse("127.0.0.1:5000").is_err());
        let credentials = Target::parse("http://user:pw@127.0.0.1:5000").expect_err("credentials");
        assert!(credentials.contains("credentials"), "{credentials}");
    }
}
