"""deploy/kubernetes as a kubelet would run it, without a kubelet or a registry.

* The image: the Debian root and dependency wheels of scripts/install-image-root.sh, the
  checkout's own wheel, installed by that root's pip with the Dockerfile's own pip command;
  ENTRYPOINT and CMD are read from the Dockerfile. Imported under the manifest's image name.
  For amd64 and for arm64 (whose pip runs under qemu-aarch64, started explicitly).
* The node: a private mount namespace in which containerd, its shims and the pods run. Its
  /run, /etc, /dev and /proc/driver are the simulated node's (the host's stay untouched):
  /run (so /var/run) is a folder of the test, holding the node's driver at
  /run/nvidia/driver and containerd's NRI socket folder at /run/nri; /etc is an overlay
  (so /etc/cdi and /etc/containerd can be made); /dev holds the node's device nodes.
* The pod: the DaemonSet's pod template translated to CRI the way the kubelet does it
  (host namespaces, privileges, user, capabilities, read-only root, resources, volumes,
  init containers run to completion first, command and args), the ConfigMap's data as the
  config volume's files, plus what a real kubelet adds to every pod and container (its
  labels and annotations, the /etc/hosts and termination-log mounts, a log folder named
  <namespace>_<name>_<uid>: ``kubelet_requests.py``, from the recordings). Nothing of the
  pod is restated here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nri_cdi_testbed.simnode import BuiltNode
from tests.e2e import kubelet_requests
from tests.e2e.cri import CriClient
from tests.e2e.images import DEFAULT_PATH, ImageConfig, image_from_tree
from tests.e2e.paths import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
POD_NAME, POD_NAMESPACE = "nri-cdi-node", "kube-system"
DOCKERFILE = DEPLOY / "Dockerfile"


# The image's architectures (OCI names); amd64's parts are in the cache's top folder.
ARCHITECTURES = ("amd64", "arm64")
# What runs a program of the image's architecture here, when it is not this machine's.
EMULATED = {"arm64": "aarch64"}


def image_cache(architecture: str = "amd64") -> Path:
    env = os.environ.get("NRI_CDI_IMAGE_CACHE")
    base = Path(env) if env else REPO / ".cache" / "nri-cdi-image"
    return base if architecture == "amd64" else base / architecture


def missing_image_parts(architecture: str = "amd64") -> list[str]:
    cache = image_cache(architecture)
    missing = [str(p) for p in (cache / "root" / "usr" / "bin" / "python3", cache / "wheels")
               if not p.exists()]
    return [f"{m} (run scripts/install-image-root.sh --arch {architecture})" for m in missing]


# --- the Dockerfile ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Dockerfile:
    bases: tuple[str, ...]
    apt_packages: tuple[str, ...]  # of the final stage
    pip_install: tuple[str, ...]  # the final stage's pip install arguments
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    copied: tuple[str, ...] = ()  # what the first stage COPYs from the build context


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def read_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    steps = _instructions(path.read_text())
    final = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    bases = tuple(rest.split()[0] for word, rest in steps if word == "FROM")
    apt: list[str] = []
    pip: list[str] = []
    for word, rest in steps[final:]:
        if word != "RUN":
            continue
        for command in rest.split("&&"):
            argv = shlex.split(command)
            if argv[:2] == ["apt-get", "install"]:
                apt += [a for a in argv[2:] if not a.startswith("-")]
            if argv[:2] == ["pip", "install"]:
                pip = argv[2:]
    copied = [name for word, rest in steps[:final] if word == "COPY"
              for name in rest.split()[:-1] if not name.startswith("--")]
    last = {word: rest for word, rest in steps[final:]}
    return Dockerfile(bases, tuple(apt), tuple(pip), tuple(json.loads(last["ENTRYPOINT"])),
                      tuple(json.loads(last["CMD"])), tuple(copied))


def build_image(name: str, work: Path, *, architecture: str = "amd64",
                emulator: Path | None = None) -> Path:
    """The nri-cdi image's OCI archive (``work/nri-cdi.tar``), as the Dockerfile makes it,
    for ``architecture``; one that is not this machine's needs ``emulator`` (a static
    qemu-user), which runs the root's pip (and is not left in the image)."""
    facts = read_dockerfile()
    tree = work / "rootfs"
    cache = image_cache(architecture)
    subprocess.run(["cp", "-a", str(cache / "root"), str(tree)], check=True)
    wheels = tree / "wheels"
    wheels.mkdir()
    for wheel in (cache / "wheels").glob("*.whl"):
        shutil.copy(wheel, wheels)
    # What the Dockerfile COPYs, built outside the checkout (setuptools writes build/ there).
    source = work / "src"
    source.mkdir()
    for part in facts.copied:
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, source / part)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(wheels), str(source)],
                   check=True, capture_output=True, cwd=work)
    # The root's own pip, with no environment of ours (no PIP_* settings, no index); for
    # another architecture run by the emulator, copied into the root for the time of it
    # (static: it needs nothing there, nor binfmt_misc).
    argv = ["chroot", str(tree), "pip", "install", *facts.pip_install]
    if architecture in EMULATED and os.uname().machine != EMULATED[architecture]:
        if emulator is None:
            raise ValueError(f"a {architecture} image needs an emulator to run its pip here")
        shutil.copy2(emulator, tree / ".nri-cdi-emulator")
        argv = ["chroot", str(tree), "/.nri-cdi-emulator", "/usr/bin/python3",
                "/usr/bin/pip", "install", *facts.pip_install]
    done = subprocess.run(argv, env={"PATH": DEFAULT_PATH.split("=", 1)[1], "HOME": "/root"},
                          capture_output=True, text=True, check=False)
    (tree / ".nri-cdi-emulator").unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install in the image root failed: {done.stderr.strip()}")
    shutil.rmtree(wheels)
    config = ImageConfig(entrypoint=facts.entrypoint, cmd=facts.cmd, env=(DEFAULT_PATH,),
                         architecture=architecture)
    return image_from_tree(name, tree, work / "nri-cdi.tar", config=config, with_busybox=False)


