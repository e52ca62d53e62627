"""Assemble an NVIDIA CDI spec from discovered facts (pure), plus its fingerprint and metadata.

``collect`` is the one impure step (it reads the node); ``build_spec`` turns the inventory
into a ``SpecData`` in the shape ``nvidia-ctk cdi generate`` emits (docs/usage/spec-generation.md).
The metadata a policy needs goes to the sidecar (:mod:`cdi.nvidia.sidecar`), and into
``nri-cdi/*`` annotations only where ``--cdi-version`` allows 0.6.0: annotations would
raise the spec's ``cdiVersion`` past what containerd 1.7 reads. The fingerprint hashes
what makes a spec go stale: the driver version, the device-node majors, the GPU and MIG
layout, the driver's files, the generator version and the options.
"""

import json
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from hashlib import sha256
from types import MappingProxyType
from typing import Any, NamedTuple

from cdi.edits import merge
from cdi.hooks import entry as hook_entry
from cdi.libpath import EXTRA_LIBRARY_PATH_ENV
from cdi.model import ContainerEdits, DeviceData, DeviceNode, Hook, Mount, SpecData
from cdi.nvidia.discover import Gpu, MigDevice, NodeInfo, Roots, listdir
from cdi.nvidia.driver import (
    DEVICE_NODE_OPTIONS,
    DeviceNodeInfo,
    DeviceNodes,
    DriverFiles,
    FileMount,
    Link,
    capability_of,
    gpu_nodes,
    management_nodes,
    read_mig_minors,
    stat_device_node,
)
from cdi.nvidia.hook_programs import NVIDIA_HOOK_PROGRAMS
from cdi.version import minimum_requirement, version_key

# Keep in step with pyproject.toml (a test checks); importlib.metadata would cost start-up.
GENERATOR_VERSION = "0.1.0"
# Hooks emitted by default in hooks mode, as nvidia-ctk does; the other two names are
# accepted by --disable-hook and refused by --enable-hook (cdi.nvidia.cli says why).
DEFAULT_HOOKS = frozenset({"create-symlinks", "enable-cuda-compat", "update-ldcache",
                           "disable-device-node-modification"})
# The generator's own spec and device annotations (nri-cdi/fingerprint, ...); not CDI's
# cdi.k8s.io/ request annotations (cdi.annotations.ANNOTATION_PREFIX).
GENERATOR_ANNOTATION_PREFIX = "nri-cdi/"
ANNOTATIONS_SINCE = "0.6.0"
GIDS_SINCE = "0.7.0"
METADATA_FORMAT = 1
Step = tuple[str, list[str]]  # a hook operation and its arguments


class GenerateError(Exception):
    """The spec cannot be generated as asked; the message says why."""


class Options(NamedTuple):
    vendor: str = "nvidia.com"
    class_: str = "gpu"
    strategies: tuple[str, ...] = ("index", "uuid")
    device_ids: tuple[str, ...] = ("all",)
    all_device: bool = True
    link_mode: str = "hooks"  # hooks | mounts
    hook_path: str = ""  # "" = cdi.hooks.entry.isolated_python
    hooks: frozenset[str] = DEFAULT_HOOKS
    ldconfig_path: str | None = None
    max_version: str | None = None  # --cdi-version
    # additionalGids for device nodes a non-root process could not open otherwise (the
    # nodes' own groups), as nvidia-ctk adds them; needs cdiVersion 0.7.0.
    additional_gids: bool = True
    feature_flags: frozenset[str] = frozenset()
    debug: bool = False  # NVIDIA hook programs get NVIDIA_CTK_DEBUG=<debug>
    # CSV mode on an Orin: where CUDA images keep the forward-compatibility libraries
    # (enable-cuda-compat's --cuda-compat-container-root); None: the hook's default.
    compat_container_root: str | None = None

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.class_}"

    @property
    def annotations(self) -> bool:
        return self.max_version is not None and (
            version_key(self.max_version) >= version_key(ANNOTATIONS_SINCE))

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "strategies": list(self.strategies),
                "device_ids": list(self.device_ids), "all_device": self.all_device,
                "link_mode": self.link_mode, "hook_path": self.hook_path,
                "hooks": sorted(self.hooks), "ldconfig_path": self.ldconfig_path,
                "max_version": self.max_version, "additional_gids": self.additional_gids,
                "feature_flags": sorted(self.feature_flags),
                **({"compat_container_root": self.compat_container_root}
                   if self.compat_container_root else {})}


