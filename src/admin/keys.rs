//! `GET /keys/<route>/<id>` and `DELETE /keys/<route>/<id>[?force=true]`: what the store
//! holds for one message, and forgetting it so its next delivery is forwarded again
//! (GitHub's manual redelivery keeps the same `X-GitHub-Delivery`; a bot that answered
//! 2xx but mishandled a message). `<id>` is the message id as the route's key source
//! yields it, percent-encoded; it is stored under the same rule as requests
//! ([`stored_key`]: long or unusual ids are hashed).

use std::sync::Arc;

use http::{Method, StatusCode};
use serde_json::json;

use crate::gateway::Gateway;
use crate::key::stored_key;
use crate::store::{Forgotten, KeyInfo, Store, unix_ms};

/// A request under `/keys/`, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyPath {
    pub route: String,
    pub id: String,
}

impl KeyPath {
    /// Parses `/keys/<route>/<percent-encoded id>`.
    pub fn parse(path: &str) -> Result<Self, String> {
        let rest = path.strip_prefix("/keys/").ok_or("not under /keys/")?;
        let (route, id) = rest.split_once('/').ok_or("expected /keys/<route>/<id>")?;
        let id = percent_decode(id)?;
        if route.is_empty() || id.is_empty() {
            return Err("expected /keys/<route>/<id>".into());
        }
        Ok(KeyPath {
            route: route.to_owned(),
            id,
        })
    }
}

/// Decodes `%XX` escapes (no `+` for space: this is a path). The id must be UTF-8.
pub(super) fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("invalid percent-encoding at byte {i} of the id"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the id is not UTF-8 once decoded".into())
}

/// A JSON answer.
pub struct Reply {
    pub status: StatusCode,
    pub body: serde_json::Value,
}

fn reply(status: StatusCode, body: serde_json::Value) -> Reply {
    Reply { status, body }
}

/// Serves one `/keys/...` request whose method is GET, HEAD or DELETE (DELETE already
/// authorised by the caller).
pub async fn serve(gw: &Arc<Gateway>, method: &Method, path: &str, query: Option<&str>) -> Reply {
    let target = match KeyPath::parse(path) {
        Ok(target) => target,
        Err(why) => return reply(StatusCode::BAD_REQUEST, json!({ "error": why })),
    };
    let known = gw.routes.load().named(&target.route).is_some();
    if !known {
        let error = format!("no route named {:?}", target.route);
        return reply(StatusCode::NOT_FOUND, json!({ "error": error }));
    }
    let key = stored_key(&gw.key_prefix, &target.route, &target.id);
    let about = json!({ "route": target.route, "id": target.id, "key": &*key });
    if *method == Method::DELETE {
        let force = query.is_some_and(|q| {
            form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "force" && (v == "true" || v == "1"))
        });
        forget(gw, about, &key, force).await
    } else {
        inspect(gw, about, &key).await
    }
}

async fn inspect(gw: &Gateway, mut about: serde_json::Value, key: &str) -> Reply {
    match gw.store.inspect(key).await {
        Ok(Some(info)) => {
            describe(&mut about, &info);
            reply(StatusCode::OK, about)
        }
        Ok(None) => {
            about["state"] = json!("absent");
            reply(StatusCode::NOT_FOUND, about)
        }
        Err(e) => {
            about["error"] = json!(format!("store: {e}"));
            reply(StatusCode::SERVICE_UNAVAILABLE, about)
        }
    }
}

fn describe(about: &mut serde_json::Value, info: &KeyInfo) {
    about["state"] = json!(info.state.label());
    about["first_seen_ms"] = json!(info.first_seen_ms);
    about["age_ms"] = json!(unix_ms().saturating_sub(info.first_seen_ms));
    about["ttl_ms"] = json!(info.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)));
    about["reply_stored"] = json!(info.reply_stored);
}

async fn forget(gw: &Gateway, mut about: serde_json::Value, key: &str, force: bool) -> Reply {
    let route = about["route"].as_str().unwrap_or_default().to_owned();
    match gw.store.forget(key, force).await {
        Ok(Forgotten::Deleted(state)) => {
            tracing::info!(%route, key, state = state.label(), force, "admin: key forgotten; its next delivery is forwarded");
            about["forgotten"] = json!(true);
            about["state"] = json!(state.label());
            reply(StatusCode::OK, about)
        }
        Ok(Forgotten::Absent) => {
            about["forgotten"] = json!(false);
            about["state"] = json!("absent");
            reply(StatusCode::NOT_FOUND, about)
        }
        Ok(Forgotten::Refused) => {
            tracing::info!(%route, key, "admin: forget refused, the key is PROCESSING (no force)");
            about["forgotten"] = json!(false);
            about["state"] = json!("PROCESSING");
            about["error"] = json!(
                "PROCESSING: its first delivery may still be running; forgetting it lets a retry \
                 through at the same time. Add ?force=true to forget it anyway"
            );
            reply(StatusCode::CONFLICT, about)
        }
        Err(e) => {
            about["error"] = json!(format!("store: {e}"));
            reply(StatusCode::SERVICE_UNAVAILABLE, about)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_decode_the_id_and_keep_slashes_in_it() {
        assert_eq!(
            KeyPath::parse("/keys/bot/m%201%2F2/x").expect("parse"),
            KeyPath {
                route: "bot".into(),
                id: "m 1/2/x".into()
            }
        );
        assert_eq!(KeyPath::parse("/keys/bot/%E6%B6%88").expect("parse").id, "消");
        assert!(KeyPath::parse("/keys/bot/").is_err());
        assert!(KeyPath::parse("/keys/bot").is_err());
        assert!(KeyPath::parse("/keys/bot/%zz").is_err());
        assert!(KeyPath::parse("/keys/bot/%ff").is_err());
    }
}
