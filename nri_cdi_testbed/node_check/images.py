"""Single-layer OCI image archives built with the standard library (no registry, no pulls).

An archive holds ``oci-layout``, ``index.json`` and ``blobs/sha256/`` (an uncompressed layer
tar, the image config and the manifest); ``ctr images import`` loads it into containerd.
Layers are deterministic: owner 0:0, mtime 0, sorted entries.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nri_cdi_testbed.node_check import paths

PAUSE_IMAGE = "localhost/nri-cdi/pause:e2e"
BUSYBOX_IMAGE = "localhost/nri-cdi/busybox:e2e"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The sandbox ("pause") process: PID 1 of the pod, idle until containerd stops it. PID 1 ignores
# signals it has no handler for, hence the trap; sleeping in the background keeps it responsive.
PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"
MT_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass
class ImageConfig:
    """The parts of the OCI image config these images set."""

    cmd: Sequence[str] = ("sh",)
    entrypoint: Sequence[str] = ()
    env: Sequence[str] = (DEFAULT_PATH,)
    workdir: str = "/"
    labels: Mapping[str, str] = field(default_factory=dict)
    user: str = ""  # the image's USER ("1000", "1000:1000"); empty: root
    architecture: str = ""  # OCI name (amd64, arm64); empty: this machine's (oci_arch())


def oci_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


# --- layers ---------------------------------------------------------------------------------


class LayerWriter:
    """Builds an uncompressed, reproducible layer tar in memory."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.strip("/"))
        info.type, info.mode, info.mtime = kind, mode, 0
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    def _parents(self, name: str) -> None:
        # Explicit parent directories: otherwise their mode in the rootfs is up to the unpacker.
        parts = name.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.dir("/".join(parts[:i]))

    def dir(self, name: str, mode: int = 0o755) -> None:
        if name.strip("/") and name.strip("/") not in self._entries:
            self._parents(name)
            self._entries[name.strip("/")] = (self._info(name, tarfile.DIRTYPE, mode), None)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._parents(name)
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._entries[name.strip("/")] = (info, data)

    def symlink(self, name: str, target: str) -> None:
        self._parents(name)
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._entries[name.strip("/")] = (info, None)

    def fifo(self, name: str, mode: int = 0o644) -> None:
        """A named pipe (hostile-image tests: a reader that opens it would block)."""
        self._parents(name)
        self._entries[name.strip("/")] = (self._info(name, tarfile.FIFOTYPE, mode), None)

    def add_tree(self, root: Path, prefix: str = "") -> None:
        """Copy a host folder tree (files, folders, symlinks, FIFOs; modes kept, owners
        zeroed)."""
        for path in sorted(root.rglob("*")):
            name = f"{prefix.strip('/')}/{path.relative_to(root)}".strip("/")
            mode = path.lstat().st_mode & 0o7777
            if path.is_symlink():
                self.symlink(name, str(path.readlink()))
            elif path.is_dir():
                self.dir(name, mode)
            elif path.is_file():
                self.file(name, path.read_bytes(), mode)
            elif path.is_fifo():
                self.fifo(name, mode)
            # Sockets and device nodes are left out: images never need them here.

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self._entries):
                info, data = self._entries[name]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def base_rootfs(layer: LayerWriter) -> None:
    """The folders and files every one of these images has."""
    for name, mode in (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555),
                       ("root", 0o700), ("sys", 0o555), ("tmp", 0o1777), ("var", 0o755)):
        layer.dir(name, mode)
    layer.file("etc/passwd", PASSWD.encode())
    layer.file("etc/group", GROUP.encode())


