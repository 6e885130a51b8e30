"""Container hosts without Docker: the scenario keys, the host image's package closure and root filesystem, and
how a process is entered into a container (tests/fabric/test_docker_e2e.py runs them for real)."""
from __future__ import annotations

import io
import os
import tarfile

import pytest

from testbed import scenario
from testbed.container import image
from testbed.container.hosts import CODE_DIR, Container


def _load(doc):
    return scenario.from_dict(doc)


def test_docker_hosts_keys_and_defaults():
    assert _load({}).hosts.docker is None                               # namespace hosts stay the default
    d = _load({"hosts": {"docker": {}}}).hosts.docker
    assert d.image == "fabric-testbed/host" and d.image_of("h0") == "fabric-testbed/host"
    d = _load({"hosts": {"docker": {"image": "debian:bookworm", "per_host": {"h3": "ftb/tool:1.0"}}}}).hosts.docker
    assert (d.image_of("h0"), d.image_of("h3")) == ("debian:bookworm", "ftb/tool:1.0")


@pytest.mark.parametrize("doc, expect", [
    ({"hosts": {"docker": {"image": "Not An Image"}}}, "hosts.docker.image: not a Docker image name"),
    ({"hosts": {"docker": {"per_host": {"h99": "x"}}}}, "hosts.docker.per_host: no node 'h99'"),
    ({"hosts": {"docker": {"per_host": {"leaf0": "x"}}}}, "hosts.docker.per_host.leaf0: leaf0 is a switch"),
    ({"hosts": {"docker": {"images": "x"}}}, "hosts.docker.images: unknown key"),
    ({"hosts": {"docker": {}}, "traffic": {"engine": "rxe"}}, "hosts.docker: not with traffic.engine rxe"),
])
def test_bad_docker_hosts_are_one_line(doc, expect):
    with pytest.raises(scenario.ScenarioError) as e:
        _load(doc)
    assert str(e.value).startswith(expect), str(e.value)


def test_image_closure_follows_installed_dependencies():
    pk = image.closure(("python3",))
    assert {"python3", "python3.11", "python3.11-minimal", "libpython3.11-stdlib", "libc6"} <= set(pk)
    assert not set(pk) & image.SKIP_PACKAGES                            # dpkg, debconf, tar … left out
    assert "libc6" in image.closure(("dash",))                          # through its Pre-Depends
    with pytest.raises(image.DockerError, match="not installed: ftb-no-such-package"):
        image.closure(("ftb-no-such-package",))


def test_image_key_names_the_inputs():
    pk = image.closure(("dash",))
    assert image.key(pk) == image.key(dict(pk))
    assert image.key(pk) != image.key({**pk, "dash": pk["dash"] + "+changed"})
    assert image.key(pk) != image.key({**pk, "extra": "1"})


def test_rootfs_has_the_packages_files_and_no_docs():
    buf = io.BytesIO()
    image.write_rootfs(buf, image.closure(("python3", "dash")))
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    by = {m.name: m for m in members}
    assert len(names) == len(set(names))
    for need in ("usr/bin/dash", "usr/bin/python3.11", "etc/passwd", "tmp", "usr/lib/python3.11/os.py",
                 "usr/local/lib/python3.11/dist-packages/isal/__init__.py"):
        assert need in by, need
    assert by["usr/bin/python3"].issym()
    assert by["tmp"].mode == 0o1777
    assert any(n.startswith("usr/lib/python3.11/__pycache__/os.") for n in names)   # Debian's byte code too
    assert not [n for n in names if n.startswith(("usr/share/doc/", "usr/share/man/"))]
    seen = set()
    for n in names:                          # every entry's directory comes before it
        parent = n.rsplit("/", 1)[0] if "/" in n else ""
        assert not parent or parent in seen, n
        seen.add(n)


def test_canonical_paths_resolve_directories_only():
    assert image._canonical("/") == "/"
    assert image._canonical("/usr/bin/python3") == "/usr/bin/python3"    # the symlink itself is kept
    assert image._canonical("/bin/dash") == os.path.join(os.path.realpath("/bin"), "dash")   # usr-merge


def test_entering_a_container():
    c = Container("h0", "ftb-x-h0", "fabric-testbed/host", 1234, 99, ["PATH=/bin", "LANG=C.UTF-8"])
    argv = c.argv(["ping", "-c1", "198.18.0.2"])
    assert argv[1:] == ["--target=1234", "--mount", "--uts", "--ipc", "--net", "--pid", "--", "ping", "-c1",
                        "198.18.0.2"]
    assert c.environ({"PYTHONPATH": CODE_DIR}) == {"PATH": "/bin", "LANG": "C.UTF-8", "PYTHONPATH": CODE_DIR}
    assert Container.from_dict(c.to_dict()) == c
    assert c.netns_file == "/proc/1234/ns/net"
