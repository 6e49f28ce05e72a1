"""Hosts for multi-machine tests on one machine: Linux network namespaces joined by veth pairs.

`hosts(n)` is a context manager yielding a `Hosts`: n namespaces, each a "host" with one
address on a shared link (`addr[i]`, 10.x.y.(i+1)/24 through a bridge in the first, so no
host's process can reach another's through loopback) and, for namespace 0 only, a second link
to the test's own namespace (`client_addr`, the address an HTTP client here connects to).
`run(i, argv)` starts a process inside host i; `cut(i)` takes host i's link down (a network
partition: no connection is closed, packets just stop). Names and subnets are unique per test process;
everything is deleted on exit, also after a failure. Without CAP_NET_ADMIN (or the `ip`
command) `unavailable()` says why, for the tests' skip reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field


def _ip(*args: str, ns: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"tgprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"network namespaces need CAP_NET_ADMIN (`ip netns add` said: {made.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Hosts:
    names: list[str]
    addr: list[str]
    client_addr: str
    tag: int
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(["ip", "netns", "exec", self.names[host], *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def cut(self, host: int) -> None:
        _ip("link", "set", f"tg{self.tag}e{host}", "down", ns=self.names[host])


@contextlib.contextmanager
def hosts(n: int) -> Iterator[Hosts]:
    tag = os.getpid() % 100_000
    net = f"10.{200 + tag % 50}.{tag // 50 % 250}"
    client_net = f"10.{200 + tag % 50}.{(tag // 50 + 1) % 250}"
    names = [f"tgs{tag}h{i}" for i in range(n)]
    made: list[str] = []
    hosts = Hosts(names, [f"{net}.{i + 1}" for i in range(n)], f"{client_net}.2", tag)
    try:
        for name in names:
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
            made.append(name)
            _ip("link", "set", "lo", "up", ns=name)  # the host's own loopback, for itself
        bridge = f"tg{tag}br"
        _ip("link", "add", bridge, "type", "bridge", ns=names[0])
        _ip("link", "set", bridge, "up", ns=names[0])
        for i, name in enumerate(names):
            inner, outer = f"tg{tag}e{i}", f"tg{tag}p{i}"
            _ip(
                "link",
                "add",
                inner,
                "netns",
                name,
                "type",
                "veth",
                "peer",
                outer,
                "netns",
                names[0],
            )
            _ip("link", "set", outer, "master", bridge, "up", ns=names[0])
            _ip("addr", "add", f"{hosts.addr[i]}/24", "dev", inner, ns=name)
            _ip("link", "set", inner, "up", ns=name)
        here = f"tg{tag}c"
        _ip("link", "add", here, "type", "veth", "peer", f"tg{tag}d", "netns", names[0])
        _ip("addr", "add", f"{client_net}.1/24", "dev", here)
        _ip("link", "set", here, "up")
        _ip("addr", "add", f"{hosts.client_addr}/24", "dev", f"tg{tag}d", ns=names[0])
        _ip("link", "set", f"tg{tag}d", "up", ns=names[0])
        yield hosts
    finally:
        for proc in hosts.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", f"tg{tag}c")
        for name in made:  # deleting a namespace deletes its links
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
