//! Typed reads from a parsed TOML table that remember the key path of every problem,
//! so one run of `check` reports all of them (serde would stop at the first).

use std::time::Duration;

use toml::{Table, Value};

use crate::secret::Secret;

/// Every problem found in a config file, each as `key.path: what is wrong`, and the
/// settings read but ignored (warnings: the config still loads).
#[derive(Debug, Default)]
pub struct Problems {
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Problems {
    pub fn push(&mut self, path: impl std::fmt::Display, problem: impl std::fmt::Display) {
        self.errors.push(format!("{path}: {problem}"));
    }

    /// A setting that does not stop the config from loading, but is not used.
    pub fn warn(&mut self, path: impl std::fmt::Display, why: impl std::fmt::Display) {
        self.warnings.push(format!("{path}: {why}"));
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn into_vec(self) -> Vec<String> {
        self.errors
    }

    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

/// The longest duration any setting takes.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// A closed set of names a key may take, mapped to an enum.
pub trait Choice: Sized + Copy + 'static {
    const NAMES: &'static [(&'static str, Self)];
}

/// One TOML table being read, with the keys not read yet (unknown keys are errors).
pub struct Section<'a> {
    path: String,
    table: &'a Table,
    /// Every key this table was asked for, present or not: what `finish` calls known.
    asked: Vec<&'static str>,
}

impl<'a> Section<'a> {
    pub fn new(path: impl Into<String>, table: &'a Table) -> Self {
        Section {
            path: path.into(),
            table,
            asked: Vec::new(),
        }
    }

