"""Is a local mesh process up yet: its port open, its readiness URL answering 200.

Pure helpers for deploy/local_mesh.py (no state of the mesh: its layout and
var/ directory stay there).
"""
from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def http_ok(url: str) -> bool:
    """Whether GET `url` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def wait_ready(name: str, port: int, ready_url: str, proc: subprocess.Popen[bytes],
               log_tail: Callable[[], str], timeout_s: float = 30) -> None:
    """Wait until `proc` (component `name`) listens on `port` and, when given, `ready_url`
    answers 200; RuntimeError (with the end of its log) if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see "
                               f"var/log/{name}.log, which ends:\n{log_tail()}")
        if port_open(port) and (not ready_url or http_ok(ready_url)):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} is not answering on port {port} after {timeout_s}s")