class Inventory(NamedTuple):
    """Everything read from the node: the one input of ``build_spec``."""

    node: NodeInfo
    driver: DriverFiles
    gpu_nodes: Mapping[int, DeviceNodes] = MappingProxyType({})
    mig_nodes: Mapping[tuple[int, int], DeviceNodes] = MappingProxyType({})
    management_nodes: tuple[DeviceNodeInfo, ...] = ()
    # Nodes that belong to no device, for the sidecar only (the plugin gives them on
    # request): migConfig, migMonitor, imexChannel<N>.
    extra_nodes: Mapping[str, DeviceNodeInfo] = MappingProxyType({})
    proc_driver: str = ""  # host path of the driver's procfs folder (for mask-proc)


# --- collect (reads the node) ---------------------------------------------------------------


IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"


def _extra_nodes(roots: Roots, minors: dict[str, str] | None) -> dict[str, DeviceNodeInfo]:
    """The MIG config/monitor capability nodes (``config``/``monitor`` in mig-minors) and
    the IMEX channel nodes that exist on the node."""
    found: dict[str, DeviceNodeInfo | None] = {}
    for key, name in (("config", "migConfig"), ("monitor", "migMonitor")):
        if minors is not None and key in minors:
            found[name] = stat_device_node(roots, f"/dev/nvidia-caps/nvidia-cap{int(minors[key])}")
    for entry in listdir(roots.dev_path(IMEX_CHANNEL_DIR)):
        if entry.startswith("channel") and entry[7:].isdigit():
            found[f"imexChannel{int(entry[7:])}"] = stat_device_node(
                roots, f"{IMEX_CHANNEL_DIR}/{entry}")
    return {k: v for k, v in sorted(found.items()) if v is not None}


def collect(roots: Roots, node: NodeInfo, driver: DriverFiles) -> Inventory:
    if node.mode == "management":
        return Inventory(node=node, driver=driver, management_nodes=management_nodes(roots))
    gpus = {g.index: gpu_nodes(roots, g.minor, g.bus_id) for g in node.gpus}
    migs: dict[tuple[int, int], DeviceNodes] = {}
    minors = read_mig_minors(roots)
    extra = MappingProxyType(_extra_nodes(roots, minors))
    if any(g.mig_devices for g in node.gpus):
        if minors is None:
            raise GenerateError(
                f"MIG devices found but {roots.proc_path('driver/nvidia-caps/mig-minors')} "
                "is missing, so their capability device nodes cannot be named")
        for gpu in node.gpus:
            for mig in gpu.mig_devices:
                migs[gpu.index, mig.index] = _mig_nodes(roots, gpu, mig, minors, gpus[gpu.index])
    return Inventory(node=node, driver=driver, gpu_nodes=gpus, mig_nodes=migs,
                     extra_nodes=extra, proc_driver=str(roots.proc_path("driver/nvidia")))


def _mig_nodes(roots: Roots, gpu: Gpu, mig: MigDevice, minors: dict[str, str],
               parent: DeviceNodes) -> DeviceNodes:
    nodes = [n for n in parent.nodes if n.path == f"/dev/nvidia{gpu.minor}"]
    # The GPU instance's and the compute instance's capability nodes.
    instance = f"gpu{gpu.minor}/gi{mig.gi}"
    keys = (f"{instance}/access", f"{instance}/ci{mig.ci}/access")
    if missing := [key for key in keys if key not in minors]:
        raise GenerateError(f"GPU {gpu.index} MIG gi{mig.gi}/ci{mig.ci}: no {missing[0]!r} "
                            f"entry in {roots.proc_path('driver/nvidia-caps/mig-minors')}")
    for key in keys:
        path = f"/dev/nvidia-caps/nvidia-cap{int(minors[key])}"
        found = stat_device_node(roots, path)
        if found is None:
            raise GenerateError(f"GPU {gpu.index} MIG {mig.index}: {roots.dev_path(path)} is "
                                "not a character device (run nvidia-smi to create it)")
        nodes.append(found)
    if not mig.gfx:
        return DeviceNodes(nodes=tuple(nodes))
    drm = [n for n in parent.nodes if n.path.startswith("/dev/dri/")]
    return DeviceNodes(nodes=(*nodes, *drm), links=parent.links)


