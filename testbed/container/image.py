"""``testbed image build``: the small local host image ``fabric-testbed/host``, made without any registry.

The root filesystem is made from this machine's own installed Debian packages: the dependency closure of
``PACKAGES`` (Python, a shell and coreutils, ping, iproute2) is read from the dpkg database, each package's files
(``dpkg-query -L``, without documentation, and with the byte code Debian compiled for the Python modules) go
into a tar stream together with the Python packages the traffic agent imports beyond the standard library
(``isal``, from the running interpreter), and ``docker import`` turns the tar into an image. No network, no
debootstrap (the VM lane's ~100 s): a few seconds, and the image's Python is the host's, so the project code —
bind-mounted read-only into every container — runs in it unchanged.

The image carries the label ``fabric-testbed.image-key``: a hash of the recipe, the package versions and the
Python packages. ``build()`` does nothing when the image of the current key exists (``force``: build anyway).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .daemon import DockerError, client

IMAGE = "fabric-testbed/host"
TAG = "latest"
KEY_LABEL = "fabric-testbed.image-key"
RECIPE_VERSION = 1                        # bump when the recipe changes in a way that must rebuild images
PACKAGES = ("python3", "dash", "coreutils", "iputils-ping", "iproute2")
# package tools the closure drags in that nothing in a host needs
SKIP_PACKAGES = frozenset({"dpkg", "debconf", "tar", "perl-base", "init-system-helpers", "debianutils",
                           "base-files", "lsb-base", "sysvinit-utils"})
SKIP_DIRS = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
             "/usr/share/lintian/", "/usr/share/bug/", "/usr/share/bash-completion/")
#: imported by the agent beyond the standard library: isal (the ICRC, roce/endpoint.py) and pydantic with what it
#: needs (every congestion control declares its parameters as a pydantic model, roce/cc/)
PY_PACKAGES = ("isal", "pydantic", "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection")
CMD = ("sleep", "infinity")               # what the container runs: the hosts' processes are entered into it
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Built:
    image: str
    key: str
    cached: bool                          # the image of this key was there already
    seconds: float = 0.0
    size_bytes: int = 0
    packages: int = 0


def _installed() -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """Installed packages: name → (version, pre-depends + depends), and virtual name → a package providing it."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Version}\t${Pre-Depends}\t"
                          "${Depends}\t${Provides}\n"], capture_output=True, text=True, check=True).stdout
    pkgs, provides = {}, {}
    for line in out.splitlines():
        name, status, version, pre, dep, prov = (line.split("\t") + [""] * 6)[:6]
        if not status.startswith("ii"):
            continue
        pkgs[name] = (version, ", ".join(x for x in (pre, dep) if x))
        for p in prov.split(","):
            if p.strip():
                provides.setdefault(p.strip().split()[0], name)
    return pkgs, provides


def closure(roots=PACKAGES) -> dict[str, str]:
    """The installed packages ``roots`` need (package → version), following Depends and Pre-Depends through
    installed packages (of alternatives, the first installed one), less SKIP_PACKAGES."""
    pkgs, provides = _installed()
    missing = [r for r in roots if r not in pkgs]
    if missing:
        raise DockerError(f"the host image is made from installed Debian packages; not installed: "
                          f"{', '.join(missing)} (apt-get install {' '.join(missing)})")
    seen: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = stack.pop()
        name = name if name in pkgs else provides.get(name)
        if name is None or name in seen or name in SKIP_PACKAGES:
            continue
        seen[name] = pkgs[name][0]
        for clause in pkgs[name][1].split(","):
            options = [re.sub(r"[\s(].*", "", alt.strip()).split(":")[0] for alt in clause.split("|")]
            pick = next((o for o in options if o in pkgs or o in provides), None)
            if pick:
                stack.append(pick)
    return dict(sorted(seen.items()))


def _py_package_files(name: str) -> list[tuple[str, str]]:
    """(host path, path in the image) of an installed Python package and its metadata, for the image's
    /usr/local/lib/python3.X/dist-packages."""
    spec = importlib.util.find_spec(name)
    if spec is None or not (spec.submodule_search_locations or (spec.origin or "").endswith(".py")):
        raise DockerError(f"the host image needs the Python package {name}, which this interpreter does not have "
                          f"(pip install {name})")
    # a package is its directory; a single-module distribution (typing_extensions) is its one file
    pkg_dir = Path(list(spec.submodule_search_locations)[0] if spec.submodule_search_locations else spec.origin)
    site = pkg_dir.parent
    dest = f"/usr/local/lib/python{sys.version_info.major}.{sys.version_info.minor}/dist-packages"
    dist = importlib.metadata.distribution(name)
    out = [(str(pkg_dir), dest + "/" + pkg_dir.name)] if pkg_dir.is_file() else []
    for base in [pkg_dir, *[site / p for p in os.listdir(site) if p.startswith(f"{dist.metadata['Name']}-")
                            and p.endswith(".dist-info")]]:
        for dirpath, _, files in os.walk(base):
            for f in files:
                host = os.path.join(dirpath, f)
                out.append((host, dest + "/" + os.path.relpath(host, site)))
    return out


def key(packages: dict[str, str]) -> str:
    h = hashlib.sha256(f"recipe {RECIPE_VERSION} {sys.version_info[:2]}\n".encode())
    for name, version in packages.items():
        h.update(f"{name} {version}\n".encode())
    for name in PY_PACKAGES:
        h.update(f"py {name} {importlib.metadata.version(name)}\n".encode())
    return h.hexdigest()[:16]