# --- the manifests ----------------------------------------------------------------------------


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def pod_template() -> dict[str, Any]:
    (ds,) = documents("daemonset.yaml")
    return dict(ds["spec"]["template"])


def config_maps() -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d["data"] for d in documents("configmap.yaml")
            if d["kind"] == "ConfigMap"}


def host_paths(template: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {v["name"]: v["hostPath"] for v in template["spec"]["volumes"] if "hostPath" in v}


# --- the node's mount namespace -------------------------------------------------------------

# $1 node root, $2 the node's /run, $3 /etc overlay upper, $4 its workdir, $5 containerd's
# NRI folder, $6 its config (the node's /etc/containerd/config.toml), then the hostPath
# folders to create (DirectoryOrCreate), "--", containerd's command line.
NODE_SCRIPT = r"""set -e
node=$1 run=$2 upper=$3 work=$4 nri=$5 config=$6; shift 6
mount --bind "$run" /run
mkdir -p /run/nvidia/driver /run/nri
mount --bind "$node/run/nvidia/driver" /run/nvidia/driver
# shared, as under systemd: containerd takes a HostToContainer mount only from a shared or
# slave one
mount --make-shared /run/nvidia/driver
mount --bind "$nri" /run/nri
mount -t overlay nri-cdi-etc -o "lowerdir=/etc,upperdir=$upper,workdir=$work" /etc
mount -t tmpfs -o mode=0755 nri-cdi-dev /dev
for d in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
  name=${d%%:*} nums=${d#*:}; mknod -m 666 /dev/$name c ${nums%%:*} ${nums#*:}
done
mkdir -p /dev/pts /dev/shm
cp -a "$node/dev/." /dev/
mount -t tmpfs -o mode=0755 nri-cdi-proc /proc/driver
for d in nvidia nvidia-caps; do
  if [ -d "$node/proc/driver/$d" ]; then
    mkdir /proc/driver/$d && mount --bind "$node/proc/driver/$d" /proc/driver/$d
  fi
done
while [ "$1" != -- ]; do mkdir -p "$1"; shift; done
shift
mkdir -p /etc/containerd && cp "$config" /etc/containerd/config.toml
exec "$@"
"""


@dataclass
class NodeNamespace:
    """Folders of the node's namespace that the test reads from outside it."""

    node: BuiltNode
    work: Path
    containerd_dir: Path  # the private containerd's folder (its NRI socket, its config)
    create: list[str] = field(default_factory=list)

    @property
    def run(self) -> Path:
        return self.work / "run"

    def wrapper(self) -> list[str]:
        upper, overlay_work = self.work / "etc", self.work / "etc-work"
        for folder in (self.run, upper, overlay_work):
            folder.mkdir(parents=True, exist_ok=True)
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", NODE_SCRIPT, "sh",
                str(self.node.root), str(self.run), str(upper), str(overlay_work),
                str(self.containerd_dir / "nri"), str(self.containerd_dir / "config.toml"),
                *self.create, "--"]

    def etc(self, rel: str) -> Path:
        """Where a file of the node's /etc is written before containerd starts."""
        return self.work / "etc" / rel


