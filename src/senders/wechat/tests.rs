//! Unit tests of [`crate::senders::wechat`].

//! Every published WeChat / WeCom value in senders.md (and the two DingTalk event
//! samples, which use the same crypto), reproduced.

use super::*;
use aes::cipher::BlockModeEncrypt;

/// Test-only encryption, to reproduce published ciphertexts byte for byte.
pub fn encrypt(eak: &str, random16: &str, msg: &str, receive_id: &str) -> String {
    let cipher = MessageCipher::from_encoding_aes_key(eak).expect("key");
    let mut plain = Vec::new();
    plain.extend_from_slice(random16.as_bytes());
    plain.extend_from_slice(&u32::try_from(msg.len()).expect("len").to_be_bytes());
    plain.extend_from_slice(msg.as_bytes());
    plain.extend_from_slice(receive_id.as_bytes());
    let pad = PAD_BLOCK - plain.len() % PAD_BLOCK;
    plain.extend(std::iter::repeat_n(u8::try_from(pad).expect("pad"), pad));
    let len = plain.len();
    let enc = cbc::Encryptor::<Aes256>::inner_iv_init(cipher.cipher.clone(), &cipher.iv.into());
    let out = enc
        .encrypt_padded::<NoPadding>(&mut plain, len)
        .expect("encrypt")
        .to_vec();
    LENIENT_B64.encode(out)
}

fn sig(parts: &[&str]) -> String {
    let mut parts = parts.to_vec();
    hex::encode(sha1_sorted(&mut parts))
}

/// Decrypts and returns (random prefix, message, receive id).
fn open(eak: &str, encrypt: &str) -> (String, String, String) {
    let m = MessageCipher::from_encoding_aes_key(eak)
        .expect("key")
        .decrypt(encrypt)
        .expect("decrypts");
    (
        String::from_utf8(m.buf[..16].to_vec()).expect("random"),
        String::from_utf8(m.msg().to_vec()).expect("msg"),
        String::from_utf8(m.receive_id().to_vec()).expect("id"),
    )
}

// ---- WeChat Official Account: the official message-push page.
pub const MP_TOKEN: &str = "AAAAA";
pub const MP_EAK: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
pub const MP_APPID: &str = "wxba5fad812f8e6fb9";
pub const MP_ENCRYPT: &str = "+qdx1OKCy+5JPCBFWw70tm0fJGb2Jmeia4FCB7kao+/Q5c/ohsOzQHi8khUOb05JCpj0JB4RvQMkUyus8TPxLKJGQqcvZqzDpVzazhZv6JsXUnnR8XGT740XgXZUXQ7vJVnAG+tE8NUd4yFyjPy7GgiaviNrlCTj+l5kdfMuFUPpRSrfMZuMcp3Fn2Pede2IuQrKEYwKSqFIZoNqJ4M8EajAsjLY2km32IIjdf8YL/P50F7mStwntrA2cPDrM1kb6mOcfBgRtWygb3VIYnSeOBrebufAlr7F9mFUPAJGj04=";
const MP_MSG: &str = r#"{"ToUserName":"gh_97417a04a28d","FromUserName":"o9AgO5Kd5ggOC-bXrbNODIiE3bGY","CreateTime":1714112445,"MsgType":"event","Event":"debug_demo","debug_str":"hello world"}"#;
const MP_REPLY_ENCRYPT: &str =
    "ELGduP2YcVatjqIS+eZbp80MNLoAUWvzzyJxgGzxZO/5sAvd070Bs6qrLARC9nVHm48Y4hyRbtzve1L32tmxSQ==";