    /// The key path of `key` in this table, e.g. `routes[1].key`.
    pub fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    fn value(&mut self, key: &'static str) -> Option<&'a Value> {
        self.asked.push(key);
        self.table.get(key)
    }

    /// Marks `key` as known but refused, with the reason.
    pub fn refuse(&mut self, key: &'static str, reason: &str, problems: &mut Problems) {
        if self.value(key).is_some() {
            problems.push(self.path_of(key), reason);
        }
    }

    fn typed<T>(
        &mut self,
        key: &'static str,
        expected: &str,
        problems: &mut Problems,
        convert: impl FnOnce(&'a Value) -> Option<Result<T, String>>,
    ) -> Option<T> {
        let value = self.value(key)?;
        match convert(value) {
            Some(Ok(v)) => Some(v),
            Some(Err(why)) => {
                problems.push(self.path_of(key), why);
                None
            }
            None => {
                problems.push(
                    self.path_of(key),
                    format!("expected {expected}, found {}", value.type_str()),
                );
                None
            }
        }
    }

    pub fn string(&mut self, key: &'static str, problems: &mut Problems) -> Option<&'a str> {
        self.typed(key, "a string", problems, |v| v.as_str().map(Ok))
    }

    pub fn boolean(&mut self, key: &'static str, problems: &mut Problems) -> Option<bool> {
        self.typed(key, "true or false", problems, |v| v.as_bool().map(Ok))
    }

    /// A non-negative integer no larger than `max`.
    pub fn integer(&mut self, key: &'static str, max: u64, problems: &mut Problems) -> Option<u64> {
        self.typed(key, "an integer", problems, |v| {
            v.as_integer().map(|i| match u64::try_from(i) {
                Ok(n) if n <= max => Ok(n),
                _ => Err(format!("{i} is out of range (0..={max})")),
            })
        })
    }

    /// A duration of at most [`MAX_DURATION`] (so deadlines never overflow).
    pub fn duration(&mut self, key: &'static str, problems: &mut Problems) -> Option<Duration> {
        self.typed(key, "a duration string like \"30s\"", problems, |v| {
            v.as_str().map(|s| match humantime::parse_duration(s) {
                Ok(d) if d <= MAX_DURATION => Ok(d),
                Ok(_) => Err(format!("{s:?} is longer than the maximum of 366 days")),
                Err(e) => Err(format!(
                    "invalid duration {s:?}: {e} (expected e.g. \"250ms\", \"30s\", \"24h\")"
                )),
            })
        })
    }

    /// A byte size: an integer, or a string such as `"64KiB"` or `"1MiB"`.
    pub fn size(&mut self, key: &'static str, problems: &mut Problems) -> Option<u64> {
        self.typed(key, "a size like \"1MiB\"", problems, |v| match v {
            Value::Integer(i) => Some(u64::try_from(*i).map_err(|_| format!("{i} is negative"))),
            Value::String(s) => Some(parse_size(s)),
            _ => None,
        })
    }

    pub fn choice<T: Choice>(&mut self, key: &'static str, problems: &mut Problems) -> Option<T> {
        self.typed(key, "a string", problems, |v| {
            v.as_str().map(|s| {
                T::NAMES
                    .iter()
                    .find(|(name, _)| *name == s)
                    .map(|(_, value)| *value)
                    .ok_or_else(|| format!("unknown value {s:?} (expected {})", quoted_names(T::NAMES)))
            })
        })
    }

    /// A list of strings; a single string is taken as a list of one.
    pub fn strings(&mut self, key: &'static str, problems: &mut Problems) -> Option<Vec<(String, &'a str)>> {
        let path = self.path_of(key);
        self.typed(key, "a string or a list of strings", problems, |v| match v {
            Value::String(s) => Some(Ok(vec![(path.clone(), s.as_str())])),
            Value::Array(items) => Some(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        item.as_str()
                            .map(|s| (format!("{path}[{i}]"), s))
                            .ok_or_else(|| format!("item {i}: expected a string, found {}", item.type_str()))
                    })
                    .collect(),
            ),
            _ => None,
        })
    }

    pub fn section(&mut self, key: &'static str, problems: &mut Problems) -> Option<Section<'a>> {
        let path = self.path_of(key);
        self.typed(key, "a table", problems, |v| {
            v.as_table().map(|t| Ok(Section::new(path, t)))
        })
    }

    /// An array of tables (`[[routes]]`), each with its indexed path.
    pub fn sections(&mut self, key: &'static str, problems: &mut Problems) -> Vec<Section<'a>> {
        let path = self.path_of(key);
        self.typed(key, "an array of tables", problems, |v| {
            v.as_array().map(|items| {
                let mut sections = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item.as_table() {
                        Some(t) => sections.push(Section::new(format!("{path}[{i}]"), t)),
                        None => {
                            return Err(format!("item {i}: expected a table, found {}", item.type_str()));
                        }
                    }
                }
                Ok(sections)
            })
        })
        .unwrap_or_default()
    }

    /// Reports every key of this table that nothing read.
    pub fn finish(self, problems: &mut Problems) {
        for key in self.table.keys() {
            if !self.asked.contains(&key.as_str()) {
                let hint = closest(key, &self.asked)
                    .map(|k| format!(" (did you mean {k:?}?)"))
                    .unwrap_or_default();
                problems.push(self.path_of(key), format!("unknown key{hint}"));
            }
        }
    }
}

fn quoted_names<T>(names: &[(&str, T)]) -> String {
    let quoted: Vec<String> = names.iter().map(|(n, _)| format!("{n:?}")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The known key closest to a misspelt one, if it is close enough to be a typo.
fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Parses `"512"`, `"64KiB"`, `"1MiB"`, `"2MB"` into bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size {s:?} (expected e.g. \"64KiB\" or \"1MiB\")"))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" | "k" => 1 << 10,
        "mb" => 1_000_000,
        "mib" | "m" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" | "g" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (expected B, KiB, MiB, GiB, KB, MB, GB)"
            ));
        }
    };
    n.checked_mul(factor).ok_or_else(|| format!("size {s:?} is too large"))
}

/// Reads the environment variable named by `key` (e.g. `url_env = "REDIS_URL"`).
/// An unset or empty variable is a problem at `key`'s path.
pub fn from_env(s: &mut Section, key: &'static str, problems: &mut Problems) -> Option<(String, Secret)> {
    let name = s.string(key, problems)?;
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Some((name.to_owned(), Secret::new(value))),
        Ok(_) => {
            problems.push(s.path_of(key), format!("environment variable {name} is empty"));
            None
        }
        Err(_) => {
            problems.push(s.path_of(key), format!("environment variable {name} is not set"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert!(parse_size("1XB").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn typo_hint() {
        assert_eq!(
            closest("procesing_ttl", &["processing_ttl", "completed_ttl"]),
            Some("processing_ttl")
        );
        assert_eq!(closest("zzz", &["processing_ttl"]), None);
    }

    #[test]
    fn unknown_and_bad_keys_are_all_reported_with_paths() {
        let table: Table = toml::from_str("a = \"1x\"\nb = 3\ntypo = 1").expect("toml");
        let mut problems = Problems::default();
        let mut s = Section::new("server", &table);
        assert!(s.duration("a", &mut problems).is_none());
        assert!(s.string("b", &mut problems).is_none());
        s.finish(&mut problems);
        let all = problems.into_vec();
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all[0].starts_with("server.a: invalid duration"));
        assert_eq!(all[1], "server.b: expected a string, found integer");
        assert_eq!(all[2], "server.typo: unknown key");
    }
}
