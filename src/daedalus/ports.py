"""Local TCP ports: pick a free one, ask whether something listens or wait until it does, ask whether one can be
bound."""

import socket
import time


def free_port() -> int:
    """A port the OS just handed out on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    """Something accepts connections on `port` (a server is up)."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def wait_until_open(port: int, what: str, timeout_s: float = 30, host: str = "127.0.0.1") -> None:
    """Block until something accepts connections on `port` (uvicorn listens only once its app has started)."""
    deadline = time.monotonic() + timeout_s
    while not port_is_open(port, host):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} never started listening on {host}:{port} within {timeout_s:g}s")
        time.sleep(0.1)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """`port` cannot be bound (taken, even by a server not yet accepting)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
