#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/ (run from anywhere; idempotent).

Seeds are meant to be read: real webhook bodies, pipelined and chunked requests,
configs as shipped. The fuzzer grows its own corpus from them (kept out of git)."""
import os
import pathlib

FUZZ = pathlib.Path(__file__).resolve().parent.parent
ROOT = FUZZ.parent


def write(target, name, data):
    d = FUZZ / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


# ------------------------------------------------------------------ key_extraction
# Four lines (key list, query, Content-Type, X-Id header), then the body.
def key(name, specs, body, query="", ctype="application/json", xid=""):
    write("key_extraction", name, f"{specs}\n{query}\n{ctype}\n{xid}\n".encode() + (body.encode() if isinstance(body, str) else body))


WECHAT_TEXT = """<xml>
  <ToUserName><![CDATA[gh_123456789abc]]></ToUserName>
  <FromUserName><![CDATA[oUpF8uMuAJO_M2pxb1Q9zNjWeS6o]]></FromUserName>
  <CreateTime>1700000000</CreateTime>
  <MsgType><![CDATA[text]]></MsgType>
  <Content><![CDATA[hello & <world>]]></Content>
  <MsgId>7891234567890123457</MsgId>
</xml>"""
WECHAT_EVENT = """<xml><ToUserName><![CDATA[gh_1]]></ToUserName><FromUserName><![CDATA[o_abc]]></FromUserName><CreateTime>1700000001</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[subscribe]]></Event></xml>"""
WECHAT_SAFE = """<xml>
    <ToUserName><![CDATA[gh_1]]></ToUserName>
    <Encrypt><![CDATA[hyzAe4OzmOMbd6TvGdIOO6uBmdJoD0Fk53REIHvxYtJlE2B655HuD0m8KUePWB3+LrPXo87wzQ1QLvbeUgmBM4x6F8PGHQHFVAFmOD2LdJF9FrXpbUAh0B5GIItb52sn896wVsMSHGuPE328HnRGBcrS7C41IzDWyWNlZkyyXwon8T332jisa+h6tEDYsVticbSnyU8dKOIbgU6ux5VTjg3yt+WGzjlpKn6NPhRjpA912xMezR4kw6KWwMrCVKSVCZciVGCgavjIQ6X8tCOp3yZbGpy0VxpAe+77TszTfRd5RJSVO/HTnifJpXgCSUdUue1v6h0EIBYYI1BD1DlD+C0CR8e6OewpusjZ4uBl9FyJvnhvQl+q5rv1ixrcpCumEPo5MJSgM9ehVsNPfUM669WuMyVWQLCzpu9GhglF2PE=]]></Encrypt>