#[test]
fn mp_1_to_4_signatures() {
    assert_eq!(
        sig(&[MP_TOKEN, "1714036504", "1514711492"]),
        "f464b24fc39322e44b38aa78f5edd27bd1441696"
    );
    assert_eq!(
        sig(&[MP_TOKEN, "1714037059", "486452656"]),
        "899cf89e464efb63f54ddac96b0a0a235f53aa78"
    );
    assert_eq!(
        sig(&[MP_TOKEN, "1714112445", "415670741"]),
        "6c5c811b55cc85e0e1b54100749188c20beb3f5d"
    );
    assert_eq!(
        sig(&[MP_TOKEN, "1714112445", "415670741", MP_ENCRYPT]),
        "046e02f8204d34f8ba5fa3b1db94908f3df2e9b3"
    );
}

#[test]
fn mp_5_safe_mode_decryption() {
    assert_eq!(LENIENT_B64.decode(MP_ENCRYPT).expect("b64").len(), 224);
    assert_eq!(
        open(MP_EAK, MP_ENCRYPT),
        ("a8eedb185eb2fecf".into(), MP_MSG.into(), MP_APPID.into())
    );
    assert_eq!(MP_MSG.len(), 167);
    // Re-encrypting with the recovered prefix gives the ciphertext back (pins the
    // 32-byte padding: 205 bytes + 19).
    assert_eq!(encrypt(MP_EAK, "a8eedb185eb2fecf", MP_MSG, MP_APPID), MP_ENCRYPT);
}

