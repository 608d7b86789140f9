# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A test-local HTTP server on loopback that answers one line at a time (issue 33 item 9).

Each line comes before a per-read socket timeout would fire, so only a total deadline ends the exchange.
`stage="body"`: the status line and headers at once, then the body a line every `interval` seconds.
`stage="headers"`: a header line every `interval` seconds, and never the blank line that ends them.
It gives up after `lasting` seconds, so a client without a deadline still ends (late) and its test fails.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time


class Trickle:
    def __init__(self, port=0, stage="body", interval=0.2, lasting=40.0):
        self.stage, self.interval, self.lasting = stage, interval, lasting
        self.connections = 0
        trickle = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                trickle.connections += 1
                self.request.settimeout(5)
                try:
                    self.request.recv(65536)  # the request: never more than headers here
                    trickle.send(self.request)
                except OSError:
                    pass  # the client gave up: what the tests want

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def send(self, connection: socket.socket):
        ends = time.monotonic() + self.lasting
        connection.sendall(b"HTTP/1.1 200 OK\r\n")
        if self.stage == "body":
            connection.sendall(b"Content-Type: text/plain\r\nConnection: close\r\n\r\n")
        number = 0
        while time.monotonic() < ends:
            number += 1
            line = b"# line %d\n" % number if self.stage == "body" else b"X-Trickle-%d: 1\r\n" % number
            connection.sendall(line)
            time.sleep(self.interval)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