def _canonical(path: str) -> str:
    """The path with its directories resolved (usr-merge: /bin/dash is /usr/bin/dash here) and its last part
    kept, so a symlink stays a symlink."""
    if path == "/":
        return path
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def package_files(packages) -> list[str]:
    """Every file and directory the packages installed, resolved, without documentation, plus the byte code
    compiled for their Python modules (Debian compiles it at install time, so dpkg does not list it)."""
    out = subprocess.run(["dpkg-query", "-L", *packages], capture_output=True, text=True, check=True).stdout
    paths = set()
    tag = sys.implementation.cache_tag
    for line in out.splitlines():
        p = line.strip()
        if not p.startswith("/") or p == "/." or any(p.startswith(d) or p + "/" == d for d in SKIP_DIRS):
            continue
        if not os.path.lexists(p):
            continue
        c = _canonical(p)
        paths.add(c)
        if c.endswith(".py"):
            pyc = os.path.join(os.path.dirname(c), "__pycache__", f"{os.path.basename(c)[:-3]}.{tag}.pyc")
            if os.path.exists(pyc):
                paths.add(pyc)
    return sorted(paths)


_SKELETON = {"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
             "etc/group": "root:x:0:\nnogroup:x:65534:\n",
             "etc/hostname": "host\n"}
_DIRS = {"tmp": 0o1777, "var": 0o755, "var/tmp": 0o1777, "root": 0o700, "proc": 0o755, "sys": 0o755,
         "dev": 0o755, "run": 0o755, "etc": 0o755, "opt": 0o755}            # parents before children


def write_rootfs(fileobj, packages, py_packages=PY_PACKAGES) -> int:
    """The image's root filesystem as a tar stream; returns the number of entries."""
    added: set[str] = set()
    now = int(time.time())
    with tarfile.open(fileobj=fileobj, mode="w|") as tar:
        def directory(arc: str, mode: int = 0o755) -> None:
            ti = tarfile.TarInfo(arc)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, mode, now
            tar.addfile(ti)
            added.add(arc)

        def add(host: str, arc: str) -> None:
            """``host`` at ``arc``, after any parent directory not added yet (sorted input lists parents
            first, so only the Python packages' directories are made up here)."""
            parts = arc.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in added:
                    directory(d)
            tar.add(host, arcname=arc, recursive=False)
            added.add(arc)

        for name, mode in _DIRS.items():
            directory(name, mode)
        for path in package_files(packages):
            if path.lstrip("/") not in added:
                add(path, path.lstrip("/"))
        for name in py_packages:
            for host, dest in sorted(_py_package_files(name)):
                add(host, dest.lstrip("/"))
        for arc, text in _SKELETON.items():
            data = text.encode()
            ti = tarfile.TarInfo(arc)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, now
            tar.addfile(ti, io.BytesIO(data))
            added.add(arc)
    return len(added)


def current(c=None, tag: str = TAG):
    """The image ``IMAGE:tag`` as the daemon has it, or None."""
    c = c or client()
    docker = sys.modules["docker"]
    try:
        return c.images.get(f"{IMAGE}:{tag}")
    except docker.errors.ImageNotFound:
        return None


def build(force: bool = False, log=lambda s: None, tag: str = TAG) -> Built:
    """Build ``fabric-testbed/host`` unless the image of the current key is there (or ``force``). ``tag``:
    another tag than ``latest`` (the benchmark builds a scratch one)."""
    c = client(log=log)
    packages = closure()
    k = key(packages)
    have = current(c, tag)
    if have is not None and not force and (have.labels or {}).get(KEY_LABEL) == k:
        return Built(f"{IMAGE}:{tag}", k, True, 0.0, have.attrs.get("Size", 0), len(packages))
    t = time.monotonic()
    log(f"image: {IMAGE}: root filesystem from {len(packages)} installed Debian packages "
        f"({', '.join(PACKAGES)} and what they depend on) + {', '.join(PY_PACKAGES)}")
    with tempfile.NamedTemporaryFile(prefix="ftb-host-rootfs-", suffix=".tar", dir="/var/tmp") as tmp:
        write_rootfs(tmp, packages)
        tmp.flush()
        changes = [f'CMD {list(CMD)!r}'.replace("'", '"'), f"ENV PATH={PATH}", f"LABEL {KEY_LABEL}={k}"]
        try:
            c.api.import_image_from_file(tmp.name, repository=IMAGE, tag=tag, changes=changes)
        except sys.modules["docker"].errors.APIError as e:
            raise DockerError(f"docker import of the host image failed: {e.explanation or e}") from None
    img = current(c, tag)
    if img is None or (img.labels or {}).get(KEY_LABEL) != k:
        raise DockerError(f"docker import reported success but {IMAGE}:{tag} is not the new image")
    if have is not None and have.id != img.id:          # the image it replaced: untagged now, remove it
        try:
            c.images.remove(have.id)
        except sys.modules["docker"].errors.APIError as e:
            log(f"image: the previous {IMAGE} ({have.short_id}) was kept: {e.explanation or e}")
    return Built(f"{IMAGE}:{tag}", k, False, time.monotonic() - t, img.attrs.get("Size", 0), len(packages))


def status(log=lambda s: None) -> dict:
    """The key the current inputs give and whether the image of that key is there."""
    c = client(log=log)
    packages = closure()
    k = key(packages)
    img = current(c)
    return {"image": f"{IMAGE}:{TAG}", "key": k, "present": img is not None,
            "current": img is not None and (img.labels or {}).get(KEY_LABEL) == k,
            "id": img.short_id if img is not None else None,
            "size_bytes": img.attrs.get("Size") if img is not None else None,
            "packages": len(packages)}