#[test]
fn mp_6_and_7_reply_encrypt_and_signature() {
    assert_eq!(
        encrypt(MP_EAK, "707722b803182950", r#"{"demo_resp":"good luck"}"#, MP_APPID),
        MP_REPLY_ENCRYPT
    );
    assert_eq!(open(MP_EAK, MP_REPLY_ENCRYPT).1, r#"{"demo_resp":"good luck"}"#);
    assert_eq!(
        sig(&[MP_TOKEN, "1713424427", "415670741", MP_REPLY_ENCRYPT]),
        "1b9339964ed2e271e7c7b6ff2b0ef902fc94dea1"
    );
}

// ---- WxJava WxCryptUtilTest (Tencent's sample test).
const WXJ_EAK: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";
const WXJ_APPID: &str = "wxb11529c136998cb6";

#[test]
fn wxj_1_and_2_wxjava_ciphertexts() {
    let msg1 = "我是中文abcd123";
    let enc1 = "jn1L23DB+6ELqJ+6bruv21Y6MD7KeIfP82D6gU39rmkgczbWwt5+3bnyg5K55bgVtVzd832WzZGMhkP72vVOfg==";
    assert_eq!(encrypt(WXJ_EAK, "aaaabbbbccccdddd", msg1, WXJ_APPID), enc1);
    assert_eq!(
        open(WXJ_EAK, enc1),
        ("aaaabbbbccccdddd".into(), msg1.into(), WXJ_APPID.into())
    );
    let msg2 = "<xml><ToUserName><![CDATA[oia2Tj我是中文jewbmiOUlr6X-1crbLOvLw]]></ToUserName><FromUserName><![CDATA[gh_7f083739789a]]></FromUserName><CreateTime>1407743423</CreateTime><MsgType><![CDATA[video]]></MsgType><Video><MediaId><![CDATA[eYJ1MbwPRJtOvIEabaxHs7TX2D-HV71s79GUxqdUkjm6Gs2Ed1KF3ulAOA9H1xG0]]></MediaId><Title><![CDATA[testCallBackReplyVideo]]></Title><Description><![CDATA[testCallBackReplyVideo]]></Description></Video></xml>";
    let enc2 = "jn1L23DB+6ELqJ+6bruv23M2GmYfkv0xBh2h+XTBOKVKcgDFHle6gqcZ1cZrk3e1qjPQ1F4RsLWzQRG9udbKWesxlkupqcEcW7ZQweImX9+wLMa0GaUzpkycA8+IamDBxn5loLgZpnS7fVAbExOkK5DYHBmv5tptA9tklE/fTIILHR8HLXa5nQvFb3tYPKAlHF3rtTeayNf0QuM+UW/wM9enGIDIJHF7CLHiDNAYxr+r+OrJCmPQyTy8cVWlu9iSvOHPT/77bZqJucQHQ04sq7KZI27OcqpQNSto2OdHCoTccjggX5Z9Mma0nMJBU+jLKJ38YB1fBIz+vBzsYjrTmFQ44YfeEuZ+xRTQwr92vhA9OxchWVINGC50qE/6lmkwWTwGX9wtQpsJKhP+oS7rvTY8+VdzETdfakjkwQ5/Xka042OlUb1/slTwo4RscuQ+RdxSGvDahxAJ6+EAjLt9d8igHngxIbf6YyqqROxuxqIeIch3CssH/LqRs+iAcILvApYZckqmA7FNERspKA5f8GoJ9sv8xmGvZ9Yrf57cExWtnX8aCMMaBropU/1k+hKP5LVdzbWCG0hGwx/dQudYR/eXp3P0XxjlFiy+9DMlaFExWUZQDajPkdPrEeOwofJb";
    assert_eq!(encrypt(WXJ_EAK, "aaaabbbbccccdddd", msg2, WXJ_APPID), enc2);
    assert_eq!(open(WXJ_EAK, enc2).1, msg2);
}

// ---- WeCom: wechatpy tests/test_crypto.py.
const WP_TOKEN: &str = "123456";
const WP_EAK: &str = "kWxPEV2UEDyxWpmPdKC3F4dgPDmOvfKX1HGnEUDS1aR";
const WP_CORPID: &str = "wx49f0ab532d5d035a";

#[test]
fn wp_1_echostr_signature_and_decryption() {
    let echo = "4ByGGj+sVCYcvGeQYhaKIk1o0pQRNbRjxybjTGblXrBaXlTXeOo1+bXFXDQQb1o6co6Yh9Bv41n7hOchLF6p+Q==";
    assert_eq!(
        sig(&[WP_TOKEN, "1411443780", "437374425", echo]),
        "dd6b9c95b495b3f7e2901bfbc76c664930ffdb96"
    );
    assert_ne!(
        sig(&[WP_TOKEN, "1411443780", "437374424", echo]),
        "dd6b9c95b495b3f7e2901bfbc76c664930ffdb96"
    );
    assert_eq!(
        open(WP_EAK, echo),
        (
            "2304fc2fe146f1f8".into(),
            "5927782489442352469".into(),
            WP_CORPID.into()
        )
    );
}

const WP_DEC_ENCRYPT: &str = "RgqEoJj5A4EMYlLvWO1F86ioRjZfaex/gePD0gOXTxpsq5Yj4GNglrBb8I2BAJVODGajiFnXBu7mCPatfjsu6IHCrsTyeDXzF6Bv283dGymzxh6ydJRvZsryDyZbLTE7rhnus50qGPMfp2wASFlzEgMW9z1ef/RD8XzaFYgm7iTdaXpXaG4+BiYyolBug/gYNx410cvkKR2/nPwBiT+P4hIiOAQqGp/TywZBtDh1yCF2KOd0gpiMZ5jSw3e29mTvmUHzkVQiMS6td7vXUaWOMZnYZlF3So2SjHnwh4jYFxdgpkHHqIrH/54SNdshoQgWYEvccTKe7FS709/5t6NMxuGhcUGAPOQipvWTT4dShyqio7mlsl5noTrb++x6En749zCpQVhDpbV6GDnTbcX2e8K9QaNWHp91eBdCRxthuL0=";

#[test]
fn wp_2_decrypt_message() {
    let msg = "<xml><ToUserName><![CDATA[wx49f0ab532d5d035a]]></ToUserName>\n<FromUserName><![CDATA[messense]]></FromUserName>\n<CreateTime>1411525903</CreateTime>\n<MsgType><![CDATA[text]]></MsgType>\n<Content><![CDATA[test]]></Content>\n<MsgId>4363689963896700987</MsgId>\n<AgentID>1</AgentID>\n</xml>";
    assert_eq!(
        sig(&[WP_TOKEN, "1411525903", "461056294", WP_DEC_ENCRYPT]),
        "74d92dfeb87ba7c714f89d98870ae5eb62dff26d"
    );
    assert_eq!(
        open(WP_EAK, WP_DEC_ENCRYPT),
        ("ec90b1530358d4d3".into(), msg.into(), WP_CORPID.into())
    );
    assert_eq!(msg.len(), 281);
}

#[test]
fn wp_3_encrypt_message() {
    let reply = "<xml>\n<MsgType><![CDATA[text]]></MsgType>\n<Content><![CDATA[test]]></Content>\n<FromUserName><![CDATA[wx49f0ab532d5d035a]]></FromUserName>\n<ToUserName><![CDATA[messense]]></ToUserName>\n<AgentID>1</AgentID>\n<CreateTime>1411525903</CreateTime>\n</xml>";
    let expected = "9s4gMv99m88kKTh/H8IdkOiMg6bisoy3ypwy9H4hvSPe9nsGaqyw5hhSjdYbcrKk+j3nba4HMOTzHrluLBYqxgNcBqGsL8GqxlhZgURnAtObvesEl5nZ+uBE8bviY0LWke8Zy9V/QYKxNV2FqllNXcfmstttyIkMKCCmVbCFM2JTF5wY0nFhHZSjPUL2Q1qvSUCUld+/WIXrx0oyKQmpB6o8NRrrNrsDf03oxI1p9FxUgMnwKKZeOA/uu+2IEvEBtb7muXsVbwbgX05UPPJvFurDXafG0RQyPR+mf1nDnAtQmmNOuiR5MIkdQ39xn1vWwi1O5oazPoQJz0nTYjxxEE8kv3kFxtAGVRe3ypD3WeK2XeFYFMNMpatF9XiKzHo3";
    let enc = encrypt(WP_EAK, "1234567890123456", reply, WP_CORPID);
    assert_eq!(enc, expected);
    assert_eq!(
        sig(&[WP_TOKEN, "1411525903", "461056294", &enc]),
        "407518b7649e86ef23978113f92d27afa9296533"
    );
}

// ---- WeCom: Tencent's Sample.py (2016) and the 2014 sample.
#[test]
fn wc16_verify_url_and_decrypt_msg() {
    let (token, eak, corpid) = (
        "hJqcu3uJ9Tn2gXPmxx2w9kkCkCE2EPYo",
        "6qkdMrq68nTKduznJYO1A37W2oEgpkMUvkttRToqhUt",
        "ww1436e0e65a779aee",
    );
    let echo = "fsi1xnbH4yQh0+PJxcOdhhK6TDXkjMyhEPA7xB2TGz6b+g7xyAbEkRxN/3cNXW9qdqjnoVzEtpbhnFyq6SVHyA==";
    assert_eq!(
        sig(&[token, "1476416373", "47744683", echo]),
        "012bc692d0a58dd4b10f8dfe5c4ac00ae211ebeb"
    );
    assert_eq!(
        open(eak, echo),
        ("8908d0ff052afda0".into(), "1288432023552776189".into(), corpid.into())
    );
    let enc = "Kl7kjoSf6DMD1zh7rtrHjFaDapSCkaOnwu3bqLc5tAybhhMl9pFeK8NslNPVdMwmBQTNoW4mY7AIjeLvEl3NyeTkAgGzBhzTtRLNshw2AEew+kkYcD+Fq72Kt00fT0WnN87hGrW8SqGc+NcT3mu87Ha3dz1pSDi6GaUA6A0sqfde0VJPQbZ9U+3JWcoD4Z5jaU0y9GSh010wsHF8KZD24YhmZH4ch4Ka7ilEbjbfvhKkNL65HHL0J6EYJIZUC2pFrdkJ7MhmEbU2qARR4iQHE7wy24qy0cRX3Mfp6iELcDNfSsPGjUQVDGxQDCWjayJOpcwocugux082f49HKYg84EpHSGXAyh+/oxwaWbvL6aSDPOYuPDGOCI8jmnKiypE+";
    assert_eq!(
        sig(&[token, "1476422779", "1597212914", enc]),
        "0c3914025cb4b4d68103f6bfc8db550f79dcf48e"
    );
    let msg = "<xml><ToUserName>ww1436e0e65a779aee</ToUserName><FromUserName>ChenJiaShun</FromUserName><CreateTime>1476422779</CreateTime><MsgType>text</MsgType><Content>你好</Content><MsgId>1456453720</MsgId><AgentID>1000002</AgentID></xml>";
    assert_eq!(open(eak, enc), ("694ce5a83ae07fe3".into(), msg.into(), corpid.into()));
}

/// The GET handshakes, through `verify_echostr`: WeChat's page example (`signature`)
/// and WeCom's 2016 sample (`msg_signature` over the echostr, urlencoded in the URL).
#[test]
fn echostr_handshakes_are_checked_with_the_published_values() {
    let keys = |mode, token: &str, eak: Option<&str>| {
        Keys::new(
            mode,
            super::super::Credentials {
                secret: Some(Secret::new(token)),
                aes_key: eak.map(Secret::new),
                ..super::super::Credentials::default()
            },
        )
        .expect("keys")
    };
    let check = |keys: &Keys, uri: &str| {
        let head = http::Request::get(uri).body(()).expect("request").into_parts().0;
        keys.verify_echostr(&Delivery {
            head: &head,
            body: &[],
            now_ms: 0,
        })
    };
    let mp = keys(Mode::Mp, MP_TOKEN, Some(MP_EAK));
    let q = "timestamp=1714036504&nonce=1514711492&echostr=5838479218127813673";
    assert_eq!(
        check(
            &mp,
            &format!("/wx?signature=f464b24fc39322e44b38aa78f5edd27bd1441696&{q}")
        ),
        Ok(())
    );
    assert_eq!(
        check(
            &mp,
            &format!("/wx?signature=f464b24fc39322e44b38aa78f5edd27bd1441697&{q}")
        ),
        Err(Rejection::Mismatch("query signature"))
    );
    assert_eq!(
        check(&mp, &format!("/wx?{q}")),
        Err(Rejection::Missing("query signature"))
    );
    assert_eq!(check(&mp, "/wx?timestamp=1&nonce=2"), Ok(()), "not the handshake");
    let wecom = keys(
        Mode::Wecom,
        "hJqcu3uJ9Tn2gXPmxx2w9kkCkCE2EPYo",
        Some("6qkdMrq68nTKduznJYO1A37W2oEgpkMUvkttRToqhUt"),
    );
    let echo = "fsi1xnbH4yQh0%2BPJxcOdhhK6TDXkjMyhEPA7xB2TGz6b%2Bg7xyAbEkRxN%2F3cNXW9qdqjnoVzEtpbhnFyq6SVHyA%3D%3D";
    let uri = |sig: &str| format!("/wc?msg_signature={sig}&timestamp=1476416373&nonce=47744683&echostr={echo}");
    assert_eq!(check(&wecom, &uri("012bc692d0a58dd4b10f8dfe5c4ac00ae211ebeb")), Ok(()));
    assert_eq!(
        check(&wecom, &uri("012bc692d0a58dd4b10f8dfe5c4ac00ae211ebec")),
        Err(Rejection::Mismatch("query msg_signature"))
    );
}

#[test]
fn wc14_verify_url_and_decrypt_msg() {
    let (token, eak, corpid) = (
        "QDG6eK",
        "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C",
        "wx5823bf96d3bd56c7",
    );
    let echo = "P9nAzCzyDtyTWESHep1vC5X9xho/qYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp+4RPcs8TgAE7OaBO+FZXvnaqQ==";
    assert_eq!(
        sig(&[token, "1409659589", "263014780", echo]),
        "5c45ff5e21c57e6ad56bac8758b79b1d9ac89fd3"
    );
    assert_eq!(
        open(eak, echo),
        ("c41b64491c2468d0".into(), "1616140317555161061".into(), corpid.into())
    );
    let enc = "RypEvHKD8QQKFhvQ6QleEB4J58tiPdvo+rtK1I9qca6aM/wvqnLSV5zEPeusUiX5L5X/0lWfrf0QADHHhGd3QczcdCUpj911L3vg3W/sYYvuJTs3TUUkSUXxaccAS0qhxchrRYt66wiSpGLYL42aM6A8dTT+6k4aSknmPj48kzJs8qLjvd4Xgpue06DOdnLxAUHzM6+kDZ+HMZfJYuR+LtwGc2hgf5gsijff0ekUNXZiqATP7PF5mZxZ3Izoun1s4zG4LUMnvw2r+KqCKIw+3IQH03v+BCA9nMELNqbSf6tiWSrXJB3LAVGUcallcrw8V2t9EL4EhzJWrQUax5wLVMNS0+rUPA3k22Ncx4XXZS9o0MBH27Bo6BpNelZpS+/uh9KsNlY6bHCmJU9p8g7m3fVKn28H3KDYA5Pl/T8Z1ptDAVe0lXdQ2YoyyH2uyPIGHBZZIs2pDBS8R07+qN+E7Q==";
    assert_eq!(
        sig(&[token, "1409659813", "1372623149", enc]),
        "477715d11cdb4164915debcba66cb864d751f3e6"
    );
    let (random, msg, id) = open(eak, enc);
    assert_eq!((random.as_str(), id.as_str()), ("0960688932c47ef1", corpid));
    assert!(msg.contains("<MsgId>4561255354251345929</MsgId>"), "{msg}");
    assert_eq!(msg.len(), 284);
}

// ---- DingTalk event subscription samples: same crypto (not a preset; extra checks).
#[test]
fn dingtalk_event_samples_decrypt() {
    let e1 = "X1VSe9cTJUMZu60d3kyLYTrBq5578ZRJtteU94wG0Q4Uk6E/wQYeJRIC0/UFW5Wkya1Ihz9oXAdLlyC9TRaqsQ==";
    assert_eq!(
        sig(&["tokenxxxx", "1605695694141", "WelUQl6bCqcBa2fM", e1]),
        "f36f4ba5337d426c7d4bca0dbcb06b3ddc1388fc"
    );
    assert_eq!(
        open("o1w0aum42yaptlz8alnhwikjd3jenzt9cb9wmzptgus", e1),
        ("WelUQl6bCqcBa2fM".into(), "success".into(), "dingxxxxxx".into())
    );
    let e2 = "0vJiX6vliEpwG3U45CtXqi+m8PXbQRARJ8p8BbDuD1EMTDf0jKpQ79QS93qEk7XHpP6u+oTTrd15NRPvNvmBKyDCYxxOK+HZeKju4yhELOFchzNukR+t8SB/qk4ROMu3";
    assert_eq!(
        sig(&["mryue", "1608001896814", "WL4PK6yA", e2]),
        "03044561471240d4a14bb09372dfcfd4fd0e40cb"
    );
    assert_eq!(
        open("Yue0EfdN5900c1ce5cf6A152c63DDe1808a60c5ecd7", e2),
        (
            "l7Y3EcX2CU5w8av3".into(),
            r#"{"EventType":"check_url"}"#.into(),
            "ding6ccabc44d2c8d38b".into()
        )
    );
}

#[test]
fn tampered_ciphertexts_and_bad_keys_are_refused() {
    let cipher = MessageCipher::from_encoding_aes_key(MP_EAK).expect("key");
    assert!(cipher.decrypt("").is_none());
    assert!(cipher.decrypt("not base64!").is_none());
    assert!(cipher.decrypt(&LENIENT_B64.encode([0u8; 17])).is_none());
    let mut raw = LENIENT_B64.decode(MP_ENCRYPT).expect("b64");
    let last = raw.len() - 1;
    raw[last] ^= 0x55; // breaks the padding
    assert!(cipher.decrypt(&LENIENT_B64.encode(&raw)).is_none());
    // Random blocks: never a panic.
    let mut x = 1u32;
    for n in 1..64 {
        let block: Vec<u8> = (0..n * 16)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 24) as u8
            })
            .collect();
        let _ = cipher.decrypt(&LENIENT_B64.encode(&block));
    }
    assert!(MessageCipher::from_encoding_aes_key("short").is_err());
    assert!(MessageCipher::from_encoding_aes_key(&"!".repeat(43)).is_err());
}