# --- edits ----------------------------------------------------------------------------------


def _device_node(n: DeviceNodeInfo) -> DeviceNode:
    return DeviceNode(path=n.path, host_path=n.host if n.host != n.path else None, type=n.type,
                      major=n.major, minor=n.minor, file_mode=n.mode, permissions="rwm",
                      gid=n.gid or None)


def _mount(m: FileMount) -> Mount:
    return Mount(host_path=m.host, container_path=m.path, options=m.options)


def _hook(opts: Options, steps: Sequence[Step]) -> tuple[Hook, ...]:
    """One hook entry running every operation in ``steps``, in order, in one process: a
    hook is an interpreter start per container, which costs more than the work itself
    (cdi.hooks.cli), so a container gets one entry, not one per operation or device.
    NVIDIA's hook programs take one operation each: one entry per step, as nvidia-ctk writes."""
    if not steps:
        return ()
    words = [w for name, args in steps for w in (name, *args)]
    # An explicit env: a hook entry without one inherits the container's environment
    # (LD_PRELOAD and PYTHON* from the image: CVE-2025-23266). The hook re-executes
    # itself with an isolated interpreter before it reads anything (cdi.hooks.entry).
    program = os.path.basename(opts.hook_path)
    if program in NVIDIA_HOOK_PROGRAMS:  # they run one hook per entry
        return tuple(_nvidia_hook(opts, program, name, args) for name, args in steps)
    if program == "nri-cdi-hook":
        command = hook_entry.launcher(opts.hook_path, words[0], words[1:])
    elif opts.hook_path:
        command = hook_entry.nri_cdi(opts.hook_path, words[0], words[1:])
    else:
        command = hook_entry.isolated_python(words[0], words[1:])
    return (Hook(hook_name="createContainer", path=command.path, args=command.args,
                 env=command.env),)


def _nvidia_hook(opts: Options, program: str, name: str, args: Iterable[str]) -> Hook:
    """NVIDIA's hook programs, written as nvidia-ctk writes them: ``[nvidia-cdi-hook, NAME,
    ...]`` or ``[nvidia-ctk, hook, NAME, ...]``, env ``NVIDIA_CTK_DEBUG=false``."""
    prefix = (program, "hook") if program == "nvidia-ctk" else (program,)
    return Hook(hook_name="createContainer", path=opts.hook_path, args=(*prefix, name, *args),
                env=(f"NVIDIA_CTK_DEBUG={'true' if opts.debug else 'false'}",))


def _nvidia_program(opts: Options) -> bool:
    return os.path.basename(opts.hook_path) in NVIDIA_HOOK_PROGRAMS


def _step(opts: Options, name: str, args: list[str]) -> list[Step]:
    """The hook operation ``name`` where the spec runs it: the ones acting in the container
    root by links and the ld cache run in link mode ``hooks`` only."""
    return [(name, args)] if name in opts.hooks and opts.link_mode == "hooks" else []


def _symlink_step(opts: Options, links: Sequence[Link],
                  device_links: Sequence[tuple[str, Link]] = ()) -> list[Step]:
    args = [w for link in links for w in ("--link", f"{link.target}::{link.path}")]
    args += [w for device, link in device_links
             for w in ("--device-link", f"{device}::{link.target}::{link.path}")]
    return _step(opts, "create-symlinks", args) if args else []


def _ldcache_step(opts: Options, folders: Sequence[str]) -> list[Step]:
    args = ["--ldconfig-path", opts.ldconfig_path] if opts.ldconfig_path else []
    args += [w for folder in folders for w in ("--folder", folder)]
    return _step(opts, "update-ldcache", args) if folders else []


def device_links(nodes: DeviceNodes) -> list[tuple[str, Link]]:
    """A device's ``/dev/dri/by-path`` links, each with the device node it belongs to: the
    common hook makes a link only when the container has that node (``--device-link``),
    so the devices need no hook entry of their own."""
    paths = [n.path for n in nodes.nodes]
    return [(node if (node := _link_end(link)) in paths else paths[0], link)
            for link in nodes.links]


