"""What the launch tests share: whether a worker's process group is gone, launch folders, and
the addresses a process listens on (read from /proc)."""

from __future__ import annotations

import glob
import ipaddress
import os
import time


def gone(pid: int) -> bool:
    """No process is left in the worker's process group (the worker started one of its own)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pids: list[int], seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not all(gone(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    return all(gone(p) for p in pids)


def launch_folders(tmp: str | os.PathLike) -> set[str]:
    """The ``autoplan-launch-*`` folders in ``tmp``: the temporary directory a test gives its
    launcher and workers (``TMPDIR``), apart from the machine's, where other programs may make
    such folders. A launch makes none."""
    return set(glob.glob(os.path.join(os.fspath(tmp), "autoplan-launch-*")))


def address_text(hexaddr: str) -> str:
    """``0100007F:1F90`` or a 32-hex-digit IPv6 address from /proc/net/tcp*, as text."""
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return f"{ip}:{int(port, 16)}"


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of the TCP sockets process ``pid`` listens on: its socket inodes
    (``/proc/<pid>/fd``) matched with the LISTEN entries of ``/proc/<pid>/net/tcp`` and ``tcp6``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    out.append(address_text(cols[1]))
    return out


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.rsplit(":", 1)[0].strip("[]")).is_loopback