</xml>"""
WECOM_SYS = """<xml><ToUserName><![CDATA[ww1]]></ToUserName><FromUserName><![CDATA[sys]]></FromUserName><CreateTime>1700000002</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[change_external_contact]]></Event><ChangeType><![CDATA[add_external_contact]]></ChangeType><UserID><![CDATA[zhangsan]]></UserID><ExternalUserID><![CDATA[wm_x]]></ExternalUserID></xml>"""

key("wechat_text_msgid", "xml:MsgId xml:MsgID xml:FromUserName+xml:CreateTime", WECHAT_TEXT, "signature=abc&timestamp=1700000000&nonce=1", "text/xml")
key("wechat_event_composite", "xml:MsgId xml:FromUserName+xml:CreateTime", WECHAT_EVENT, "", "text/xml")
key("wechat_safe_mode_outer", "xml:Encrypt xml:/xml/ToUserName", WECHAT_SAFE, "msg_signature=x&timestamp=1&nonce=2&encrypt_type=aes", "text/xml")
key("wecom_sys_change", "xml:FromUserName+xml:CreateTime+xml:ChangeType+xml:UserID+xml:ExternalUserID body", WECOM_SYS, "", "text/xml")
key("xml_entities_and_char_refs", "xml:MsgId xml:/xml/A/B", "<xml><MsgId> &#x41;&lt;b&gt;&amp;&#66; </MsgId><A><B>deep</B></A></xml>", "", "application/xml")
key("xml_doctype_refused", "xml:MsgId json:/msgId", '<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY x "boom">]><xml><MsgId>&x;</MsgId></xml>', "", "text/xml")
key("xml_children_and_mixed", "xml:MsgId xml:Items", "<xml><Items><i>1</i></Items><MsgId>a<![CDATA[b]]>c</MsgId></xml>", "", "text/xml")
key("xml_two_roots_malformed", "xml:MsgId", "<xml><MsgId>1</MsgId></xml><xml/>", "", "text/xml")
key("xml_comment_pi_decl", "xml:/root/Id", '<?xml version="1.0" encoding="UTF-8"?><!-- c --><root><?pi x?><Id>  id-1 </Id></root>', "", "text/xml")

key("json_simple", "json:/msgId json:/data/msgId json:/eventId", '{"msgId":"m1","content":"hello"}')
key("json_big_number", "json:/data/newMsgId", '{"typeName":"AddMsg","appid":"wx_1","data":{"msgId":1234,"newMsgId":7891234567890123457,"fromUser":{"string":"wxid_a"}}}')
key("json_feishu_v2", "json:/header/event_id json:/uuid", '{"schema":"2.0","header":{"event_id":"5e3702a84e847582be8db7fb73283c02","event_type":"im.message.receive_v1","create_time":"1608725989000","token":"rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV","app_id":"cli_9f5343c580712544","tenant_key":"2ca1d211f64f6438"},"event":{"message":{"message_id":"om_1","content":"{\\"text\\":\\"hi\\"}"}}}')
key("json_feishu_encrypt", "json:/encrypt json:/header/event_id", '{"encrypt":"FIAfJPGRmFZWkaxPQ1XrJZVbv2JwdjfLk4jx0k/U1deAqYK3AXOZ5zcHt/cC4ZNTqYwWUW/EoL+b2hW/C4zoAQQ5CeMtbxX2zHjm+E4nX/Aww+FHUL6iuIMaeL2KLxqdtbHRC50vgC2YI7xohnb3KuCNBMUzLiPeNIpVdnYaeteCmSaESb+AZpJB9PExzTpRDzCRv+T6o5vlzaE8UgIneC1sYu85BnPBEMTSuj1ZZzfdQi7ZW992Z4dmJxn9e8FL2VArNm99f5Io3c2O4AcNsQENNKtfAAxVjCqc3mg5jF0nKabA+u/5vrUD76flX1UOF5fzJ0sApG2OEn9wfyPDRBsApn9o+fceF9hNrYBGsdtZrZYyGG387CGOtKsuj8e2E8SNp+Pn4E9oYejOTR+ZNLNi+twxaXVlJhr6l+RXYwEiMGQE9zGFBD6h2dOhKh3W84p1GEYnSRIz1+9/Hp66arjC7RCrhuW5OjCj4QFEQJiwgL45XryxHtiZ7JdAlPmjVsL03CxxFZarzxzffryrWUG3VkRdHRHbTsC34+ScoL5MTDU1QAWdqUC1T7xT0lCvQELaIhBTXAYrznJl6PlA83oqlMxpHh0gZBB1jFbfoUr7OQbBs1xqzpYK6Yjux6diwpQB1zlZErYJUfCqK7G/zI9yK/60b4HW0k3M+AvzMcw="}')
key("json_slack_event", "json:/event_id", '{"token":"z26uFbvR1xHJEdHE1OQiO6t8","team_id":"T123ABC","api_app_id":"A123ABC","event":{"type":"app_mention","user":"U123ABC","text":"<@U0LAN0Z89> hi","ts":"1515449522.000016","channel":"C123ABC","event_ts":"1515449522000016"},"type":"event_callback","event_id":"Ev123ABC456","event_time":1515449522000016}')
key("json_slack_url_verification", "json:/event_id", '{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}')
key("json_stripe_event", "json:/id", '{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","api_version":"2022-11-15","created":1686089970,"data":{"object":{"id":"seti_1","object":"setup_intent"}},"livemode":false,"pending_webhooks":0,"type":"setup_intent.created"}')
key("json_telegram_update", "json:/update_id", '{"update_id":10000,"message":{"date":1441645532,"chat":{"last_name":"Test","id":1111111,"first_name":"Test","username":"Test"},"message_id":1365,"from":{"id":1111111,"first_name":"Test"},"text":"/start"}}')
key("json_dingtalk_robot", "json:/msgId", '{"conversationId":"cid1","chatbotUserId":"$:LWCP_v1:$x","msgId":"msgdNNYDIqRzzA4jBq2gtHlUA==","senderNick":"A","isAdmin":true,"createAt":1700000000000,"text":{"content":" hi"},"msgtype":"text"}')
key("json_escapes_and_unicode", "json:/a~1b json:/m~0n json:/\\u00e9", '{"a/b":"\\u4e2d\\u6587\\ud83d\\ude00","m~n":"tilde","é":"e-acute"}')
key("json_duplicate_keys_last_wins", "json:/msgId json:/x/0", '{"msgId":"first","msgId":"second","x":["a","b"]}')
key("json_array_index", "json:/items/1/id json:/items/01/id", '{"items":[{"id":1},{"id":-2.5e10},{"id":"c"}]}')
key("json_wrong_types", "json:/t json:/n json:/o json:/e json:/f", '{"t":true,"n":null,"o":{},"e":"","f":0.0}')
key("json_deep", "json:/a/a/a/a/a/a/a/a", '{"a":' * 40 + '"x"' + '}' * 40)
key("json_long_id_hashed", "json:/msgId", '{"msgId":"' + "x" * 200 + '"}')
key("json_id_with_space_and_braces", "json:/msgId", '{"msgId":"a b{c}"}')
key("json_not_json", "json:/msgId body", "msgId=1")

key("form_field", "form:msg_id form:id", "msg_id=m%201&id=2&msg_id=later", "", "application/x-www-form-urlencoded; charset=utf-8")
key("form_wrong_content_type", "form:msg_id", "msg_id=1", "", "text/plain")
key("query_and_header", "query:msg_id header:x-id header:X-GitHub-Delivery", "{}", "msg_id=q%2B1&msg_id=2", "application/json", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
key("github_delivery_header", "header:x-id json:/zen", '{"zen":"Keep it logically awesome.","hook_id":1}', "", "application/json", "d3b07384-d9a0-4e9b-8a0d-4d6e7a0f7c11")
key("body_hash", "json:/nope body", "raw bytes \x00\xff", "", "application/octet-stream")
key("composite_mixed_sources", "query:a+header:x-id+json:/b form:x+body", '{"b":7}', "a=1", "application/json", "h")
key("bad_specs_ignored", "jsn:/msgId xml: json:noslash header: query: json:/m~2 json:/ok", '{"ok":"yes","":"empty-key"}')

# ------------------------------------------------------------------ config_parse
for path in ["gateway.toml", "deploy/docker/gateway.toml", "deploy/kubernetes/base/gateway.toml", "deploy/kubernetes/standalone/gateway.toml"]:
    write("config_parse", path.replace("/", "_"), (ROOT / path).read_text())

MIN = '[server]\nlisten = "127.0.0.1:0"\n\n[store]\n{store}\n\n{routes}'
ROUTE = '[[routes]]\nname = "bot"\npath = "/hook"\nupstream = "http://127.0.0.1:5000"\n{extra}\n'
cfgs = {
    "minimal": MIN.format(store="", routes=ROUTE.format(extra='key = ["json:/msgId"]')),
    "redis_standalone": MIN.format(store='backend = "redis"\nurl = "redis://:secret@127.0.0.1:6379/0"\npool_size = 8\ntimeout = "100ms"\non_error = "forward"', routes=ROUTE.format(extra='key = ["json:/msgId"]')),
    "redis_cluster": MIN.format(store='backend = "redis"\ncluster = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]', routes=ROUTE.format(extra='key = ["header:X-Id"]')),
    "redis_url_env": MIN.format(store='backend = "redis"\nurl_env = "REDIS_URL"', routes=ROUTE.format(extra='key = ["json:/msgId"]')),
    "memory_bounds": MIN.format(store='backend = "memory"\nmax_entries = 200_000\nmax_bytes = "64MiB"\nkey_prefix = "x:"', routes=ROUTE.format(extra='key = ["body"]\nreplay = true')),
    "defaults_and_policies": '[server]\nmax_body = "64KiB"\nheader_timeout = "5s"\nshutdown_grace = "10s"\nshutdown_delay = "1s"\n[store]\ntimeout = "250ms"\n[defaults]\nupstream_timeout = "3s"\nprocessing_ttl = "10s"\ncompleted_ttl = "1h"\non_in_flight = "conflict"\nin_flight_wait = "2s"\non_upstream_timeout = "keep"\nmode = "shadow"\non_missing_key = "reject"\nduplicate_status = 202\nduplicate_body = "{}"\nduplicate_content_type = "application/json"\n' + ROUTE.format(extra='key = ["json:/id", "query:id+header:X-A"]'),
    "processing_ttl_too_short": MIN.format(store='timeout = "1s"', routes=ROUTE.format(extra='key = ["json:/msgId"]\nupstream_timeout = "25s"\nprocessing_ttl = "28s"')),
    "preset_wechat_mp": MIN.format(store="", routes=ROUTE.format(extra='preset = "wechat-mp"\nsecret = "token123"\naes_key = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"\napp_id = "wx0123456789abcdef"')),
    "preset_wecom": MIN.format(store="", routes=ROUTE.format(extra='preset = "wecom"\nsecret = "t"\naes_key = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"\napp_id = "ww1"')),
    "preset_slack_github_stripe": MIN.format(store="", routes=ROUTE.format(extra='preset = "slack"\nsecret_env = "SLACK_SECRET"').replace('name = "bot"', 'name = "slack"') + ROUTE.format(extra='preset = "github"\nsecret = "s"').replace('name = "bot"', 'name = "gh"').replace('"/hook"', '"/gh/*"') + ROUTE.format(extra='preset = "stripe"\nsecret = "whsec_x"').replace('name = "bot"', 'name = "stripe"').replace('"/hook"', '"/stripe"')),
    "preset_feishu_telegram": MIN.format(store="", routes=ROUTE.format(extra='preset = "feishu"\nsecret = "v"\naes_key = "k"').replace('name = "bot"', 'name = "fs"') + ROUTE.format(extra='preset = "telegram"\nsecret = "t"').replace('name = "bot"', 'name = "tg"').replace('"/hook"', '"/tg"')),
    "preset_wkteam_dingtalk_shopify_sw": MIN.format(store="", routes=ROUTE.format(extra='preset = "wkteam"') + ROUTE.format(extra='preset = "dingtalk"\nsecret = "d"').replace('name = "bot"', 'name = "dt"').replace('"/hook"', '"/dt"') + ROUTE.format(extra='preset = "shopify"\nsecret = "s"').replace('name = "bot"', 'name = "shop"').replace('"/hook"', '"/shop"') + ROUTE.format(extra='preset = "standard-webhooks"\nsecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"').replace('name = "bot"', 'name = "sw"').replace('"/hook"', '"/sw"')),
    "errors_everywhere": '[server]\nlisten = "nowhere"\nmax_body = "1XB"\nbogus = 1\n[store]\nbackend = "etcd"\n[[routes]]\nname = "bad name!"\npath = "hook"\nupstream = "ftp://x"\nkey = ["jsn:/msgId", ""]\non_in_flight = "maybe"\n[[routes]]\nname = "bad name!"\n',
    "huge_durations": MIN.format(store='timeout = "500000000000years"', routes=ROUTE.format(extra='key = ["json:/msgId"]\nupstream_timeout = "18446744073709551615s"\nprocessing_ttl = "1ns"')),
    "not_toml": "[[routes]\nname = \n",
}
for name, text in cfgs.items():
    write("config_parse", name + ".toml", text)


# ------------------------------------------------------------------ framing_vs_hyper
# Byte 0: number of read sizes n (mod 16); then n sizes (byte + 1 each); then the stream.
def framing(name, stream, sizes=()):
    if isinstance(stream, str):
        stream = stream.encode()
    write("framing_vs_hyper", name, bytes([len(sizes)]) + bytes(s - 1 for s in sizes) + stream)


JSON = b'{"msgId":"m1","content":"hello"}'
post = lambda path, body, extra="": f"POST {path} HTTP/1.1\r\nHost: gw\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body
chunk = lambda body: f"{len(body):x}\r\n".encode() + body + b"\r\n"
get = b"GET /hook?echostr=1 HTTP/1.1\r\nHost: gw\r\n\r\n"

framing("get", get)
framing("post_json", post("/hook", JSON))
framing("post_wechat_xml", post("/wx?signature=a&timestamp=1&nonce=2", WECHAT_TEXT.encode(), "Content-Type: text/xml\r\n"))
framing("pipelined_three", post("/hook", JSON) + get + post("/hook", b"{}"))
framing("pipelined_split_reads", post("/hook", JSON) + get + post("/hook", b"{}"), (1, 7, 30))
framing("chunked_with_extensions_and_trailers", b"POST /hook HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1;q=\"a;b\"\r\nhello\r\n11 \t;x\r\nTransfer-Encoding\r\n0\r\nX-Trailer: 1\r\n\r\n" + get)
framing("chunked_split_every_byte", b"POST /hook HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunk(JSON) + b"0\r\n\r\n" + get, (1,))
framing("chunked_uppercase_hex", b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n000A\r\n0123456789\r\n0\r\n\r\n" + get)
framing("cl_then_te", b"POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get)
framing("te_then_cl", b"POST /hook HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + get)
framing("cl_te_after_pipelined", post("/hook", JSON) + b"POST /s HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", (20, 3))
framing("conflicting_lengths", b"POST /hook HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd")
framing("equal_repeated_lengths", b"POST /hook HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 003\r\n\r\nabc" + get)
framing("length_list", b"POST /hook HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc" + get)
decoy = b"GET /decoy HTTP/1.1\r\nContent-Length: 80\r\n\r\n"
framing("long_length_line_smuggle", b"POST /hook HTTP/1.1\r\nContent-Length: " + b"0" * 1100 + str(len(decoy)).encode() + b"\r\n\r\n" + decoy + b"POST /s HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", (200, 255))
framing("http10_keep_alive", b"POST /a HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi" + b"GET /b HTTP/1.0\r\n\r\n")
framing("http10_te", b"POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
framing("te_not_chunked", b"POST /a HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nxyz")
framing("expect_continue", b"POST /hook HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi" + get)
framing("connection_close", b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n" + get)
framing("leading_empty_lines", b"\r\n\r\n\nGET /a HTTP/1.1\r\n\r\n\r\nGET /b HTTP/1.1\n\n")
framing("bare_lf_heads", b"POST /a HTTP/1.1\nContent-Length: 2\n\nhiGET /b HTTP/1.1\nHost: x\n\n")
framing("obs_fold_rejected", b"GET /a HTTP/1.1\r\nX: a\r\n b\r\n\r\n")
framing("absolute_form_and_connect", b"GET http://example.com/x?y HTTP/1.1\r\n\r\nCONNECT example.com:443 HTTP/1.1\r\n\r\n")
framing("upgrade_request", b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + get)
framing("h2_preface_on_http1", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
framing("chunk_size_overflow", b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\n" + get)
framing("bad_chunk_crlf", b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n" + get)
framing("trailer_with_bare_lf", b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nA: b\nPOST /x HTTP/1.1\r\n\r\n" + get)
framing("head_body_and_next_in_one_read_after_split", post("/a", b"0123456789") + post("/b", b"x"), (10, 255, 2))
framing("many_headers", b"GET /a HTTP/1.1\r\n" + b"A: b\r\n" * 99 + b"\r\n" + get)
framing("method_and_target_oddities", b"M-SEARCH * HTTP/1.1\r\n\r\nOPTIONS * HTTP/1.1\r\n\r\nget /lower HTTP/1.1\r\n\r\n")


# ------------------------------------------------------------------ client_vs_hyper
# Byte 0: bit 0 = the request was a HEAD, bits 4..8 = how many read sizes follow.
def client(name, stream, sizes=(), head=False):
    assert len(sizes) < 16
    write("client_vs_hyper", name, bytes([len(sizes) << 4 | int(head)]) + bytes(s - 1 for s in sizes) + stream)


OK_JSON = b'{"reply":"ok"}'
client("ok_with_length", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n" + OK_JSON)
client("ok_split_every_byte", b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n" + OK_JSON, (1,))
client("chunked_with_trailers", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", (3, 7))
client("chunked_and_length", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
client("close_delimited", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end")
client("http10_keep_alive", b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
client("connection_close", b"HTTP/1.1 200 OK\r\nConnection: close, x-hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n\r\nok")
client("continue_then_answer", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 Too Big\r\nContent-Length: 0\r\n\r\n")
client("no_content", b"HTTP/1.1 204 No Content\r\n\r\n")
client("head_answer", b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", head=True)
client("conflicting_lengths", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc")
client("length_list", b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok")
client("extra_bytes_after", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n")
client("cut_short", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
client("bad_chunk", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
client("custom_reason", b"HTTP/1.1 202 Queued For Later\r\nContent-Length: 0\r\n\r\n")
client("gzip_then_close", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxyz")
client("switching_protocols", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n")
# What client_vs_hyper's first long runs found (both fixed): an HTTP/1.0 answer with
# Transfer-Encoding that carries no body, and Content-Lengths hyper reads its own way.
client("http10_chunked_no_content", b"HTTP/1.0 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n")
client("length_leading_zeros", b"HTTP/1.1 200 OK\r\nContent-Length: 0002\r\n\r\nok")
client("length_above_hyper_max", b"HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551614\r\n\r\nok")


# ------------------------------------------------------------------ resp_vs_redis_rs
# Byte 0: how many read sizes follow (mod 16); then the replies.
def resp(name, stream, sizes=()):
    write("resp_vs_redis_rs", name, bytes([len(sizes)]) + bytes(s - 1 for s in sizes) + stream)


resp("claim_replies", b"$-1\r\n$80\r\n" + b'{"state":"processing","token":"0123456789abcdef0123456789abcdef","first_seen_ms":1}' [:80] + b"\r\n")
resp("script_and_ints", b":1\r\n:0\r\n:-1\r\n+OK\r\n+QUEUED\r\n", (2, 5))
resp("inspect_reply", b"*2\r\n$14\r\n{\"state\":\"x\"}\r\n:1500\r\n*2\r\n$-1\r\n:-2\r\n")
resp("errors", b"-NOSCRIPT No matching script.\r\n-READONLY You can't write against a read only replica.\r\n-MOVED 3999 127.0.0.1:6381\r\n")
resp("nested_and_nil_array", b"*2\r\n*1\r\n$0\r\n\r\n*-1\r\n*0\r\n", (1,))
resp("binary_bulk", b"$6\r\n\r\n\x00\xff\r\n\r\n")