def _link_end(link: Link) -> str:
    return posixpath.normpath(posixpath.join(posixpath.dirname(link.path), link.target))


def _compat_step(opts: Options, node: NodeInfo, version: str) -> list[Step]:
    """Before update-ldcache, which puts the folder it chooses first (nvidia-ctk's order:
    create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification).
    The host's driver version; in CSV mode its CUDA version instead (a Tegra driver's
    version says nothing of CUDA), and no hook where no NVML told it, as nvidia-ctk does."""
    if node.mode == "csv":
        if not node.cuda_version:
            return []
        args = [f"--host-cuda-version={node.cuda_version}"]
    else:
        args = [f"--host-driver-version={version}"] if version and "*" not in version else []
    if opts.compat_container_root:
        args.append(f"--cuda-compat-container-root={opts.compat_container_root}")
    return _step(opts, "enable-cuda-compat", args)


def common_edits(driver: DriverFiles, opts: Options, devices: Sequence[tuple[str, Link]],
                 node: NodeInfo) -> ContainerEdits:
    """The spec-wide edits; ``devices``: every device's links (see :func:`device_links`).
    ``node`` says what the compat hook is told; CSV mode names no libcuda folder (Tegra's
    is whatever the CSV files list, and nvidia-ctk leaves the variable out there too)."""
    csv = node.mode == "csv"
    # As nvidia-ctk: the folders of libcuda (not vdpau's), every library folder without one.
    cuda_dirs = [d for d in driver.lib_dirs if any(
        m.path.startswith(f"{d}/libcuda.so") and "/" not in m.path[len(d) + 1:]
        for m in driver.libraries)]
    env = [f"NVIDIA_CTK_LIBCUDA_DIR={':'.join(cuda_dirs or driver.lib_dirs)}"] \
        if driver.lib_dirs and not csv else []
    if opts.link_mode == "mounts" and driver.lib_dirs:
        # With --link-mode mounts no ldcache hook runs, so the driver's library folders
        # are handed over in EXTRA_LIBRARY_PATH_ENV instead.  It is deliberately not
        # LD_LIBRARY_PATH: a CDI env entry replaces the image's value, and the NRI plugin
        # appends this one to the image's LD_LIBRARY_PATH instead (cdi.libpath).
        env.append(f"{EXTRA_LIBRARY_PATH_ENV}={':'.join(driver.lib_dirs)}")
    env.append("NVIDIA_VISIBLE_DEVICES=void")
    link_ends = [k.resolved for k in driver.links if k.resolved is not None] \
        if opts.link_mode == "mounts" else []
    steps = [*_symlink_step(opts, driver.links, devices),
             *_compat_step(opts, node, driver.version),
             *_ldcache_step(opts, (*driver.lib_dirs, *driver.lib32_dirs))]
    # Also in mounts mode when asked for (it mounts, writes nothing in the root); the CLI
    # leaves it out of that mode's defaults, which run no hook at all.
    if "disable-device-node-modification" in opts.hooks:
        steps.append(("disable-device-node-modification", []))
    return ContainerEdits(
        env=tuple(env),
        device_nodes=tuple(_device_node(n) for n in driver.control_nodes),
        mounts=tuple(_mount(m) for m in (*driver.mounts(), *link_ends)),
        hooks=_hook(opts, steps),
        additional_gids=_gids(opts, driver.control_nodes),
    )


def needs_group(n: DeviceNodeInfo) -> bool:
    """A node only its group (not everyone) may read and write, e.g. a 0660 root:render
    ``/dev/dri/renderD128``: a non-root process opens it only as a member of that group."""
    return n.gid != 0 and (n.mode & 0o006) != 0o006


def _gids(opts: Options, nodes: Iterable[DeviceNodeInfo]) -> tuple[int, ...]:
    if not opts.additional_gids:
        return ()
    return tuple(sorted({n.gid for n in nodes if needs_group(n)}))


def device_edits(nodes: DeviceNodes, opts: Options) -> ContainerEdits:
    """A device's own edits: its nodes; its links are made by the common hook, except for
    NVIDIA's hook programs, which know no ``--device-link``: there the device has its own
    create-symlinks entry, as nvidia-ctk writes it. Also the groups its nodes need."""
    hooks = _hook(opts, _symlink_step(opts, nodes.links)) if _nvidia_program(opts) else ()
    return ContainerEdits(device_nodes=tuple(_device_node(n) for n in nodes.nodes),
                          mounts=_by_path_mounts(nodes, opts),
                          hooks=hooks, additional_gids=_gids(opts, nodes.nodes))


