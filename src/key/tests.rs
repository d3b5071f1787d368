//! Unit tests of [`crate::key`].

use super::*;

fn head(uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
    let mut req = http::Request::post(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(()).expect("request").into_parts().0
}

fn spec(sources: &[&str]) -> KeySpec {
    KeySpec::new(sources.iter().map(|s| Alternative::parse(s).expect("source")).collect())
}

#[test]
fn first_source_that_yields_wins() {
    let h = head("/", &[]);
    let key = spec(&["json:/msgId", "json:/data/msgId", "json:/eventId"]);
    let input = Input {
        head: &h,
        body: br#"{"data":{"msgId":"d"},"eventId":"e"}"#,
    };
    assert_eq!(key.derive(input).expect("not refused").as_deref(), Some("d"));
    let (found, misses) = key.explain(input);
    assert_eq!(
        found.expect("not refused").map(|(s, v)| (s, v.into_owned())),
        Some(("json:/data/msgId", "d".to_owned()))
    );
    assert_eq!(misses, vec!["json:/msgId: not present"]);
}

#[test]
fn header_query_form_body_and_composite() {
    let h = head(
        "/hook?msg_id=q%201&x=2",
        &[
            ("x-github-delivery", "gh-1"),
            ("content-type", "application/x-www-form-urlencoded; charset=utf-8"),
        ],
    );
    let body = b"msg_id=f+1&CreateTime=170";
    let input = Input { head: &h, body };
    assert_eq!(
        spec(&["header:X-GitHub-Delivery"])
            .derive(input)
            .expect("not refused")
            .as_deref(),
        Some("gh-1")
    );
    assert_eq!(
        spec(&["query:msg_id"]).derive(input).expect("not refused").as_deref(),
        Some("q 1")
    );
    assert_eq!(
        spec(&["form:msg_id"]).derive(input).expect("not refused").as_deref(),
        Some("f 1")
    );
    assert_eq!(
        spec(&["form:msg_id+query:x"])
            .derive(input)
            .expect("not refused")
            .as_deref(),
        Some("f 1+2")
    );
    assert_eq!(spec(&["form:msg_id+query:nope"]).derive(input), Ok(None));
    let digest = spec(&["body"]).derive(input).expect("not refused").expect("digest");
    assert_eq!(digest.len(), 64);
    assert_eq!(digest, hex::encode(Sha256::digest(body)));
}

#[test]
fn form_needs_a_form_body_and_body_needs_bytes() {
    let h = head("/", &[("content-type", "application/json")]);
    let input = Input {
        head: &h,
        body: b"msg_id=1",
    };
    assert_eq!(
        spec(&["form:msg_id"]).explain(input).1,
        vec!["form:msg_id: body is not application/x-www-form-urlencoded"]
    );
    assert_eq!(spec(&["body"]).derive(Input { head: &h, body: b"" }), Ok(None));
    // Only the media type decides, whatever bytes its parameters carry (found by the
    // key_extraction fuzz target: a non-ASCII charset made the form "not a form").
    for content_type in [
        "Application/X-WWW-Form-Urlencoded ; charset=utf-\u{e9}",
        "\tapplication/x-www-form-urlencoded",
    ] {
        let h = head("/", &[("content-type", content_type)]);
        let input = Input {
            head: &h,
            body: b"msg_id=1",
        };
        assert_eq!(
            spec(&["form:msg_id"]).derive(input).map(|v| v.map(|v| v.into_owned())),
            Ok(Some("1".to_owned())),
            "{content_type:?}"
        );
    }
}

#[test]
fn xml_sources_compose_and_a_doctype_refuses_the_request() {
    let h = head("/", &[("x-id", "h1")]);
    let key = spec(&["xml:MsgId", "xml:FromUserName+xml:CreateTime", "header:x-id"]);
    let event = b"<xml><FromUserName><![CDATA[o_abc]]></FromUserName><CreateTime>1700000000</CreateTime></xml>";
    let input = Input { head: &h, body: event };
    assert_eq!(key.derive(input).expect("ok").as_deref(), Some("o_abc+1700000000"));
    let (found, misses) = key.explain(input);
    assert_eq!(
        found.expect("not refused").map(|(s, _)| s),
        Some("xml:FromUserName+xml:CreateTime")
    );
    assert_eq!(misses, vec!["xml:MsgId: not present"]);
    let bomb = b"<!DOCTYPE x [<!ENTITY a \"b\">]><xml><MsgId>&a;</MsgId></xml>";
    let input = Input { head: &h, body: bomb };
    assert_eq!(key.derive(input), Err(Refused), "refused, not the header fallback");
    let (found, misses) = key.explain(input);
    assert_eq!(found, Err(Refused));
    assert_eq!(
        misses,
        vec!["xml:MsgId: body has a DOCTYPE or entity declaration (refused)"]
    );
    let broken = Input {
        head: &h,
        body: b"<xml><MsgId>1</MsgId>",
    };
    assert_eq!(
        key.derive(broken).expect("ok").as_deref(),
        Some("h1"),
        "malformed: the next source"
    );
}

/// Two events of one user in one second (a subscribe, then a menu CLICK) get two keys;
/// a retry of either gets its own again; the parts that are absent are left out.
#[test]
fn optional_parts_are_left_out_when_absent_and_tell_events_apart() {
    let h = head("/", &[]);
    let key = spec(&[
        "xml:MsgId",
        "xml:FromUserName+xml:CreateTime+?xml:Event+?xml:EventKey+?xml:ChangeType+?xml:UserID",
    ]);
    let event = |inner: &str| {
        format!("<xml><FromUserName>o_abc</FromUserName><CreateTime>1700000000</CreateTime>{inner}</xml>")
    };
    let derive = |body: &str| {
        key.derive(Input {
            head: &h,
            body: body.as_bytes(),
        })
        .expect("not refused")
        .map(Cow::into_owned)
    };
    let subscribe = event("<Event>subscribe</Event>");
    let click = event("<Event>CLICK</Event><EventKey>MENU_1</EventKey>");
    assert_eq!(derive(&subscribe).as_deref(), Some("o_abc+1700000000+subscribe"));
    assert_eq!(derive(&click).as_deref(), Some("o_abc+1700000000+CLICK+MENU_1"));
    assert_eq!(derive(&click), derive(&click.replace("<xml>", "<xml>\n  ")));
    assert_eq!(derive(&event("")).as_deref(), Some("o_abc+1700000000"));
    let contact = event("<Event>change_contact</Event><ChangeType>update_user</ChangeType><UserID>zhangsan</UserID>");
    assert_eq!(
        derive(&contact).as_deref(),
        Some("o_abc+1700000000+change_contact+update_user+zhangsan")
    );
    // A required part still must be there.
    assert_eq!(derive("<xml><CreateTime>1</CreateTime><Event>x</Event></xml>"), None);
    assert!(Alternative::parse("?xml:A+?xml:B").is_err());
    assert!(Alternative::parse("?xml:A+xml:B").is_ok());
}

#[test]
fn source_errors_name_the_choices() {
    assert_eq!(
        Source::parse("jsn:/msgId").expect_err("bad"),
        "unknown source \"jsn:/msgId\" (expected json:, xml:, header:, query:, form:, body)"
    );
    assert!(Source::parse("header:").is_err());
    assert!(Source::parse("header:bad name").is_err());
}

#[test]
fn a_stored_key_reuses_its_threads_buffer_and_one_made_meanwhile_has_its_own() {
    let first = StoredKey::new("dedup:", "bot", "m1");
    let buffer = first.as_str().as_ptr();
    // Made while the first holds the buffer: right all the same.
    let meanwhile = StoredKey::new("dedup:", "bot", "m2");
    assert_eq!((first.as_str(), meanwhile.as_str()), ("dedup:bot:m1", "dedup:bot:m2"));
    drop(meanwhile);
    drop(first);
    // The next key on this thread is written where the first was: no allocation.
    let next = StoredKey::new("dedup:", "bot", "m3");
    assert_eq!(next.as_str(), "dedup:bot:m3");
    assert_eq!(next.as_str().as_ptr(), buffer);
    assert_eq!(&*next.shared(), "dedup:bot:m3");
}

#[test]
fn stored_keys_hash_what_a_sender_could_abuse() {
    assert_eq!(&*stored_key("dedup:", "bot", "m1"), "dedup:bot:m1");
    let hashed = |v: &str| format!("dedup:bot:sha256:{}", hex::encode(Sha256::digest(v.as_bytes())));
    for value in ["a b", "{slot}x", "é", &"x".repeat(129), "tab\t"] {
        assert_eq!(*stored_key("dedup:", "bot", value), *hashed(value), "{value:?}");
    }
    assert_eq!(
        *stored_key("dedup:", "bot", &"x".repeat(128)),
        *format!("dedup:bot:{}", "x".repeat(128))
    );
}
