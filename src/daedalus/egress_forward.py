"""Inside an agent's sandbox: its only way out. Run by the system's python3 (/usr/bin/python3, no Daedalus import).

    python3 egress_forward.py PORT=SOCKET [PORT=SOCKET ...] -- COMMAND [ARGS ...]

Listens on 127.0.0.1:PORT of the sandbox's own loopback (the sandbox has no other network) for each pair, starts
COMMAND, and relays every connection to SOCKET, a Unix socket the host's egress gateway (daedalus.egress) serves:
the gateway decides where, if anywhere, the bytes go. It exits with COMMAND's status when COMMAND ends, which
ends the sandbox. Nothing here is trusted: the agent may kill or replace it and gains nothing, since the
gateway's allow-list is the only thing that opens a connection out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

CHUNK = 65536


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_relay, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    if "--" not in argv:
        sys.stderr.write("usage: egress_forward.py PORT=SOCKET ... -- COMMAND [ARGS ...]\n")
        return 2
    split = argv.index("--")
    pairs, command = argv[:split], argv[split + 1 :]
    listeners = []
    for pair in pairs:
        port, _, path = pair.partition("=")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(port)))
        listener.listen(64)
        listeners.append((listener, path))
    # Listening before the command starts: its first connection is never refused.
    for listener, path in listeners:
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    child = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, frame: child.send_signal(number))
    code = child.wait()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
