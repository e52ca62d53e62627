"""deploy/kubernetes on a simulated node, as a real kubelet ran it (its recorded requests).

* The image: the Debian root and dependency wheels of scripts/install-image-root.sh, the
  checkout's own wheel, installed by that root's pip with the Dockerfile's own pip command;
  ENTRYPOINT and CMD are read from the Dockerfile. Imported under the manifest's image name.
  For amd64 and for arm64 (whose pip runs under qemu-aarch64, started explicitly).
* The node: a private mount namespace in which containerd, its shims and the pods run. Its
  /run, /etc, /dev and /proc/driver are the simulated node's (the host's stay untouched):
  /run (so /var/run) is a folder of the test, holding the node's driver at
  /run/nvidia/driver and containerd's NRI socket folder at /run/nri; /etc is an overlay
  (so /etc/cdi and /etc/containerd can be made); /dev holds the node's device nodes.
* The pod: what a real kubelet sent containerd when a control plane created the DaemonSet's
  pod from the chart (tests/data/kubelet-1.35.6/daemonset), replayed by the test; here,
  ``recording_differences`` compares that recording with the chart's pod template as it
  renders now, field by field, so that a recording that is no longer the chart's pod
  fails (tests/test_daemonset_recording.py).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nri_cdi_testbed.simnode import BuiltNode
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


# --- the pod's fields ---------------------------------------------------------------------


# What of a pod the recording's comparison checks; anything else in the template is a
# difference, so that a field added to the DaemonSet is either checked or named as the
# scheduler's/kubelet's.
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
    """The pod's fields that ``recording_differences`` does not compare (empty when it
    compares all of them)."""
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


# --- the pod as a real kubelet created it -----------------------------------------------------

# What a real kubelet 1.35.6 sent containerd when the API server had it create the
# DaemonSet's pod from the chart (helm install with RECORDED/values.yaml), one recording per
# node: trimmed by tests/e2e/cri_recorder.py (its {node} and {cgroup} placeholders); the
# ConfigMap as the API server held it. tests/data/kubelet-1.35.6/daemonset/README.md says
# how it was made and how to make it again.
RECORDED = REPO / "tests" / "data" / "kubelet-1.35.6" / "daemonset"
# containerd version of the recording -> the e2e set-up's versions it is replayed on.
RECORDED_VERSIONS = {"1.7": ("1.7",), "2.2": ("2.1",)}
# The kubelet's own, not the chart's: the pod's config source, the service variables it
# gives every container, and the files it mounts into every container.
KUBELET_ANNOTATIONS = ("kubernetes.io/config.source", "kubernetes.io/config.seen")
KUBELET_ENV = re.compile(r"KUBERNETES_(SERVICE|PORT)\w*")
# The chart's and the image's version, in every pod label set: a release moves them
# (docs/developer/releasing.md) without changing what the pod runs, so they are left out
# of the comparison rather than forcing a new recording at every release.
VERSION_LABELS = ("helm.sh/chart", "app.kubernetes.io/version")
# The kubelet's pod-level labels (the scheduler's and the DaemonSet controller's).
CONTROLLER_LABELS = ("controller-revision-hash", "pod-template-generation")


def recording_file(version: str) -> Path:
    """The recording replayed on the e2e set-up's containerd ``version``."""
    for recorded, replayed_on in RECORDED_VERSIONS.items():
        if version in replayed_on:
            return RECORDED / f"install-containerd-{recorded}.jsonl"
    raise ValueError(f"no DaemonSet recording is replayed on containerd {version}")


def recorded_requests(path: Path) -> list[dict[str, Any]]:
    """A recording's calls (JSON lines, request order)."""
    calls = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(calls, key=lambda call: int(call["seq"]))


def recorded_values() -> dict[str, Any]:
    return dict(yaml.safe_load((RECORDED / "values.yaml").read_text()))


def recorded_config_map() -> tuple[str, dict[str, str]]:
    recorded = json.loads((RECORDED / "configmap.json").read_text())
    return str(recorded["name"]), dict(recorded["data"])


def recorded_image(calls: list[dict[str, Any]]) -> str:
    """The image the kubelet was asked for (the one name of every container)."""
    (image,) = {c["request"]["config"]["image"]["user_specified_image"] for c in calls
                if c["method"].endswith("/CreateContainer")}
    return str(image)


def _creates(calls: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["request"]["config"]["metadata"]["name"]: c["request"]["config"] for c in calls
            if c["method"].endswith("/CreateContainer")}


def recording_differences(template: dict[str, Any], calls: list[dict[str, Any]]) -> list[str]:
    """How the chart's pod ``template`` (rendered now) differs from what the kubelet was
    asked to run in the recording ``calls``, one line each; empty when the recording is
    still the chart's pod. A field of the template this comparison does not know is a
    difference too (``untranslated``), so that a new field cannot go unchecked."""
    out = [f"{field}: not compared with the recording" for field in untranslated(template)]
    spec, meta = template["spec"], template["metadata"]
    (sandbox,) = [c["request"]["config"] for c in calls
                  if c["method"].endswith("/RunPodSandbox")]
    labels = {k: v for k, v in sandbox.get("labels", {}).items()
              if not k.startswith("io.kubernetes.") and k not in CONTROLLER_LABELS
              and k not in VERSION_LABELS}
    wanted = {k: v for k, v in meta.get("labels", {}).items() if k not in VERSION_LABELS}
    if labels != wanted:
        out.append(f"pod labels: chart {wanted}, recorded {labels}")
    annotations = {k: v for k, v in sandbox.get("annotations", {}).items()
                   if k not in KUBELET_ANNOTATIONS}
    if annotations != meta.get("annotations", {}):
        out.append(f"pod annotations: chart {meta.get('annotations', {})}, "
                   f"recorded {annotations}")
    options = sandbox["linux"]["security_context"]["namespace_options"]
    for key, name in (("network", "hostNetwork"), ("pid", "hostPID"), ("ipc", "hostIPC")):
        if (options.get(key) == "NODE") != bool(spec.get(name)):
            out.append(f"spec.{name}: chart {spec.get(name)}, recorded {key} "
                       f"{options.get(key, 'POD')}")
    created = _creates(calls)
    containers = spec.get("initContainers", []) + spec["containers"]
    if sorted(created) != sorted(c["name"] for c in containers):
        out.append(f"containers: chart {[c['name'] for c in containers]}, recorded "
                   f"{sorted(created)}")
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in containers:
        if container["name"] in created:
            out += [f"{container['name']}: {d}" for d in
                    _container_differences(container, created[container["name"]], volumes)]
    return out