def _by_path_mounts(nodes: DeviceNodes, opts: Options) -> tuple[Mount, ...]:
    """Link mode ``mounts`` runs no hook to make the ``/dev/dri/by-path`` links, by which
    applications pick a GPU by PCI address: each link's node is bind-mounted at the
    link's name instead. A mount, not a device node of its own: a runtime gives every
    device node a cgroup rule, and the node's own entry already carries this one."""
    if opts.link_mode != "mounts":
        return ()
    by_path = {n.path: n for n in nodes.nodes}
    return tuple(Mount(host_path=by_path[node].host, container_path=link.path,
                       options=DEVICE_NODE_OPTIONS)
                 for link in nodes.links if (node := _link_end(link)) in by_path)


# --- simplification -------------------------------------------------------------------------


def _depth_key(path: str) -> tuple[int, str]:
    return path.rstrip("/").count("/"), path


# The fields a device's edits lose where the spec-wide edits carry the same entries.
_REDUCED = ("env", "device_nodes", "mounts", "hooks")


def _simplify(edits: ContainerEdits, common: ContainerEdits | None = None) -> ContainerEdits:
    """De-duplicate, drop what the common edits already carry (unless that empties it),
    and order nodes and mounts by path depth, then path; hooks and env keep their order."""
    kept = [tuple(dict.fromkeys(getattr(edits, f))) for f in _REDUCED]
    if common is not None:
        reduced = [tuple(x for x in xs if x not in getattr(common, f))
                   for f, xs in zip(_REDUCED, kept, strict=True)]
        if any(reduced):
            kept = reduced
    env, nodes, mounts, hooks = kept
    return ContainerEdits(
        env=env,
        device_nodes=tuple(sorted(nodes, key=lambda n: _depth_key(n.path))),
        mounts=tuple(sorted(mounts, key=lambda m: _depth_key(m.container_path))),
        hooks=hooks,
        intel_rdt=edits.intel_rdt,
        additional_gids=tuple(sorted(set(edits.additional_gids))),
        net_devices=tuple(dict.fromkeys(edits.net_devices)),
    )


def all_device_edits(devices: Iterable[DeviceData], common: ContainerEdits) -> ContainerEdits:
    """The "all" device's edits: every device's, merged as a runtime merges them (every
    field, intelRdt last-one-wins), then simplified against the spec's."""
    return _simplify(merge(d.container_edits for d in devices), common)


# --- devices --------------------------------------------------------------------------------


class _Target(NamedTuple):
    """One GPU or MIG device to expose, before it gets its names."""

    gpu: Gpu
    mig: MigDevice | None
    nodes: DeviceNodes

    def name(self, strategy: str) -> str | None:
        g, m = self.gpu, self.mig
        if m is not None and not m.indexed:  # procfs: name the slice, not a guessed index
            slot = f"{g.index}:gi{m.gi}-ci{m.ci}"
            return None if strategy == "uuid" else slot if strategy == "index" else f"mig{slot}"
        if strategy == "index":
            return str(g.index) if m is None else f"{g.index}:{m.index}"
        if strategy == "type-index":
            return f"gpu{g.index}" if m is None else f"mig{g.index}:{m.index}"
        # None: procfs knows no MIG UUIDs, CSV mode no UUID at all
        return (g.uuid or None) if m is None else m.uuid

    def matches(self, wanted: str) -> bool:
        ids = {self.name("index"), self.name("uuid")}
        return wanted in ids or wanted.lower() in {i.lower() for i in ids if i}


