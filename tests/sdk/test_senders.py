#!/usr/bin/env python3
"""Senders as they really send, signed and encrypted by their own SDKs (PyPI), through
the gateway binary, to a bot that verifies what it received with the same SDKs.

Run by .ci/test in a virtualenv with tests/sdk/requirements.txt:
    target/sdk-venv/bin/python tests/sdk/test_senders.py
DEDUP_GATEWAY_BIN names the binary (default target/debug/dedup-gateway).

- WeChat (wechatpy): one wechat-mp route with the EncodingAESKey takes plaintext,
  compatible and safe mode pushes, as each push's encrypt_type says;
  require_encryption refuses the plaintext one.
- Svix (svix): svix-id/-timestamp/-signature accepted, a tampered body refused;
  Standard Webhooks (standardwebhooks) with webhook-*.
- Slack (slack-sdk), Stripe (stripe), Feishu (lark-oapi verifies and decrypts).
Every delivery the gateway forwards is verified by the bot with the sender's SDK;
a retry is answered as a duplicate and reaches the bot no more.
"""

import base64
import hashlib
import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from xml.etree import ElementTree
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import lark_oapi
import stripe
import svix.webhooks
from Crypto.Cipher import AES
from lark_oapi.core.model.raw_request import RawRequest
from lark_oapi.core.utils.decryptor import AESCipher
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook as StandardWebhook
from wechatpy import parse_message
from wechatpy.crypto import WeChatCrypto
from wechatpy.utils import WeChatSigner, check_signature

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DEDUP_GATEWAY_BIN", os.path.join(ROOT, "target", "debug", "dedup-gateway"))

WX_TOKEN = "sdk-test-token"
WX_AES_KEY = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"  # 43 characters, as the console shows it
WX_APP_ID = "wx0123456789abcdef"
SVIX_SECRET = "whsec_" + base64.b64encode(b"svix sdk test secret, 32 bytes!!").decode()
SW_SECRET = "whsec_" + base64.b64encode(b"standard webhooks sdk test key!!").decode()
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
STRIPE_SECRET = "whsec_stripe_sdk_test_secret"
LARK_TOKEN = "lark-verification-token"
LARK_ENCRYPT_KEY = "lark-encrypt-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- the bot


class Bot:
    """An upstream that verifies every delivery with the sender's SDK, by path."""

    def __init__(self):
        self.verified = []  # (path, what the SDK read)
        self.failures = []  # (path, why)
        self.lock = threading.Lock()
        bot = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                url = urlsplit(self.path)
                try:
                    # The headers as a web framework hands them over: names case-insensitive.
                    read = bot.verify(url.path, parse_qs(url.query), self.headers, body)
                    with bot.lock:
                        bot.verified.append((url.path, read))
                except Exception as e:  # noqa: BLE001 -- any SDK refusal is a finding
                    with bot.lock:
                        bot.failures.append((url.path, repr(e)))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def verify(self, path, query, headers, body):
        q = {k: v[0] for k, v in query.items()}
        if path.startswith("/wx"):
            if q.get("encrypt_type") == "aes":
                crypto = WeChatCrypto(WX_TOKEN, WX_AES_KEY, WX_APP_ID)
                xml = crypto.decrypt_message(body.decode(), q["msg_signature"], q["timestamp"], q["nonce"])
                return ("encrypted", parse_message(xml).id)
            check_signature(WX_TOKEN, q["signature"], q["timestamp"], q["nonce"])
            return ("plaintext", parse_message(body.decode()).id)
        if path == "/svix":
            svix.webhooks.Webhook(SVIX_SECRET).verify(body, headers)
            return headers["svix-id"]
        if path == "/sw":
            StandardWebhook(SW_SECRET).verify(body, headers)
            return headers["webhook-id"]
        if path == "/slack":
            if not SignatureVerifier(SLACK_SECRET).is_valid_request(body, headers):
                raise ValueError("slack signature")
            return json.loads(body)["event_id"]
        if path == "/stripe":
            event = stripe.Webhook.construct_event(body.decode(), headers["Stripe-Signature"], STRIPE_SECRET)
            return event["id"]
        if path == "/lark":
            request = RawRequest()
            request.headers = headers
            request.body = body
            handler = lark_oapi.EventDispatcherHandler.builder(LARK_ENCRYPT_KEY, LARK_TOKEN).build()
            handler._verify_sign(request, LARK_ENCRYPT_KEY)  # the SDK's own check of X-Lark-Signature
            plain = json.loads(AESCipher(LARK_ENCRYPT_KEY).decrypt_str(json.loads(body)["encrypt"]))
            return plain["header"]["event_id"]
        raise ValueError(f"no route {path}")

    def count(self, path):
        with self.lock:
            return sum(1 for p, _ in self.verified if p == path)