def _host_path_of(volume: dict[str, Any]) -> str:
    """Where the kubelet's host path for ``volume`` ends: the path itself, or the pod
    folder's volume folder (ConfigMap, emptyDir)."""
    if "hostPath" in volume:
        return str(volume["hostPath"]["path"])
    kind = "configmap" if "configMap" in volume else "empty-dir"
    return f"/volumes/kubernetes.io~{kind}/{volume['name']}"


def _container_differences(container: dict[str, Any], config: dict[str, Any],
                           volumes: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    if config["image"].get("user_specified_image") != container["image"]:
        out.append(f"image: chart {container['image']}, recorded "
                   f"{config['image'].get('user_specified_image')}")
    for key in ("command", "args"):
        if list(config.get(key, [])) != list(container.get(key, [])):
            out.append(f"{key}: chart {container.get(key, [])}, recorded {config.get(key, [])}")
    env = {e["key"]: e["value"] for e in config.get("envs", [])
           if not KUBELET_ENV.fullmatch(e["key"])}
    wanted_env = {e["name"]: e.get("value") for e in container.get("env", [])}
    if env != wanted_env:
        out.append(f"env: chart {wanted_env}, recorded {env}")
    message_path = container.get("terminationMessagePath", "/dev/termination-log")
    recorded_path = config["annotations"].get("io.kubernetes.container.terminationMessagePath")
    if recorded_path != message_path:
        out.append(f"terminationMessagePath: chart {message_path}, recorded {recorded_path}")
    mounts = {m["container_path"]: m for m in config.get("mounts", [])
              if m["container_path"] not in ("/etc/hosts", message_path)}
    wanted_mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
    if sorted(mounts) != sorted(wanted_mounts):
        out.append(f"mounts: chart {sorted(wanted_mounts)}, recorded {sorted(mounts)}")
    for path, mount in wanted_mounts.items():
        got = mounts.get(path)
        if got is None:
            continue
        host = _host_path_of(volumes[mount["name"]])
        if not (got["host_path"] == host or got["host_path"].endswith(host)):
            out.append(f"mount {path}: chart from {host}, recorded {got['host_path']}")
        if bool(got.get("readonly")) != bool(mount.get("readOnly")):
            out.append(f"mount {path}: chart readOnly {mount.get('readOnly', False)}, "
                       f"recorded {got.get('readonly', False)}")
        wanted = PROPAGATION[mount.get("mountPropagation", "None")]
        if got.get("propagation", "PROPAGATION_PRIVATE") != wanted:
            out.append(f"mount {path}: chart {wanted}, recorded "
                       f"{got.get('propagation', 'PROPAGATION_PRIVATE')}")
    out += _security_differences(container.get("securityContext", {}),
                                 config["linux"]["security_context"])
    resources = container.get("resources", {})
    recorded = config["linux"].get("resources", {})
    memory = resources.get("limits", {}).get("memory")
    if memory is not None and int(recorded.get("memory_limit_in_bytes", 0)) != _quantity(memory):
        out.append(f"memory limit: chart {memory}, recorded "
                   f"{recorded.get('memory_limit_in_bytes')}")
    cpu = resources.get("requests", {}).get("cpu")
    if cpu is not None and int(recorded.get("cpu_shares", 0)) != max(
            2, _millicpu(cpu) * 1024 // 1000):
        out.append(f"cpu request: chart {cpu}, recorded shares {recorded.get('cpu_shares')}")
    return out


def _security_differences(security: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    # proto3 JSON leaves out false, zero and empty: absent is that value
    pairs: list[tuple[str, object, object]] = [
        ("privileged", bool(security.get("privileged")), bool(recorded.get("privileged"))),
        ("readOnlyRootFilesystem", bool(security.get("readOnlyRootFilesystem")),
         bool(recorded.get("readonly_rootfs"))),
        ("allowPrivilegeEscalation false", security.get("allowPrivilegeEscalation") is False,
         bool(recorded.get("no_new_privs")))]
    if "runAsUser" in security:
        pairs.append(("runAsUser", int(security["runAsUser"]),
                      int(recorded.get("run_as_user", {"value": -1}).get("value", 0))))
    capabilities = security.get("capabilities", {})
    given = recorded.get("capabilities", {})
    pairs += [("capabilities.add", sorted(capabilities.get("add", [])),
               sorted(given.get("add_capabilities", []))),
              ("capabilities.drop", sorted(capabilities.get("drop", [])),
               sorted(given.get("drop_capabilities", [])))]
    return [f"securityContext.{name}: chart {chart}, recorded {got}"
            for name, chart, got in pairs if chart != got]