# --- the pod, as the kubelet makes it ---------------------------------------------------------


# What of a pod the runner applies; anything else in the manifest fails the test, so that a
# field added to the DaemonSet is either run here or named as the scheduler's/kubelet's.
POD_FIELDS = {"hostNetwork", "hostPID", "hostIPC", "initContainers", "containers", "volumes",
              # the scheduler's, not the node's
              "nodeSelector", "tolerations", "priorityClassName",
              # the API server's: with no token mounted the kubelet adds nothing for them
              "serviceAccountName", "automountServiceAccountToken"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "volumeMounts",
                    "securityContext", "terminationMessagePath",
                    "resources",
                    # the kubelet's own work: probes are made by the test, ports are the
                    # host's (hostNetwork)
                    "ports", "readinessProbe", "livenessProbe"}
SECURITY_FIELDS = {"privileged", "runAsUser", "allowPrivilegeEscalation",
                   "readOnlyRootFilesystem", "capabilities"}
MOUNT_FIELDS = {"name", "mountPath", "readOnly", "mountPropagation"}


def untranslated(template: dict[str, Any]) -> list[str]:
    """The pod's fields that PodRunner does not apply (empty when it runs all of them)."""
    spec = template["spec"]
    out = [f"spec.{k}" for k in spec if k not in POD_FIELDS]
    for c in spec.get("initContainers", []) + spec["containers"]:
        out += [f"{c['name']}.{k}" for k in c if k not in CONTAINER_FIELDS]
        out += [f"{c['name']}.securityContext.{k}" for k in c.get("securityContext", {})
                if k not in SECURITY_FIELDS]
        out += [f"{c['name']}.env.{e['name']}" for e in c.get("env", []) if "value" not in e]
        out += [f"{c['name']}.volumeMounts.{m['name']}.{k}" for m in c.get("volumeMounts", [])
                for k in m if k not in MOUNT_FIELDS]
    return out


