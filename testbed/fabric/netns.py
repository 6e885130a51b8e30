"""Named network namespaces, made in-process (no fork per namespace), compatible with ``ip netns``.

A namespace is made by a worker thread that unshares its own network namespace and bind-mounts
``/proc/thread-self/ns/net`` on ``/run/netns/<name>``; the main thread never changes namespace. Threads only
help here (namespace creation is not serialised on the rtnl lock). The mount-point files of one ``create`` call
are hard links of one unnamed file (O_TMPFILE) in ``/run/netns``'s own mount: on ext4 every new inode costs a scan
of the recently deleted ones, which made a 1,344-namespace build 2-3x slower after the previous one
(docs/architecture.md, 3.8).

Every namespace this tool makes starts with ``PREFIX``; that is how ``testbed clean`` finds leftovers and why it
never touches anything else.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

from ..errors import TestbedError

PREFIX = "ftb-"
#: The local cluster's machines (testbed/cluster/local.py): ``ftb-m0``, ``ftb-m1`` … — no second dash, so never
#: a lab's ``ftb-<lab>-<node>``; they belong to the cluster, and only ``testbed cluster down`` removes them.
MACHINE_PREFIX = PREFIX + "m"
NETNS_DIR = "/run/netns"
STATE_DIR = "/run/fabric-testbed"

CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 0x2
AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400
SIOCGIFFLAGS, IFF_RUNNING = 0x8913, 0x40

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.linkat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
T = TypeVar("T")


class NetnsError(TestbedError):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise NetnsError(f"{what}: {os.strerror(e)}")


def path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def exists(name: str) -> bool:
    return os.path.ismount(path(name))


def list_names(prefix: str = PREFIX) -> list[str]:
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def is_machine(name: str) -> bool:
    """A local cluster machine's namespace (``ftb-m<i>``), not a lab's."""
    rest = name[len(MACHINE_PREFIX):]
    return name.startswith(MACHINE_PREFIX) and rest.isdigit()


def pids_in(names: Iterable[str]) -> list[int]:
    """Processes whose network namespace is one of ``names``: what would keep a deleted namespace (and its
    interfaces, VXLAN devices included) alive — e.g. the traffic agents of a run whose owner was killed."""
    inodes = set()
    for n in names:
        try:
            st = os.stat(path(n))
            inodes.add((st.st_dev, st.st_ino))
        except FileNotFoundError:
            continue
    out = []
    if not inodes:
        return out
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{d}/ns/net")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue                       # gone meanwhile, or a kernel thread
        if (st.st_dev, st.st_ino) in inodes:
            out.append(int(d))
    return out


def _own_mount() -> None:
    """Make ``NETNS_DIR`` a shared mount of its own, as ``ip netns add`` does the first time: were it a plain
    directory, a later ``ip netns add`` would bind it onto itself, hiding the namespace files mounted on the
    directory beneath — they could no longer be unmounted, and unlinking them fails with EBUSY."""
    d = NETNS_DIR.encode()
    if _libc.mount(b"none", d, b"none", MS_SHARED | MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:             # EINVAL: not a mount point yet
        return
    _check(_libc.mount(d, d, b"none", MS_BIND | MS_REC, None), f"bind {NETNS_DIR} onto itself")
    _check(_libc.mount(b"none", d, b"none", MS_SHARED | MS_REC, None), f"make {NETNS_DIR} shared")


def _anchor() -> int | None:
    """An unnamed file (O_TMPFILE) in ``NETNS_DIR``'s filesystem that a ``create`` call links every mount-point
    file to, so that none of them needs an inode of its own; None where the filesystem cannot make one. It has to
    live in the very mount of ``NETNS_DIR``: ``ip netns`` bind-mounts that directory onto itself, and a hard link
    from anywhere else fails with EXDEV."""
    os.makedirs(NETNS_DIR, exist_ok=True)
    _own_mount()
    try:
        return os.open(NETNS_DIR, os.O_TMPFILE | os.O_RDWR, 0o444)
    except OSError:
        return None


def _mount_point(p: str, name: str, anchor: int | None) -> None:
    """The file a namespace is bind-mounted on: a link of ``anchor``, else a plain empty file."""
    if anchor is not None:
        if _libc.linkat(AT_FDCWD, f"/proc/self/fd/{anchor}".encode(), AT_FDCWD, p.encode(), AT_SYMLINK_FOLLOW) == 0:
            return
        if ctypes.get_errno() == errno.EEXIST:
            raise NetnsError(f"network namespace {name} already exists")
    try:
        os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDONLY))
    except FileExistsError:
        raise NetnsError(f"network namespace {name} already exists") from None


def _create_one(name: str, anchor: int | None = None) -> None:
    p = path(name)
    _mount_point(p, name, anchor)
    _check(_libc.unshare(CLONE_NEWNET), f"unshare for {name}")
    _check(_libc.mount(b"/proc/thread-self/ns/net", p.encode(), b"none", MS_BIND, None), f"mount {p}")


def _worker(names: list[str], errors: list, socks: dict | None, anchor: int | None) -> None:
    # Each call to unshare leaves this thread in the namespace just made; the thread ends there.
    for n in names:
        try:
            _create_one(n, anchor)
            if socks is not None:         # opened here, the socket belongs to the namespace just made
                socks[n] = _netlink_socket_here()
        except Exception as e:           # noqa: BLE001 — collected and re-raised by create()
            errors.append(e)
            return


def create(names: Iterable[str], threads: int = 2, netlink: bool = False) -> dict[str, socket.socket]:
    """Create every named namespace; on any failure remove the ones made and raise.

    With ``netlink=True`` also return a NETLINK_ROUTE socket living in each new namespace (made by the thread
    that is inside it anyway, which saves a thread per namespace later).
    """
    names = list(names)
    anchor = _anchor()
    errors: list = []
    socks: dict | None = {} if netlink else None
    chunks = [names[i::threads] for i in range(threads)]
    workers = [threading.Thread(target=_worker, args=(c, errors, socks, anchor)) for c in chunks if c]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if anchor is not None:
        os.close(anchor)                 # the links keep the inode
    if errors:
        for sk in (socks or {}).values():
            sk.close()
        delete(n for n in names if exists(n))
        raise errors[0]
    return socks or {}


def _adopt_one(name: str, source: str, anchor: int | None) -> socket.socket:
    """Bind-mount an existing namespace file (a container's ``/proc/<pid>/ns/net``) at ``name``; then, from a
    thread inside it, a netlink socket, as for a namespace made here."""
    p = path(name)
    _mount_point(p, name, anchor)
    _check(_libc.mount(source.encode(), p.encode(), b"none", MS_BIND, None), f"mount {source} on {p}")
    return netlink_socket(name)


def adopt(sources: dict[str, str]) -> dict[str, socket.socket]:
    """Give existing network namespaces (name → namespace file, e.g. a container's) a name under /run/netns, so
    that everything that enters, lists or deletes namespaces by name treats them like the ones ``create`` makes;
    return a NETLINK_ROUTE socket in each. ``delete`` only unmounts them: whoever made one (the container)
    frees it. On any failure the names made are removed and the error raised."""
    anchor = _anchor()
    socks: dict[str, socket.socket] = {}
    try:
        for name, source in sources.items():
            socks[name] = _adopt_one(name, source, anchor)
    except BaseException:
        for sk in socks.values():
            sk.close()
        delete(n for n in sources if os.path.lexists(path(n)))
        raise
    finally:
        if anchor is not None:
            os.close(anchor)
    return socks


def delete(names: Iterable[str]) -> None:
    """Unmount and unlink; the kernel frees a namespace (and its veths) when nothing holds it."""
    stuck = []
    for n in names:
        p = path(n)
        for _ in range(8):               # a file mounted twice (a concurrent `ip netns` bind) needs two unmounts
            if not os.path.ismount(p) or _libc.umount2(p.encode(), MNT_DETACH) != 0:
                break
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            stuck.append(f"{n} ({e.strerror})")
    if stuck:                            # the others are gone; these stay for `testbed clean`
        raise NetnsError(f"cannot remove namespace(s) {', '.join(stuck)}; `testbed clean` retries")


def enter(name: str) -> None:
    """Move the calling thread (or a freshly forked child) into the namespace."""
    fd = os.open(path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), f"setns {name}")
    finally:
        os.close(fd)


def run_in(name: str, fn: Callable[..., T], *args, **kwargs) -> T:
    """Call ``fn`` in a short-lived thread inside ``name``: sockets it opens stay in that namespace,
    and ``/proc/sys/net`` it writes is that namespace's."""
    box: dict = {}

    def body():
        try:
            enter(name)
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:       # noqa: BLE001 — re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def wait_running(name: str, ifname: str, timeout_s: float = 5.0) -> None:
    """Wait until ``ifname`` in ``name`` is IFF_RUNNING and its queue is no longer the noop qdisc. Carrier-on
    reaches the qdisc through the kernel's linkwatch work: until it runs, the device's queue is the noop qdisc,
    which drops every packet yet reports success to the sender — a busy machine delays that work by
    milliseconds, and the work sets the running flag a moment before it attaches the real qdisc."""
    from pyroute2 import IPRoute

    def poll():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        ip = IPRoute()
        try:
            end = time.monotonic() + timeout_s
            while True:
                req = struct.pack("16sH14x", ifname.encode(), 0)
                flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
                if flags & IFF_RUNNING and ip.get_links(ifname=ifname)[0].get_attr("IFLA_QDISC") != "noop":
                    return
                if time.monotonic() > end:
                    raise NetnsError(f"{name}: {ifname} has no carrier after {timeout_s:g} s")
                time.sleep(0.001)
        finally:
            ip.close()
            s.close()
    run_in(name, poll)


def run_many(names: Iterable[str], fn: Callable[[str], T], threads: int = 2) -> list[T]:
    """``fn(name)`` inside each namespace, a few worker threads at a time."""
    def one(n):
        return run_in(n, fn, n)
    with ThreadPoolExecutor(max_workers=threads) as ex:
        return list(ex.map(one, names))


NETLINK_TIMEOUT_S = 30.0


def _netlink_socket_here(rcvbuf: int = 4 << 20) -> socket.socket:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    try:
        s.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)     # SO_RCVBUFFORCE
        s.setsockopt(socket.SOL_SOCKET, 32, rcvbuf)     # SO_SNDBUFFORCE
    except OSError:
        pass
    s.bind((0, 0))
    s.settimeout(NETLINK_TIMEOUT_S)                     # a kernel that never answers must not hang a run
    return s


def netlink_socket_here() -> socket.socket:
    """A NETLINK_ROUTE socket in the calling thread's namespace (a cluster machine's underlay: fabric tunnels)."""
    return _netlink_socket_here()


def netlink_socket(name: str) -> socket.socket:
    """A NETLINK_ROUTE socket that lives in ``name`` (whatever thread uses it later)."""
    return run_in(name, _netlink_socket_here)


def write_sysctl(name: str, key: str, value) -> None:
    """Write ``net.*`` sysctl ``key`` (dotted) inside the namespace."""
    def w():
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(str(value))
    run_in(name, w)


def spawn(name: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start a process inside the namespace (like ``ip netns exec``, without shelling out)."""
    fd = os.open(path(name), os.O_RDONLY)

    def pre():
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            os._exit(126)

    try:
        return subprocess.Popen(argv, preexec_fn=pre, pass_fds=(fd,), **popen_kwargs)
    finally:
        os.close(fd)


def raise_nofile(n: int = 1 << 16) -> None:
    """Large fabrics hold one socket and one namespace fd per node."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(max(soft, n), hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


__all__ = ["PREFIX", "MACHINE_PREFIX", "NetnsError", "adopt", "create", "delete", "enter", "exists", "is_machine",
           "list_names", "netlink_socket", "pids_in",
           "path", "raise_nofile", "run_in", "run_many", "spawn", "write_sysctl", "errno"]