# ---------------------------------------------------------------------------- the gateway

CONFIG = """
[server]
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"

[[routes]]
name = "wx"
path = "/wx"
upstream = "{bot}"
preset = "wechat-mp"
secret = "{wx_token}"
aes_key = "{wx_aes_key}"
app_id = "{wx_app_id}"

[[routes]]
name = "wx-strict"
path = "/wx-strict"
upstream = "{bot}"
preset = "wechat-mp"
secret = "{wx_token}"
aes_key = "{wx_aes_key}"
app_id = "{wx_app_id}"
require_encryption = true

[[routes]]
name = "svix"
path = "/svix"
upstream = "{bot}"
preset = "standard-webhooks"
secret = "{svix_secret}"

[[routes]]
name = "sw"
path = "/sw"
upstream = "{bot}"
preset = "standard-webhooks"
secret = "{sw_secret}"

[[routes]]
name = "slack"
path = "/slack"
upstream = "{bot}"
preset = "slack"
secret = "{slack_secret}"

[[routes]]
name = "stripe"
path = "/stripe"
upstream = "{bot}"
preset = "stripe"
secret = "{stripe_secret}"

[[routes]]
name = "lark"
path = "/lark"
upstream = "{bot}"
preset = "feishu"
secret = "{lark_token}"
aes_key = "{lark_encrypt_key}"
"""


class Gateway:
    def __init__(self, bot_url):
        self.port, self.admin = free_port(), free_port()
        self.dir = tempfile.TemporaryDirectory()
        path = os.path.join(self.dir.name, "gateway.toml")
        with open(path, "w") as f:
            f.write(
                CONFIG.format(
                    port=self.port, admin=self.admin, bot=bot_url, wx_token=WX_TOKEN, wx_aes_key=WX_AES_KEY,
                    wx_app_id=WX_APP_ID, svix_secret=SVIX_SECRET, sw_secret=SW_SECRET, slack_secret=SLACK_SECRET,
                    stripe_secret=STRIPE_SECRET, lark_token=LARK_TOKEN, lark_encrypt_key=LARK_ENCRYPT_KEY,
                )
            )
        if not os.access(BIN, os.X_OK):
            sys.exit(f"{BIN}: no gateway binary (cargo build first, or set DEDUP_GATEWAY_BIN)")
        self.proc = subprocess.Popen([BIN, "serve", "--config", path], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if self.request("GET", "/readyz", port=self.admin)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        sys.exit("the gateway did not become ready: " + self.proc.stderr.read().decode(errors="replace"))

    def request(self, method, target, body=b"", headers=None, port=None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=10)
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        out = (resp.status, resp.getheader("x-dedup-status"), resp.read())
        conn.close()
        return out

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=40)
        self.dir.cleanup()


# ---------------------------------------------------------------------------- senders


def wx_message(msg_id):
    return (
        "<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName>"
        "<FromUserName><![CDATA[o_sdk_user]]></FromUserName><CreateTime>1700000000</CreateTime>"
        f"<MsgType><![CDATA[text]]></MsgType><Content><![CDATA[hello]]></Content><MsgId>{msg_id}</MsgId></xml>"
    )


