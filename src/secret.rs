//! Secrets (preset tokens and keys, the admin token, a Redis URL's password) and the
//! redaction that keeps them out of `check` output, logs and error messages.

use std::fmt;

/// A secret value: neither its `Debug` nor its `Display` shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<str>);

impl Secret {
    pub fn new(value: impl Into<Box<str>>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("***")
    }
}

/// A URL with the password (the whole user-info part, unless it is `user:password`,
/// then the user stays) replaced by `***`: what logs, `check` and errors show.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        // Not a URL we understand: show nothing that could be a password.
        return if url.contains('@') {
            "***".to_owned()
        } else {
            url.to_owned()
        };
    };
    let rest = &url[scheme_end..];
    // The user info ends at the last `@`, not at the first `/`, `?` or `#`: a password
    // written without percent-encoding may hold those (base64 passwords hold `/`), and
    // a Redis URL's path and query never hold an `@`.
    match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let shown = match userinfo.split_once(':') {
                Some((user, _)) if !user.is_empty() && !user.contains(['/', '?', '#']) => format!("{user}:***"),
                _ => "***".to_owned(),
            };
            format!("{}{shown}@{}", &url[..scheme_end], &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_and_the_rest_is_kept() {
        for (url, shown) in [
            ("redis://:s3cret@redis:6379/0", "redis://***@redis:6379/0"),
            (
                "rediss://default:s3cret@redis:6380/1",
                "rediss://default:***@redis:6380/1",
            ),
            ("redis://s3cret@redis", "redis://***@redis"),
            ("redis://:p@ss:w@rd@redis:6379", "redis://***@redis:6379"),
            ("redis://redis:6379/0", "redis://redis:6379/0"),
            ("redis://redis:6379/0#insecure", "redis://redis:6379/0#insecure"),
            ("not a url :s3cret@x", "***"),
            // Not percent-encoded: the password runs to the last @ all the same.
            ("redis://:ab/cd?e#f@redis:6379/0", "redis://***@redis:6379/0"),
            ("redis://user:ab/cd@redis:6379/0", "redis://user:***@redis:6379/0"),
            ("redis://ab/cd:ef@redis", "redis://***@redis"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn secrets_do_not_debug_print() {
        assert_eq!(format!("{:?}", Secret::new("s3cret")), "Secret(***)");
    }
}
