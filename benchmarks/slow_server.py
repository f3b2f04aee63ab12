"""A slow http server for benchmarks/latency.py: files served with a latency before each response and at most a
rate of bytes a second per connection, in a process of its own.
"""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import time
from pathlib import Path

CHUNK = 256 << 10  # bytes sent at a time by the slow server: 10 ms of a 25 MB/s connection
RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class SlowHandler(http.server.SimpleHTTPRequestHandler):
    """Files under `directory`, each response `latency` seconds late and its body at `rate` bytes/s at most;
    a single-range `Range: bytes=a-[b]` gets a 206."""

    latency, rate = 0.05, 25e6

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        time.sleep(self.latency)
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        size = path.stat().st_size
        start, stop, ranged = 0, size, False
        if header := self.headers.get("Range"):
            found = RANGE.match(header.strip())
            if not found or int(found.group(1)) >= size:
                self.send_error(416)
                return
            start, ranged = int(found.group(1)), True
            stop = min(size, int(found.group(2)) + 1) if found.group(2) else size
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.end_headers()
        with open(path, "rb") as file:
            self.send_slowly(file, start, stop)

    def send_slowly(self, file: object, start: int, stop: int) -> None:
        """The bytes [start, stop) of `file`, CHUNK at a time (sendfile: the server's CPU is this machine's
        too), each once the connection's rate allows it."""
        self.wfile.flush()
        began, sent = time.perf_counter(), 0
        while sent < stop - start:
            try:
                count = self.connection.sendfile(file, start + sent, min(CHUNK, stop - start - sent))
            except OSError:  # the reader hung up: it needed only part of the shard
                return
            if not count:  # the file shrank
                return
            sent += count
            if (ahead := sent / self.rate - (time.perf_counter() - began)) > 0:
                time.sleep(ahead)


def serve(folder: str, latency: float, rate: float) -> None:
    """Serve `folder` slowly on a free port of 127.0.0.1, print the port, and serve until killed."""
    handler = type("Handler", (SlowHandler,), {"latency": latency, "rate": rate})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=folder))
    server.daemon_threads = True
    print(server.server_port, flush=True)
    server.serve_forever()


class SlowServer:
    """`serve` in a process of its own (not a thread of this one, whose GIL the loader's main loop needs)."""

    def __init__(self, folder: Path, latency: float, rate: float) -> None:
        here = str(Path(__file__).resolve().parent)
        call = f"slow_server.serve({str(folder)!r}, {latency!r}, {rate!r})"
        code = f"import sys; sys.path.insert(0, {here!r}); import slow_server; {call}"
        command = [sys.executable, "-c", code]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.process.stdout.readline())}"

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()