def _select(inv: Inventory, ids: Sequence[str]) -> list[_Target]:
    """``all``: every GPU not in MIG mode, then every MIG device; else the named ones
    (an index, ``i:j`` or a UUID; a GPU in MIG mode only when named)."""
    gpus = [_Target(gpu=g, mig=None, nodes=inv.gpu_nodes[g.index]) for g in inv.node.gpus
            if "all" not in ids or not g.mig_enabled]
    everything = gpus + [_Target(gpu=g, mig=m, nodes=inv.mig_nodes[g.index, m.index])
                         for g in inv.node.gpus for m in g.mig_devices]
    if "all" in ids:
        return everything
    chosen: list[_Target] = []
    for wanted in ids:
        hits = [t for t in everything if t.matches(wanted)]
        if not hits:
            raise GenerateError(f"--device-id {wanted!r}: no such GPU or MIG device "
                                "(want an index, i:j, or a GPU-/MIG- UUID)")
        chosen += [t for t in hits if t not in chosen]
    return chosen


def _device_annotations(inv: Inventory, target: _Target | None) -> dict[str, str]:
    node = inv.node
    values = {"driver-version": node.driver_version, "cuda-version": node.cuda_version}
    if target is not None:
        values |= {"arch": target.gpu.compute_capability, "brand": target.gpu.brand,
                   "gpu-uuid": target.gpu.uuid}
        if target.mig is not None:
            values |= {"mig-uuid": target.mig.uuid, "mig-profile": target.mig.profile}
    return {GENERATOR_ANNOTATION_PREFIX + k: v for k, v in values.items() if v}


def _devices(inv: Inventory, opts: Options, common: ContainerEdits,
             warn: Callable[[str], None]) -> list[DeviceData]:
    devices = []
    unnamed: list[str] = []
    for target in _select(inv, opts.device_ids):
        edits = _simplify(device_edits(target.nodes, opts), common)
        notes = _device_annotations(inv, target) if opts.annotations else {}
        names = [target.name(s) for s in opts.strategies]
        if target.mig is None and not any(names):
            raise GenerateError(
                f"GPU {target.gpu.index}: {inv.node.mode} mode knows no UUID, so --device-"
                f"name-strategy {','.join(opts.strategies)} gives it no name; add index or "
                "type-index")
        if target.mig is not None and None in names:
            unnamed.append(str(target.name("index")))
        devices += [DeviceData(name=n, annotations=MappingProxyType(notes), container_edits=edits)
                    for n in names if n is not None]
    if unnamed:
        warn(f"{inv.node.mode} mode knows no MIG UUIDs: MIG devices {', '.join(unnamed)} "
             "have no uuid names (use --mode nvml for them)")
    if any(not m.indexed for g in inv.node.gpus for m in g.mig_devices):
        warn(f"{inv.node.mode} mode cannot tell NVML's MIG device indices or profiles: MIG "
             "devices are named <gpu>:gi<G>-ci<C> rather than i:j, and graphics (+gfx) "
             "instances get no DRM nodes (use --mode nvml for i:j names and DRM nodes)")
    return devices


# --- the spec -------------------------------------------------------------------------------


def build_spec(inv: Inventory, opts: Options, *, warn: Callable[[str], None] = lambda s: None,
               spec_annotations: Mapping[str, str] | None = None) -> SpecData:
    """The spec for ``inv``; GenerateError when the content needs a newer cdiVersion than
    ``opts.max_version`` allows."""
    opts = _gid_policy(inv, opts, warn)
    links = [] if inv.node.mode == "management" or opts.device_ids == ("none",) \
        or _nvidia_program(opts) else [
        dl for t in _select(inv, opts.device_ids) for dl in device_links(t.nodes)]
    common = _simplify(common_edits(inv.driver, opts, list(dict.fromkeys(links)), inv.node))
    # The "all" device's annotations, which management mode's one device has too.
    notes = MappingProxyType(_device_annotations(inv, None) if opts.annotations else {})
    if inv.node.mode == "management":
        edits = _simplify(ContainerEdits(
            device_nodes=tuple(_device_node(n) for n in inv.management_nodes)), common)
        if edits.is_empty():
            raise GenerateError("management mode: no /dev/nvidia* device nodes found")
        devices = [DeviceData(name="all", annotations=notes, container_edits=edits)]
    elif opts.device_ids == ("none",):
        devices = [DeviceData(name="none",
                              container_edits=ContainerEdits(env=("NVCT_EMPTY_DEVICE=",)))]
    else:
        devices = _devices(inv, opts, common, warn)
        if not devices:
            raise GenerateError(f"no GPUs found in {inv.node.mode} mode, so no devices to "
                                "write (use --device-id none for a driver-only spec)")
        if opts.all_device and not any(d.name == "all" for d in devices):
            edits = all_device_edits(devices, common)
            devices.append(DeviceData(name="all", annotations=notes, container_edits=edits))
    annotations = dict(spec_annotations or {}) if opts.annotations else {}
    spec = SpecData(cdi_version="0.3.0", kind=opts.kind,
                    devices=tuple(sorted(devices, key=lambda d: d.name)),
                    annotations=MappingProxyType(annotations), container_edits=common)
    return _with_version(spec, opts.max_version)


