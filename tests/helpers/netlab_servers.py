"""The test "internet"'s servers, run inside the lab's namespaces (python -m tests.helpers.netlab_servers).

--role internet: an authoritative DNS server for the zone file (UDP and TCP 53 on --dns), HTTP on
80 and 8080, keep-alive HTTP/1.1 on 8011, HTTPS on 443 (self-signed), and UDP sinks on 443 and
9999, on every address of the namespace, IPv4 and IPv6. --role outer: an HTTP service on the outer namespace's loopback
(127.0.0.1:8081) and an abstract unix socket, the "host services" an agent must not reach.
Every DNS query and every UDP datagram is appended to --log as a JSON line.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import ssl
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

_log_lock = threading.Lock()


def log(path: Path, event: dict[str, object]) -> None:
    with _log_lock, path.open("a") as f:
        f.write(json.dumps(event) + "\n")


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/bulk/"):
            size = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[: min(size, len(chunk))])
                size -= len(chunk)
            return
        body = (
            f"hello from {self.server.server_address[0]}:{self.server.server_address[1]} "
            f"host={self.headers.get('Host')}\n".encode()
        )
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class KeepAlive(Hello):
    """HTTP/1.1 with keep-alive, routing like a virtual-host server: an absolute-form target names the
    host (RFC 9112 3.2.2), else the Host header does. A WebSocket handshake is answered 101 (except on
    /no-upgrade, where the server ignores it, as servers without WebSocket do)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes

    def do_GET(self) -> None:
        if self.headers.get("Upgrade", "").lower() == "websocket" and self.path != "/no-upgrade":
            self.send_response(101)  # switch, then echo what arrives (no WebSocket framing: a test peer)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.write(b"ws-echo " + self.rfile.read1(65536))
            self.close_connection = True
            return
        named = self.path.split("://", 1)[1].split("/", 1)[0] if "://" in self.path else self.headers.get("Host")
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = f"hello host={named} path={self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


class Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()


def http(address: str, port: int, context: ssl.SSLContext | None = None, handler: type = Hello) -> None:
    cls = Server6 if ":" in address else ThreadingHTTPServer
    cls.allow_reuse_address = True
    cls.daemon_threads = True
    server = cls((address, port), handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def dns_answer(zone: dict[str, dict[str, list[str]]], wire: bytes, logfile: Path, transport: str) -> bytes:
    query = dns.message.from_wire(wire)
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    qtype = dns.rdatatype.to_text(question.rdtype)
    log(logfile, {"dns": name, "qtype": qtype, "transport": transport})
    response = dns.message.make_response(query)
    if name not in zone:
        response.set_rcode(dns.rcode.NXDOMAIN)
        return response.to_wire()
    for value in zone[name].get(qtype, []):
        response.answer.append(dns.rrset.from_text(question.name, 30, "IN", qtype, value))
    return response.to_wire()


def dns_server(address: str, zone: dict[str, dict[str, list[str]]], logfile: Path) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address, 53))

    def serve_udp() -> None:
        while True:
            wire, peer = udp.recvfrom(65535)
            udp.sendto(dns_answer(zone, wire, logfile, "udp"), peer)

    class Tcp(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            size = struct.unpack("!H", self.request.recv(2))[0]
            wire = b""
            while len(wire) < size:
                wire += self.request.recv(size - len(wire))
            reply = dns_answer(zone, wire, logfile, "tcp")
            self.request.sendall(struct.pack("!H", len(reply)) + reply)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    tcp = socketserver.ThreadingTCPServer((address, 53), Tcp)
    threading.Thread(target=serve_udp, daemon=True).start()
    threading.Thread(target=tcp.serve_forever, daemon=True).start()


def udp_sink(family: int, port: int, logfile: Path) -> None:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))

    def serve() -> None:
        while True:
            data, peer = sock.recvfrom(65535)
            log(logfile, {"udp": port, "from": peer[0], "bytes": len(data)})

    threading.Thread(target=serve, daemon=True).start()


def bench_server(port: int) -> None:
    """PING -> PONG for setup latency; BULK n -> n bytes (sendfile from memory) for throughput."""
    import os
    import tempfile

    block = tempfile.TemporaryFile(dir="/dev/shm")  # noqa: SIM115 (open for the server's life)
    block.write(b"x" * (64 << 20))
    block.flush()

    class Bench(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with self.request.makefile("rb") as lines:
                for line in lines:
                    verb, _, arg = line.decode().strip().partition(" ")
                    if verb == "PING":
                        self.request.sendall(b"PONG\n")
                    elif verb == "BULK":
                        left = int(arg)
                        while left > 0:
                            left -= os.sendfile(self.request.fileno(), block.fileno(), 0, min(left, 64 << 20))
                    else:
                        return

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 1024  # a connection-rate bench must not measure the server's backlog

    server = Server(("0.0.0.0", port), Bench)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def abstract_listener(name: str, logfile: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("\0" + name)
    sock.listen()

    def serve() -> None:
        while True:
            conn, _ = sock.accept()
            log(logfile, {"abstract": name})
            conn.close()

    threading.Thread(target=serve, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["internet", "outer"], required=True)
    parser.add_argument("--zone", type=Path)
    parser.add_argument("--dns")
    parser.add_argument("--cert", type=Path)
    parser.add_argument("--key", type=Path)
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    if args.role == "internet":
        zone = json.loads(args.zone.read_text())
        dns_server(args.dns, zone, args.log)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.cert, args.key)
        for address in ("0.0.0.0", "::"):
            http(address, 80)
            http(address, 8080)
            http(address, 443, context)
            http(address, 8011, handler=KeepAlive)
        bench_server(9000)
        for family in (socket.AF_INET, socket.AF_INET6):
            udp_sink(family, 443, args.log)
            udp_sink(family, 9999, args.log)
    else:
        http("127.0.0.1", 8081)
        abstract_listener("adl-test-host-service", args.log)
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