def wx_query(extra=None):
    timestamp, nonce = str(int(time.time())), secrets.token_hex(5)
    signer = WeChatSigner()
    signer.add_data(WX_TOKEN, timestamp, nonce)
    query = {"signature": signer.signature, "timestamp": timestamp, "nonce": nonce, "openid": "o_sdk_user"}
    query.update(extra or {})
    return query


def wx_push(msg_id, mode):
    """A push in `mode` (plaintext, compatible or safe), encrypted afresh by wechatpy."""
    xml = wx_message(msg_id)
    if mode == "plaintext":
        return urlencode(wx_query()), xml.encode()
    query = wx_query()
    reply = WeChatCrypto(WX_TOKEN, WX_AES_KEY, WX_APP_ID).encrypt_message(xml, query["nonce"], query["timestamp"])
    root = ElementTree.fromstring(reply)
    encrypt, msg_signature = root.findtext("Encrypt"), root.findtext("MsgSignature")
    query.update({"encrypt_type": "aes", "msg_signature": msg_signature})
    if mode == "safe":
        body = f"<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
    else:  # compatible: the plaintext fields beside Encrypt
        body = xml.replace("</xml>", f"<Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>")
    return urlencode(query), body.encode()


def svix_delivery(msg_id, payload):
    timestamp = datetime.now(tz=timezone.utc)
    signature = svix.webhooks.Webhook(SVIX_SECRET).sign(msg_id, timestamp, payload)
    return {
        "svix-id": msg_id,
        "svix-timestamp": str(int(timestamp.timestamp())),
        "svix-signature": signature,
        "content-type": "application/json",
    }


def sw_delivery(msg_id, payload):
    timestamp = datetime.now(tz=timezone.utc)
    signature = StandardWebhook(SW_SECRET).sign(msg_id, timestamp, payload)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


def slack_delivery(body):
    timestamp = str(int(time.time()))
    signature = SignatureVerifier(SLACK_SECRET).generate_signature(timestamp=timestamp, body=body)
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature, "content-type": "application/json"}


def lark_delivery(event_id):
    """Feishu's encrypted event (lark-oapi only decrypts: encrypted here as Feishu
    does, AES-256-CBC with sha256 of the key and a random IV) and its X-Lark-Signature."""
    plain = json.dumps({"schema": "2.0", "header": {"event_id": event_id, "token": LARK_TOKEN}, "event": {}})
    key = hashlib.sha256(LARK_ENCRYPT_KEY.encode()).digest()
    iv = secrets.token_bytes(16)
    data = plain.encode()
    pad = 16 - len(data) % 16
    encrypted = iv + AES.new(key, AES.MODE_CBC, iv).encrypt(data + bytes([pad]) * pad)
    body = json.dumps({"encrypt": base64.b64encode(encrypted).decode()}).encode()
    timestamp, nonce = str(int(time.time())), secrets.token_hex(8)
    signature = hashlib.sha256((timestamp + nonce + LARK_ENCRYPT_KEY).encode() + body).hexdigest()
    return body, {
        "X-Lark-Request-Timestamp": timestamp,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": signature,
        "content-type": "application/json",
    }


# ---------------------------------------------------------------------------- tests