def _gid_policy(inv: Inventory, opts: Options, warn: Callable[[str], None]) -> Options:
    """additionalGids need cdiVersion 0.7.0: below that they are left out, with a warning
    naming the nodes a non-root container then cannot open."""
    if not opts.additional_gids or opts.max_version is None or (
            version_key(opts.max_version) >= version_key(GIDS_SINCE)):
        return opts
    grouped = sorted({n.path for n in _all_nodes(inv) if needs_group(n)})
    if grouped:
        warn(f"additionalGids left out (--cdi-version {opts.max_version} < {GIDS_SINCE}): "
             f"only root or members of their groups can open {', '.join(grouped)}")
    return opts._replace(additional_gids=False)


def _with_version(spec: SpecData, maximum: str | None) -> SpecData:
    need = minimum_requirement(spec)
    version = need.version if need else "0.3.0"
    if maximum is not None and need is not None and version_key(version) > version_key(maximum):
        raise GenerateError(
            f"the spec needs cdiVersion {version} ({need.path}: {need.feature}), more than "
            f"--cdi-version {maximum} allows; use --device-name-strategy uuid or type-index "
            "(no digit-leading names) and --dev-root / (no hostPath), or raise --cdi-version")
    return spec._replace(cdi_version=version)


def capability_files(driver: DriverFiles) -> dict[str, list[str]]:
    """The driver's files by the driver capability they serve (``other``: none), each by
    its host path: a consumer filtering a spec's mounts knows a file by what it mounts,
    whichever container path (a link name, in a hook-free spec) it is mounted at."""
    out: dict[str, list[str]] = {}
    lib32 = tuple(f"{d}/" for d in driver.lib32_dirs)
    for m in (*driver.libraries, *driver.binaries):
        # The i386 libraries are compat32's, whatever they serve (as libnvidia-container).
        cap = "compat32" if lib32 and m.path.startswith(lib32) else (
            capability_of(m.path.rsplit("/", 1)[-1]) or "other")
        out.setdefault(cap, []).append(m.host)
    for m in driver.configs:
        out.setdefault(config_capability(m.path), []).append(m.host)
    return {k: sorted(set(v)) for k, v in sorted(out.items())}


def config_capability(path: str) -> str:
    """The capability a driver configuration file serves, by its container path: the
    OpenCL ICD is compute's; the Vulkan, EGL and GLVND files and OptiX's data are
    graphics'; the X server's configuration is display's."""
    if path.endswith("/OpenCL/vendors/nvidia.icd"):
        return "compute"
    if "/X11/" in path:
        return "display"
    if any(part in path for part in ("/vulkan/", "/glvnd/", "/egl/", "/nvoptix.bin")):
        return "graphics"
    return "other"


def _capabilities(inv: Inventory) -> dict[str, list[str]]:
    """The files by capability, none in CSV mode: a Jetson container gets every file its
    board lists, whatever NVIDIA_DRIVER_CAPABILITIES says (as with nvidia-ctk's CSV mode,
    and the plugin filters by this table)."""
    return {} if inv.node.mode == "csv" else capability_files(inv.driver)


def spec_annotations(inv: Inventory, fp: str) -> dict[str, str]:
    notes = {GENERATOR_ANNOTATION_PREFIX + "fingerprint": fp,
             GENERATOR_ANNOTATION_PREFIX + "generator": f"nri-cdi {GENERATOR_VERSION}"}
    for cap, paths in _capabilities(inv).items():
        notes[f"{GENERATOR_ANNOTATION_PREFIX}libraries.{cap}"] = ",".join(paths)
    return notes


# --- fingerprint and metadata ---------------------------------------------------------------


