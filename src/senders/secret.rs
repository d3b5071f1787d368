//! A secret from the configuration: usable by the checks, never printed.

use std::fmt;

/// A token, signing secret or key. `Debug` and `Display` show `<redacted>`, so a secret
/// can sit in any config struct without reaching a log line, `check` or an error.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<str>);

impl Secret {
    pub fn new(value: impl Into<Box<str>>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the code that keys a check with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_printed() {
        let s = Secret::new("hunter2");
        assert_eq!(
            format!("{s} {s:?} {:?}", Some(&s)),
            "<redacted> Secret(<redacted>) Some(Secret(<redacted>))"
        );
        assert_eq!(s.expose(), "hunter2");
    }
}
