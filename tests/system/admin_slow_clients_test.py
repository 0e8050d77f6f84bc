#!/usr/bin/env python3
"""Slow clients cannot starve the admin probes of a real shard, worker and bridge.

Issue 18, finding 4: two connections sending a header byte a second used to make every
admin port stop answering /livez, so a liveness probe restarted the pod. This test
starts onlineps_ps, onlineps_worker and onlineps_mcp_bridge as processes, opens on each
admin port 150 connections that trickle a request one byte a second and 40 that send
nothing (from other loopback addresses, under the per-address cap), and while they are
open checks that fresh /livez, /readyz and /metrics requests answer 200 within a second
each; then that the trickling connections are closed
by the server's request deadline and counted in onlineps_admin_connections_*_total.
"""
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: opslib
import opslib  # noqa: E402

BIN = os.environ.get("ONLINEPS_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
TRICKLE, SILENT = 150, 40


class Slowloris:
    """TRICKLE connections sending a request a byte a second, SILENT sending nothing."""

    def __init__(self, port):
        self.port = port
        self.socks = []
        self.closed_by_server = 0
        self.stop = threading.Event()
        for i in range(TRICKLE + SILENT):
            # From 127.0.0.2 and up, 15 per address (under the server's per-address cap of
            # 16): the probes below come from 127.0.0.1, like a kubelet from its own node.
            source = f"127.0.0.{2 + i // 15}"
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            s.setblocking(False)
            self.socks.append((s, i < TRICKLE))
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        pos = 0
        while not self.stop.wait(1.0):
            for s, trickle in self.socks:
                if s.fileno() < 0:
                    continue
                try:
                    if s.recv(1) == b"":  # the server closed it
                        self.closed_by_server += 1
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_by_server += 1
                    s.close()
                    continue
                if trickle:
                    try:
                        s.send(request[pos % len(request):pos % len(request) + 1])
                    except OSError:
                        self.closed_by_server += 1
                        s.close()
            pos += 1

    def close(self):
        self.stop.set()
        self.thread.join()
        for s, _ in self.socks:
            if s.fileno() >= 0:
                s.close()


def probe(port, path):
    t0 = time.time()
    status, body = opslib.http_get(f"http://127.0.0.1:{port}{path}", timeout=3)
    return status, time.time() - t0, body


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="onlineps-admin-slow.") as work:
        procs = []
        try:
            ports = {name: opslib.free_port() for name in ("ps", "worker", "bridge")}
            shard = opslib.Proc("ps", [f"{BIN}/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                                       "--admin-port", str(ports["ps"]), "--log-level", "warn"], work)
            procs.append(shard)
            ps = opslib.endpoint(shard, "shard")
            worker = opslib.Proc("worker", [f"{BIN}/onlineps_worker", "--ps", ps, "--listen",
                                            "tcp://127.0.0.1:0", "--admin-port", str(ports["worker"]),
                                            "--model", "mlp", "--input-dim", "8", "--hidden", "4",
                                            "--labels", "a,b", "--log-level", "warn"], work)
            procs.append(worker)
            wep = opslib.endpoint(worker, "worker")
            bridge = opslib.Proc("bridge", [f"{BIN}/onlineps_mcp_bridge", "--workers", wep,
                                            "--port", str(opslib.free_port()), "--admin-port",
                                            str(ports["bridge"]), "--log-level", "warn"], work)
            procs.append(bridge)
            opslib.endpoint(bridge, "bridge")
            for name, port in ports.items():
                opslib.wait_until(lambda: probe(port, "/livez")[0] == 200, 30, f"{name} /livez")
                loris = Slowloris(port)
                try:
                    time.sleep(2.5)  # every slow connection is open and has sent something
                    worst = 0.0
                    for _ in range(10):
                        for path in ("/livez", "/readyz", "/metrics"):
                            status, took, _ = probe(port, path)
                            worst = max(worst, took)
                            if status != 200 or took > 1.0:
                                failures.append(f"{name} {path}: status {status} after {took:.3f} s "
                                                f"with {TRICKLE + SILENT} slow connections open")
                    print(f"admin_slow_clients_test: {name}: 30 probes with {TRICKLE} trickling + "
                          f"{SILENT} silent connections open, slowest {worst * 1000:.1f} ms", flush=True)
                    # The request deadline (5 s) closes the slow ones.
                    opslib.wait_until(lambda: loris.closed_by_server >= TRICKLE, 15,
                                      f"{name} closing the trickling connections")
                finally:
                    loris.close()
                _, _, text = probe(port, "/metrics")
                timed_out = opslib.metric(text, "onlineps_admin_connections_timed_out_total")
                refused = opslib.metric(text, "onlineps_admin_connections_refused_total")
                print(f"admin_slow_clients_test: {name}: {loris.closed_by_server} slow connections "
                      f"closed by the server; counted {timed_out:.0f} timed out, {refused:.0f} refused",
                      flush=True)
                if timed_out + refused < TRICKLE:
                    failures.append(f"{name}: only {timed_out + refused:.0f} slow connections counted")
        finally:
            for p in reversed(procs):
                p.stop()
    for f in failures:
        print("admin_slow_clients_test: FAILED: " + f)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