class Senders(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bot = Bot()
        cls.gw = Gateway(cls.bot.url)

    @classmethod
    def tearDownClass(cls):
        cls.gw.stop()
        cls.bot.server.shutdown()

    def tearDown(self):
        self.assertEqual(self.bot.failures, [], "the bot's SDK refused what the gateway forwarded")

    def post(self, target, body, headers=None):
        status, dedup, _ = self.gw.request("POST", target, body, headers)
        return status, dedup

    def test_wechat_plaintext_compatible_and_safe_mode_on_one_route_with_aes_key(self):
        for i, mode in enumerate(["plaintext", "compatible", "safe"]):
            msg_id = f"73000000000000001{i}"
            query, body = wx_push(msg_id, mode)
            self.assertEqual(self.post(f"/wx?{query}", body), (200, "forwarded"), mode)
            # WeChat's retry: encrypted afresh (new nonce, new signatures).
            query, body = wx_push(msg_id, mode)
            self.assertEqual(self.post(f"/wx?{query}", body), (200, "duplicate"), mode)
        self.assertEqual(self.bot.count("/wx"), 3)
        modes = sorted(read[0] for path, read in self.bot.verified if path == "/wx")
        self.assertEqual(modes, ["encrypted", "encrypted", "plaintext"])
        # One message in another mode is still one message.
        query, body = wx_push("730000000000000010", "safe")
        self.assertEqual(self.post(f"/wx?{query}", body), (200, "duplicate"))
        # A plaintext push with a forged signature.
        query, body = wx_push("730000000000000019", "plaintext")
        self.assertEqual(self.post(f"/wx?{query.replace('signature=', 'signature=0')}", body)[0], 401)

    def test_require_encryption_refuses_plaintext(self):
        query, body = wx_push("730000000000000020", "plaintext")
        self.assertEqual(self.post(f"/wx-strict?{query}", body), (401, "rejected"))
        query, body = wx_push("730000000000000020", "safe")
        self.assertEqual(self.post(f"/wx-strict?{query}", body), (200, "forwarded"))
        self.assertEqual(self.bot.count("/wx-strict"), 1)

    def test_svix_headers_accepted_and_a_tampered_delivery_refused(self):
        payload = json.dumps({"type": "user.created", "data": {"id": "user_29w83sxmDNGwOuEthce5gg56FcC"}})
        headers = svix_delivery("msg_2LJZ8fX0T7XrDKN3eQnKRb4u0Ix", payload)
        self.assertEqual(self.post("/svix", payload.encode(), headers), (200, "forwarded"))
        self.assertEqual(self.post("/svix", payload.encode(), headers), (200, "duplicate"))
        tampered = payload.replace("user.created", "user.deleted")
        self.assertEqual(self.post("/svix", tampered.encode(), svix_delivery("msg_x", payload)), (401, "rejected"))
        self.assertEqual(self.bot.count("/svix"), 1)

    def test_standard_webhooks_headers(self):
        payload = json.dumps({"type": "invoice.paid"})
        headers = sw_delivery("msg_sw_1", payload)
        self.assertEqual(self.post("/sw", payload.encode(), headers), (200, "forwarded"))
        self.assertEqual(self.bot.count("/sw"), 1)

    def test_slack_and_stripe(self):
        body = json.dumps({"type": "event_callback", "event_id": "Ev0SDK000001", "event": {"type": "message"}})
        self.assertEqual(self.post("/slack", body.encode(), slack_delivery(body)), (200, "forwarded"))
        self.assertEqual(self.post("/slack", body.encode(), slack_delivery(body)), (200, "duplicate"))
        forged = slack_delivery(body)
        forged["X-Slack-Signature"] = "v0=" + "0" * 64
        self.assertEqual(self.post("/slack", body.encode(), forged)[0], 401)
        event = json.dumps({"id": "evt_1SDKtest", "object": "event", "type": "payment_intent.succeeded"})
        signature = stripe.WebhookSignature.generate_signature_header(event, STRIPE_SECRET)
        headers = {"Stripe-Signature": signature, "content-type": "application/json"}
        self.assertEqual(self.post("/stripe", event.encode(), headers), (200, "forwarded"))
        self.assertEqual(self.bot.count("/slack"), 1)
        self.assertEqual(self.bot.count("/stripe"), 1)

    def test_feishu_encrypted_and_signed(self):
        body, headers = lark_delivery("ev_sdk_1")
        self.assertEqual(self.post("/lark", body, headers), (200, "forwarded"))
        body, headers = lark_delivery("ev_sdk_1")
        self.assertEqual(self.post("/lark", body, headers), (200, "duplicate"))
        self.assertEqual(self.bot.count("/lark"), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