/// One `wechat-mp` route with the EncodingAESKey (as the console always shows it)
/// takes the three modes, as each push's `encrypt_type` says: the published push of the
/// message-push page, sent as plaintext and encrypted; `require_encryption` refuses the
/// plaintext one only.
#[test]
fn one_route_with_aes_key_takes_plaintext_compatible_and_safe_pushes() {
    let keys = |require_encryption| {
        Keys::new(
            Mode::Mp,
            super::super::Credentials {
                secret: Some(Secret::new(MP_TOKEN)),
                aes_key: Some(Secret::new(MP_EAK)),
                app_id: Some(MP_APPID.into()),
                require_encryption,
            },
        )
        .expect("keys")
    };
    let signed = "signature=6c5c811b55cc85e0e1b54100749188c20beb3f5d&timestamp=1714112445&nonce=415670741";
    let encrypted = format!("{signed}&encrypt_type=aes&msg_signature=046e02f8204d34f8ba5fa3b1db94908f3df2e9b3");
    let safe = format!(r#"{{"ToUserName":"gh_97417a04a28d","Encrypt":"{MP_ENCRYPT}"}}"#);
    // Compatible mode: the plaintext fields beside Encrypt; the key is read from the
    // decrypted (signed) copy.
    let compatible = format!(
        r#"{{"ToUserName":"gh_97417a04a28d","FromUserName":"forged","CreateTime":1,"Encrypt":"{MP_ENCRYPT}"}}"#
    );
    let verify = |keys: &Keys, query: &str, body: &str| {
        let head = crate::senders::tests::delivery(&[], &format!("/wx?{query}"));
        let d = Delivery {
            head: &head,
            body: body.as_bytes(),
            now_ms: 0,
        };
        keys.verify(&d)
    };
    let open = keys(false);
    assert_eq!(verify(&open, signed, MP_MSG), Ok(Verdict::Plain));
    assert_eq!(
        verify(&open, &format!("{signed}&encrypt_type=raw"), MP_MSG),
        Ok(Verdict::Plain)
    );
    for body in [&safe, &compatible] {
        match verify(&open, &encrypted, body) {
            Ok(Verdict::Decrypted(plain)) => assert_eq!(plain.as_bytes(), MP_MSG.as_bytes()),
            other => panic!("{other:?}"),
        }
    }
    // Each mode is checked by its own signature.
    let forged_plain = signed.replace("6c5c", "0000");
    assert_eq!(
        verify(&open, &forged_plain, MP_MSG),
        Err(Rejection::Mismatch(SIGNATURE).into())
    );
    let forged = encrypted.replace("046e", "0000");
    assert_eq!(
        verify(&open, &forged, &safe),
        Err(Rejection::Mismatch(MSG_SIGNATURE).into())
    );
    assert_eq!(verify(&open, &encrypted, MP_MSG), Err(Rejection::NotEncrypted.into()));
    assert_eq!(
        verify(&open, &format!("{signed}&encrypt_type=rsa"), MP_MSG),
        Err(Rejection::Malformed("encrypt_type").into())
    );
    let strict = keys(true);
    assert_eq!(verify(&strict, signed, MP_MSG), Err(Rejection::Plaintext.into()));
    assert!(matches!(verify(&strict, &encrypted, &safe), Ok(Verdict::Decrypted(_))));
    let head = crate::senders::tests::delivery(&[], &format!("/wx?{signed}"));
    assert_eq!(
        open.mode_of(&head),
        Some("plaintext mode (no encrypt_type): checked by signature")
    );
}