def _all_nodes(inv: Inventory) -> Iterable[DeviceNodeInfo]:
    yield from inv.driver.control_nodes
    yield from inv.management_nodes
    for group in (*inv.gpu_nodes.values(), *inv.mig_nodes.values()):
        yield from group.nodes


def fingerprint(inv: Inventory, opts: Options) -> str:
    node = inv.node
    layout = [[g.index, g.uuid, g.minor, g.bus_id, g.mig_enabled,
               [[m.index, m.gi, m.ci, m.uuid, m.profile] for m in g.mig_devices]]
              for g in node.gpus]
    files = sorted(m.host for m in inv.driver.mounts())
    data = {
        "generator": GENERATOR_VERSION,
        "driver": node.driver_version,
        "majors": sorted({n.path: n.major for n in _all_nodes(inv)}.items()),
        "layout": layout,
        "files": sha256("\n".join(files).encode()).hexdigest(),
        "options": opts.as_dict(),
        "mode": node.mode,
    }
    if node.mode == "csv":  # a CSV file's sym lines change the links alone
        data["links"] = sorted(f"{k.target}::{k.path}" for k in inv.driver.links)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + str(sha256(text.encode()).hexdigest())


def _device_meta(target: _Target) -> dict[str, Any]:
    g, m = target.gpu, target.mig
    meta: dict[str, Any] = {"type": "gpu" if m is None else "mig", "gpuIndex": g.index,
                            "gpuUuid": g.uuid, "minor": g.minor, "busId": g.bus_id,
                            "model": g.name, "arch": g.compute_capability, "brand": g.brand}
    if m is not None:
        meta |= {"migIndex": m.index if m.indexed else None, "migUuid": m.uuid, "gi": m.gi,
                 "ci": m.ci, "profile": m.profile}
    return meta


def metadata(inv: Inventory, opts: Options, spec: SpecData, *, fp: str,
             written: tuple[str, str] | None) -> dict[str, Any]:
    """The sidecar document: what a requirement/capability policy needs per device.
    ``written``: the spec file's name and sha256 (None: the spec went to no file)."""
    spec_file, spec_sha256 = written if written is not None else (None, None)
    devices = {} if inv.node.mode == "management" or opts.device_ids == ("none",) else {
        name: _device_meta(target) for target in _select(inv, opts.device_ids)
        for name in map(target.name, opts.strategies) if name is not None}
    return {
        "format": METADATA_FORMAT,
        "generator": f"nri-cdi {GENERATOR_VERSION}",
        "mode": inv.node.mode,
        "fingerprint": fp,
        "spec": {"file": spec_file, "sha256": spec_sha256, "kind": spec.kind,
                 "cdiVersion": spec.cdi_version},
        "driver": {"version": inv.node.driver_version, "cudaVersion": inv.node.cuda_version,
                   "libraryDirs": list(inv.driver.lib_dirs)},
        "capabilities": _capabilities(inv),
        "devices": dict(sorted(devices.items())),
        "nodes": _extra_meta(inv.extra_nodes),
        "procMask": _proc_mask_meta(inv, opts),
    }


def _proc_mask_meta(inv: Inventory, opts: Options) -> dict[str, Any] | None:
    """How the plugin starts ``mask-proc`` for a container (it adds ``--gpu`` per GPU)."""
    if not inv.proc_driver:
        return None
    (hook,) = _hook(opts, [("mask-proc", ["--proc-root", inv.proc_driver])])
    return {"procRoot": inv.proc_driver,
            "hook": {"path": hook.path, "args": list(hook.args), "env": list(hook.env)}}


def _extra_meta(nodes: Mapping[str, DeviceNodeInfo]) -> dict[str, Any]:
    """Sidecar ``nodes``: ``migConfig``, ``migMonitor``, ``imexChannels`` by number."""
    def one(n: DeviceNodeInfo) -> dict[str, Any]:
        return {"path": n.path, "hostPath": n.host if n.host != n.path else None,
                "major": n.major, "minor": n.minor, "fileMode": n.mode, "gid": n.gid}

    out: dict[str, Any] = {k: one(v) for k, v in nodes.items() if k.startswith("mig")}
    imex = {k[len("imexChannel"):]: one(v) for k, v in nodes.items() if k.startswith("imex")}
    if imex:
        out["imexChannels"] = dict(sorted(imex.items(), key=lambda kv: int(kv[0])))
    return out