def add_busybox(layer: LayerWriter, busybox: Path, *, runner: Sequence[str] = ()) -> None:
    """/bin/busybox plus one symlink per applet, as busybox itself lists them; ``runner``
    starts it (an emulator, for another architecture's busybox)."""
    layer.file("bin/busybox", busybox.read_bytes(), 0o755)
    applets = subprocess.run(
        [*runner, str(busybox), "--list-full"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in applets:
        if applet != "bin/busybox":
            layer.symlink(applet, "/bin/busybox")


# --- archives -------------------------------------------------------------------------------


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _config_blob(layer_digest: str, config: ImageConfig) -> bytes:
    cfg: dict[str, object] = {
        "Env": list(config.env),
        "Cmd": list(config.cmd),
        "WorkingDir": config.workdir,
    }
    if config.entrypoint:
        cfg["Entrypoint"] = list(config.entrypoint)
    if config.labels:
        cfg["Labels"] = dict(config.labels)
    if config.user:
        cfg["User"] = config.user
    return _json({
        "architecture": config.architecture or oci_arch(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "nri-cdi"}],
    })


def write_archive(name: str, layer_tar: bytes, out: Path, config: ImageConfig) -> Path:
    """Write the OCI archive of a one-layer image called ``name`` (a full reference)."""
    blobs: dict[str, bytes] = {}
    layer = {"mediaType": MT_LAYER, **_blob(blobs, layer_tar)}
    conf = {"mediaType": MT_CONFIG, **_blob(blobs, _config_blob(str(layer["digest"]), config))}
    manifest = _json({"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": conf,
                      "layers": [layer]})
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [{
            "mediaType": MT_MANIFEST,
            **_blob(blobs, manifest),
            "platform": {"architecture": config.architecture or oci_arch(), "os": "linux"},
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": name.rpartition(":")[2],
            },
        }],
    }
    members = [("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", _json(index))]
    members += [(f"blobs/sha256/{d.split(':', 1)[1]}", data) for d, data in blobs.items()]
    _write_tar(out, members)
    return out


def _write_tar(out: Path, members: Iterable[tuple[str, bytes]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for dname in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(dname)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for member, data in members:
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


# --- the images a private containerd needs -----------------------------------------------


def _busybox_layer(busybox: Path | None) -> LayerWriter:
    bb = busybox or paths.busybox()
    if bb is None:
        raise FileNotFoundError(f"busybox not found; run {paths.INSTALL_SCRIPT}")
    layer = LayerWriter()
    base_rootfs(layer)
    add_busybox(layer, bb)
    return layer


def busybox_image(out_dir: Path, *, name: str = BUSYBOX_IMAGE,
                  busybox: Path | None = None) -> Path:
    """Archive of a busybox image (``sh`` by default) at ``out_dir/busybox.tar``."""
    layer = _busybox_layer(busybox)
    return write_archive(name, layer.tar(), out_dir / "busybox.tar", ImageConfig())


def pause_image(out_dir: Path, *, name: str = PAUSE_IMAGE, busybox: Path | None = None) -> Path:
    """Archive of the sandbox image: a shell loop that exits on TERM."""
    layer = _busybox_layer(busybox)
    config = ImageConfig(cmd=(), entrypoint=("/bin/sh", "-c", PAUSE_SCRIPT))
    return write_archive(name, layer.tar(), out_dir / "pause.tar", config)


def image_from_tree(name: str, tree: Path, out: Path, *, config: ImageConfig | None = None,
                    with_busybox: bool = True) -> Path:
    """Archive of an image holding the host folder ``tree`` as its root filesystem.

    With ``with_busybox`` the busybox base (shell, passwd, applets) is laid down first and
    ``tree`` is copied over it, so that shell commands can be run in the image.
    """
    layer = _busybox_layer(None) if with_busybox else LayerWriter()
    layer.add_tree(tree)
    return write_archive(name, layer.tar(), out, config or ImageConfig())


def archive_platform(archive: Path) -> str:
    """``os/architecture`` of the (first) image in an archive ``write_archive`` made."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise RuntimeError(f"{archive}: no index.json")
        platform = json.load(member)["manifests"][0]["platform"]
    return f"{platform['os']}/{platform['architecture']}"


def import_image(archive: Path, address: str, *, namespace: str = "k8s.io",
                 ctr: Path | None = None) -> None:
    """Load ``archive`` into the containerd at ``address`` (CRI uses namespace k8s.io), for
    the platform it was built for (ctr filters out any other than the machine's unless
    told)."""
    ctr_bin = ctr or paths.bin_dir() / "ctr"
    proc = subprocess.run(
        [str(ctr_bin), "-a", address, "-n", namespace, "images", "import", "--platform",
         archive_platform(archive), str(archive)],
        capture_output=True, text=True, timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ctr images import {archive} failed: {proc.stderr.strip()}")