@dataclass
class PodRunner:
    """Runs the DaemonSet's pod on ``cri``; ``config_dir`` holds the ConfigMap volumes."""

    cri: CriClient
    config_dir: Path
    template: dict[str, Any] = field(default_factory=pod_template)
    # The ConfigMaps' data by name, as the kubelet would mount them.
    maps: dict[str, dict[str, str]] = field(default_factory=config_maps)
    pod_id: str = ""
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    sandbox: Any = None
    attempts: dict[str, int] = field(default_factory=dict)

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.template["spec"])

    def _volumes(self) -> dict[str, str]:
        """Volume name -> host path (ConfigMap data written as files, as the kubelet does)."""
        maps = self.maps
        out = {}
        for volume in self.spec["volumes"]:
            if "hostPath" in volume:
                out[volume["name"]] = volume["hostPath"]["path"]
            elif "configMap" in volume:
                folder = self.config_dir / volume["name"]
                folder.mkdir(parents=True, exist_ok=True)
                for key, text in maps[volume["configMap"]["name"]].items():
                    (folder / key).write_text(text)
                out[volume["name"]] = str(folder)
            elif "emptyDir" in volume:  # the kubelet's is under its pod folder (tmpfs for
                folder = self.config_dir / "empty-dir" / volume["name"]  # Memory): a folder
                folder.mkdir(parents=True, exist_ok=True)
                out[volume["name"]] = str(folder)
            else:
                raise ValueError(f"volume {volume['name']}: only hostPath, configMap and "
                                 "emptyDir run here")
        return out

    def run_pod(self) -> str:
        pb, spec, meta = self.cri.pb, self.spec, self.template["metadata"]
        node = pb.NamespaceMode.NODE
        options = pb.NamespaceOption(
            network=node if spec.get("hostNetwork") else pb.NamespaceMode.POD,
            pid=node if spec.get("hostPID") else pb.NamespaceMode.CONTAINER,
            ipc=node if spec.get("hostIPC") else pb.NamespaceMode.POD)
        containers = spec.get("initContainers", []) + spec["containers"]
        privileged = any(c.get("securityContext", {}).get("privileged") for c in containers)
        # What a kubelet 1.35 adds to every pod (tests/data/kubelet-1.35.6): the pod's
        # identity as labels, where its config came from as annotations, and a log folder
        # named <namespace>_<name>_<uid>.
        self.sandbox = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=POD_NAME, uid=self.uid,
                                           namespace=POD_NAMESPACE, attempt=0),
            labels={**meta.get("labels", {}), **self._pod_labels()},
            annotations={**meta.get("annotations", {}), "kubernetes.io/config.source": "api",
                         "kubernetes.io/config.seen": time.strftime("%Y-%m-%dT%H:%M:%SZ")},
            log_directory=str(self.config_dir / "logs"
                              / f"{POD_NAMESPACE}_{POD_NAME}_{self.uid}"),
            linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=options, privileged=privileged)))
        self.pod_id = self.cri.run_sandbox(self.sandbox)
        return self.pod_id

    def _pod_labels(self) -> dict[str, str]:
        return kubelet_requests.pod_labels(POD_NAME, POD_NAMESPACE, self.uid)

    def container_config(self, container: dict[str, Any]) -> Any:
        pb = self.cri.pb
        volumes = self._volumes()
        security = container.get("securityContext", {})
        attempt = self.attempts.get(container["name"], 0)
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=container["name"], attempt=attempt),
            image=pb.ImageSpec(image=container["image"]),
            command=list(container.get("command", [])), args=list(container.get("args", [])),
            envs=[pb.KeyValue(key=e["name"], value=e["value"])
                  for e in container.get("env", [])],
            # the kubelet's labels and annotations (tests/data/kubelet-1.35.6)
            labels={**self._pod_labels(), "io.kubernetes.container.name": container["name"]},
            annotations=kubelet_requests.container_annotations(
                container["name"], attempt, self.spec.get("terminationGracePeriodSeconds", 30),
                container.get("terminationMessagePath", kubelet_requests.TERMINATION_LOG)),
            log_path=f"{container['name']}/{attempt}.log")
        for mount in container.get("volumeMounts", []):
            config.mounts.add(container_path=mount["mountPath"],
                              host_path=volumes[mount["name"]],
                              readonly=bool(mount.get("readOnly")),
                              propagation=PROPAGATION[mount.get("mountPropagation", "None")])
        files = kubelet_requests.container_files(
            self.config_dir / "pods" / self.uid, container["name"],
            container.get("terminationMessagePath", kubelet_requests.TERMINATION_LOG))
        for container_path, host_path in files.items():
            config.mounts.add(container_path=container_path, host_path=host_path)
        linux = config.linux.security_context
        linux.privileged = bool(security.get("privileged"))
        linux.readonly_rootfs = bool(security.get("readOnlyRootFilesystem"))
        linux.no_new_privs = security.get("allowPrivilegeEscalation") is False
        if "runAsUser" in security:
            linux.run_as_user.value = int(security["runAsUser"])
        linux.capabilities.drop_capabilities.extend(
            security.get("capabilities", {}).get("drop", []))
        linux.capabilities.add_capabilities.extend(
            security.get("capabilities", {}).get("add", []))
        linux.namespace_options.CopyFrom(self.sandbox.linux.security_context.namespace_options)
        resources = container.get("resources", {})
        limits, requests = resources.get("limits", {}), resources.get("requests", {})
        if "memory" in limits:
            config.linux.resources.memory_limit_in_bytes = _quantity(limits["memory"])
        if "cpu" in requests:  # the kubelet's shares: 1024 per CPU, at least 2
            config.linux.resources.cpu_shares = max(2, _millicpu(requests["cpu"]) * 1024 // 1000)
        return config

    def start(self, container: dict[str, Any]) -> str:
        request = self.cri.pb.CreateContainerRequest(
            pod_sandbox_id=self.pod_id, config=self.container_config(container),
            sandbox_config=self.sandbox)
        cid = str(self.cri.runtime.CreateContainer(request, timeout=self.cri.timeout)
                  .container_id)
        self.attempts[container["name"]] = self.attempts.get(container["name"], 0) + 1
        self.cri.start_container(cid)
        return cid

    def run_init_containers(self, timeout: float = 60.0) -> None:
        """Each init container to completion, in order; one that fails raises with its log."""
        for container in self.spec.get("initContainers", []):
            cid = self.start(container)
            status = wait_exited(self.cri, cid, timeout)
            if status.exit_code != 0:
                raise RuntimeError(f"init container {container['name']} exited "
                                   f"{status.exit_code}: {_log(status, 3000)}")

    def container(self, name: str) -> dict[str, Any]:
        return next(c for c in self.spec["containers"] if c["name"] == name)


# The kubelet's mapping of a volume mount's mountPropagation to CRI's.
PROPAGATION = {"None": "PROPAGATION_PRIVATE", "HostToContainer": "PROPAGATION_HOST_TO_CONTAINER",
               "Bidirectional": "PROPAGATION_BIDIRECTIONAL"}


def wait_exited(cri: CriClient, cid: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        status = cri.container_status(cid).status
        if status.state == cri.pb.CONTAINER_EXITED:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"container {cid} still {status.state} after {timeout}s")
        time.sleep(0.1)


def container_log(cri: CriClient, cid: str) -> str:
    return _log(cri.container_status(cid).status)


def _log(status: Any, limit: int = 65536) -> str:
    """The container's log, its last ``limit`` characters (the plugin's start-up lines
    included: what is asserted on may be early in it)."""
    try:
        return Path(status.log_path).read_text()[-limit:]
    except OSError:
        return "(no log)"


_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 1000, "M": 10**6, "G": 10**9}


def _quantity(text: str) -> int:
    """A Kubernetes memory quantity in bytes (the units the manifests use)."""
    match = re.fullmatch(r"(\d+)([KMG]i?)?", str(text))
    if not match:
        raise ValueError(f"memory quantity {text!r}")
    return int(match.group(1)) * _UNITS.get(match.group(2) or "", 1)


def _millicpu(text: str | int | float) -> int:
    value = str(text)
    return int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)
