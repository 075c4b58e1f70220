"""A real HTTP file server (the standard library's, no Range support, as `python -m http.server`)
that counts the body bytes it sends, in all and per client address: what the tests of a
dataset at a URL measure "bytes fetched" with (tests/unit/test_host_shares.py,
tests/hosts/test_streaming_hosts.py)."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from collections import Counter
from pathlib import Path


class _Handler(http.server.SimpleHTTPRequestHandler):
    def copyfile(self, source, outputfile):
        data = source.read()
        self.server.count(self.client_address[0], len(data))
        if self.server.pause_s:  # a slow network: the first bytes, a pause, then the rest
            outputfile.write(data[:16])
            outputfile.flush()
            time.sleep(self.server.pause_s)
            data = data[16:]
        outputfile.write(data)

    def log_message(self, *args):
        pass


class ByteCountingServer(http.server.ThreadingHTTPServer):
    """`ByteCountingServer(folder, host, pause_s)`: serves `folder` on `host` (a free port) in a thread;
    `url` its root, `sent` the bytes sent so far, `by_client` per client address; `close()`."""

    daemon_threads = True

    def __init__(self, folder: Path | str, host: str = "127.0.0.1", pause_s: float = 0.0):
        self.pause_s = pause_s  # each body sent in two pieces this far apart (a slow network)
        super().__init__((host, 0), functools.partial(_Handler, directory=str(folder)))
        self.lock = threading.Lock()
        self.by_client: Counter = Counter()
        self.url = f"http://{host}:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def count(self, client: str, n: int) -> None:
        with self.lock:
            self.by_client[client] += n

    @property
    def sent(self) -> int:
        with self.lock:
            return sum(self.by_client.values())

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class CountingProxy:
    """A TCP proxy on `host` (a free port) to `target` (host, port), counting the bytes the
    target sends back, per client address: bytes fetched from a server we cannot instrument
    (moto's S3 server), headers and all. `endpoint` is its http:// address; `close()`."""

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1"):
        import socket

        self.target, self.lock, self.by_client = target, threading.Lock(), Counter()
        self.sock = socket.create_server((host, 0))
        self.endpoint = f"http://{host}:{self.sock.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def sent(self) -> int:
        with self.lock:
            return sum(self.by_client.values())

    def _accept(self) -> None:
        import socket

        while not self.closed:
            try:
                client, addr = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, addr[0]), daemon=True).start()

    def _pump(self, src, dst, count_for: str | None) -> None:
        import socket

        try:
            while data := src.recv(65536):
                if count_for is not None:
                    with self.lock:
                        self.by_client[count_for] += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.closed = True
        self.sock.close()
