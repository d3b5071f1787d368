"""Stand-in for the legacy bot. Replace the legacy-bot container with your own.

Answers every POST/PUT/PATCH with 200 "success" (after BOT_DELAY_SECONDS, to play a
slow AI bot) and GET with 200 "ok". It listens on 127.0.0.1 only: the dedup-gateway
sidecar shares the pod's network namespace, nothing else can reach it.
"""

import http.server
import os
import signal
import threading
import time

DELAY = float(os.environ.get("BOT_DELAY_SECONDS", "0"))
PORT = int(os.environ.get("BOT_PORT", "5000"))


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer(b"ok\n")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(DELAY)
        print(f"{self.command} {self.path} {len(body)} bytes", flush=True)
        self._answer(b"success")

    do_PUT = do_PATCH = do_POST

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
server.daemon_threads = False  # server_close() waits for requests in flight


def stop(_signum, _frame):
    # PID 1 gets no default SIGTERM action: without this the pod waits out its grace.
    threading.Thread(target=server.shutdown).start()


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
server.serve_forever()
server.server_close()
