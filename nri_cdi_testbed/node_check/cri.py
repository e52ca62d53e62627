"""A small CRI v1 client (the calls kubelet makes), over grpcio, with the CRI messages
compiled at install time.

The messages come from the cache folder (``scripts/install-containerd.sh`` compiles the CRI
api.proto there, messages only); they are imported as ``cri_api_v1`` so that no local module
shadows them. The two services' client stubs are made here from the proto's service
descriptors (:class:`ServiceStub`): the ``*_pb2_grpc`` module grpcio-tools would generate
refuses to load under a grpcio older than the grpcio-tools that made it
(``GRPC_GENERATED_VERSION``), which broke ``doctor --e2e`` on a node whose grpcio was older.
Pods are host-network (no CNI needed) and have no hostname (runc refuses one without a
private UTS namespace).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from nri_cdi_testbed.node_check import paths
from nri_cdi_testbed.waiting import DEFAULT_TIMEOUT, WaitTimeout, wait_until


def load_messages() -> ModuleType:
    """CRI v1's api_pb2, from the install script's cache folder."""
    gen = str(paths.cri_gen_dir())
    if gen not in sys.path:
        sys.path.append(gen)
    return importlib.import_module(f"{paths.CRI_PACKAGE}.api_pb2")


class ServiceStub:
    """A client of one service of the CRI proto: an attribute per unary method, made from
    the service's descriptor with grpcio's own channel API."""

    def __init__(self, channel: Any, messages: ModuleType, service: str,
                 watch: SlowCallWatch | None = None) -> None:
        descriptor = messages.DESCRIPTOR.services_by_name[service]
        for method in descriptor.methods:
            if method.client_streaming or method.server_streaming:
                continue  # GetContainerEvents: no test or check here listens to events
            # The CRI's requests and replies are all top-level messages of the module.
            response = getattr(messages, method.output_type.name)
            call = channel.unary_unary(
                f"/{descriptor.full_name}/{method.name}",
                request_serializer=_serialize, response_deserializer=response.FromString)
            setattr(self, method.name, call if watch is None else watch.wrap(method.name, call))


@dataclass(frozen=True)
class SlowCallWatch:
    """Calls ``on_slow(method)`` on a timer thread when a call is still waiting after
    ``after`` seconds, once per call: what the runtime's processes wait on can then be
    read while they still wait (at the call's own deadline the runtime kills a hung
    child, and with it the evidence)."""

    after: float
    on_slow: Callable[[str], None]

    def wrap(self, method: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def watched(request: Any, **kwargs: Any) -> Any:
            timer = threading.Timer(self.after, self.on_slow, (method,))
            timer.daemon = True
            timer.start()
            try:
                return call(request, **kwargs)
            finally:
                timer.cancel()

        return watched


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


class CriClient:
    """Blocking CRI RuntimeService client on a unix socket."""

    def __init__(self, address: str, timeout: float = 30.0, *,
                 watch: SlowCallWatch | None = None) -> None:
        """``watch``: what to do about a call still waiting after a while (none: nothing)."""
        import grpc  # here: grpcio is an extra (e2e); 21-25 ms of `doctor` (-X importtime)

        self.pb = load_messages()
        self.address = address
        self.timeout = timeout
        # grpc itself, for callers that tell errors apart (RpcError, StatusCode).
        self.grpc = grpc
        # Short reconnect back-off: after containerd restarts (a stale socket answers
        # "connection refused" until the new daemon listens) gRPC's default back-off grows
        # to seconds per try, longer than containerd takes to come back. The minimum
        # connect timeout stays gRPC's own: grpc.min_reconnect_backoff_ms sets it too, and
        # set as short as the back-off a busy containerd's first SETTINGS frame came too
        # late ("connection attempt timed out before receiving SETTINGS frame").
        self._channel = grpc.insecure_channel(
            f"unix://{address}", options=[("grpc.enable_http_proxy", 0),
                                          ("grpc.initial_reconnect_backoff_ms", 100),
                                          ("grpc.max_reconnect_backoff_ms", 500)]
        )
        self.runtime: Any = ServiceStub(self._channel, self.pb, "RuntimeService", watch)
        self.images: Any = ServiceStub(self._channel, self.pb, "ImageService", watch)
        # CreateContainer needs the pod's config again: remember it per pod id.
        self._pod_configs: dict[str, Any] = {}
        self._tracking: list[list[str]] = []

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CriClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def has_cdi_devices_field(self) -> bool:
        """Whether this CRI version has ContainerConfig.CDI_devices (CRI >= 1.28)."""
        return "CDI_devices" in self.pb.ContainerConfig.DESCRIPTOR.fields_by_name

    # --- runtime ------------------------------------------------------------------------------

    def version(self) -> Any:
        return self.runtime.Version(self.pb.VersionRequest(), timeout=self.timeout)

    def wait_ready(self, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """The CRI service's Version, once it answers: first the channel is connected
        (gRPC retries a slow first connect itself), then Version is retried until CRI
        answers (containerd serves it a moment after its socket), each for at most
        ``timeout``. Raises WaitTimeout naming what it waited for and the last error or
        channel state seen."""
        ready = self.grpc.channel_ready_future(self._channel)
        try:
            ready.result(timeout=timeout)
        except self.grpc.FutureTimeoutError:
            raise WaitTimeout(f"waited {timeout:g} s for a connection to CRI at "
                              f"{self.address}; last seen: the channel not ready") from None
        finally:
            ready.cancel()

        def version() -> Any:
            # wait_for_ready: a reconnect in between is waited out, not an error.
            return self.runtime.Version(self.pb.VersionRequest(), timeout=timeout,
                                        wait_for_ready=True)

        return wait_until(version, f"CRI at {self.address} to answer Version",
                          timeout=timeout, retry_on=(self.grpc.RpcError,))

    # --- pods ---------------------------------------------------------------------------------

    def pod_config(self, name: str, *, namespace: str = "default",
                   annotations: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None, privileged: bool = False) -> Any:
        pb = self.pb
        ns_options = pb.NamespaceOption(network=pb.NamespaceMode.NODE)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uuid.uuid4().hex,
                                           namespace=namespace, attempt=0),
            annotations=dict(annotations or {}),
            labels=dict(labels or {}),
            linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns_options)
            ),
        )
        config.linux.security_context.privileged = privileged
        return config

    def run_pod(self, name: str, *, namespace: str = "default",
                annotations: Mapping[str, str] | None = None,
                labels: Mapping[str, str] | None = None, privileged: bool = False) -> str:
        """RunPodSandbox for a host-network pod; returns the pod sandbox id."""
        return self.run_sandbox(self.pod_config(name, namespace=namespace,
                                                annotations=annotations, labels=labels,
                                                privileged=privileged))

    def run_sandbox(self, config: Any) -> str:
        """RunPodSandbox for a PodSandboxConfig; returns the pod sandbox id.

        A sandbox that gets no answer before the deadline is asked for once more, as the
        pod's next attempt (``config.metadata.attempt`` goes up by one), the way the kubelet
        tries a pod's sandbox again: a runtime's shim can lose the exit of ``runc create``
        and hang (containerd 2.1.9, ``docs/developer/private-containerd.md``). The retry is
        a RuntimeWarning, never silent; any other error, or a second deadline, is raised."""
        try:
            resp = self.runtime.RunPodSandbox(self.pb.RunPodSandboxRequest(config=config),
                                              timeout=self.timeout)
        except self.grpc.RpcError as exc:
            if exc.code() != self.grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            meta = config.metadata
            meta.attempt += 1
            warnings.warn(f"CRI at {self.address}: RunPodSandbox for pod "
                          f"{meta.namespace}/{meta.name} had no answer within "
                          f"{self.timeout:g} s; asking again as attempt {meta.attempt}, "
                          f"as the kubelet does", RuntimeWarning, stacklevel=2)
            resp = self.runtime.RunPodSandbox(self.pb.RunPodSandboxRequest(config=config),
                                              timeout=self.timeout)
        self._pod_configs[resp.pod_sandbox_id] = config
        if self._tracking:
            self._tracking[-1].append(resp.pod_sandbox_id)
        return str(resp.pod_sandbox_id)

    def stop_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id),
                                    timeout=self.timeout)

    def remove_pod(self, pod_id: str) -> None:
        """RemovePodSandbox (also removes the pod's containers)."""
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id),
                                      timeout=self.timeout)
        self._pod_configs.pop(pod_id, None)

    def delete_pod(self, pod_id: str) -> None:
        self.stop_pod(pod_id)
        self.remove_pod(pod_id)

    def list_pods(self) -> list[Any]:
        return list(self.runtime.ListPodSandbox(self.pb.ListPodSandboxRequest(),
                                                timeout=self.timeout).items)

    @contextlib.contextmanager
    def pod(self, name: str, **kwargs: Any) -> Iterator[str]:
        """A pod (run_pod arguments) that is stopped and removed on exit."""
        pod_id = self.run_pod(name, **kwargs)
        try:
            yield pod_id
        finally:
            self.delete_pod(pod_id)

    @contextlib.contextmanager
    def cleanup(self) -> Iterator[CriClient]:
        """Stops and removes every pod run_pod creates inside the block, even on failure."""
        created: list[str] = []
        self._tracking.append(created)
        try:
            yield self
        finally:
            self._tracking.pop()
            errors = []
            for pod_id in reversed(created):
                try:
                    self.delete_pod(pod_id)
                except self.grpc.RpcError as exc:  # keep cleaning the others
                    errors.append(exc)
            if errors and sys.exc_info()[0] is None:
                raise errors[0]

    # --- containers ---------------------------------------------------------------------------

    def container_config(self, name: str, image: str, *, command: Sequence[str] = (),
                         args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                         annotations: Mapping[str, str] | None = None,
                         labels: Mapping[str, str] | None = None,
                         cdi_devices: Sequence[str] = (), privileged: bool = False,
                         mounts: Mapping[str, str] | None = None,
                         ro_mounts: Mapping[str, str] | None = None,
                         run_as_user: int | None = None) -> Any:
        """``mounts``: container path -> host path (bind mounts, as kubelet makes them);
        ``ro_mounts`` the same, read-only; ``run_as_user``: the uid of the container's
        processes (default: the image's)."""
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=list(command),
            args=list(args),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            annotations=dict(annotations or {}),
            labels=dict(labels or {}),
        )
        if cdi_devices:
            if not self.has_cdi_devices_field:
                raise ValueError("this CRI version has no CDI_devices field")
            config.CDI_devices.extend(pb.CDIDevice(name=d) for d in cdi_devices)
        config.linux.security_context.privileged = privileged
        if run_as_user is not None:
            config.linux.security_context.run_as_user.value = run_as_user
        for container_path, host_path in (mounts or {}).items():
            config.mounts.add(container_path=container_path, host_path=host_path)
        for container_path, host_path in (ro_mounts or {}).items():
            config.mounts.add(container_path=container_path, host_path=host_path, readonly=True)
        return config

    def create_container(self, pod_id: str, name: str, image: str, **kwargs: Any) -> str:
        """CreateContainer in ``pod_id``; kwargs as for container_config. Returns its id."""
        request = self.pb.CreateContainerRequest(
            pod_sandbox_id=pod_id,
            config=self.container_config(name, image, **kwargs),
            sandbox_config=self._pod_configs[pod_id],
        )
        return str(self.runtime.CreateContainer(request, timeout=self.timeout).container_id)

    def start_container(self, container_id: str) -> None:
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=container_id),
                                    timeout=self.timeout)

    def run_container(self, pod_id: str, name: str, image: str, **kwargs: Any) -> str:
        """create_container then start_container."""
        container_id = self.create_container(pod_id, name, image, **kwargs)
        self.start_container(container_id)
        return container_id

    def exec_sync(self, container_id: str, cmd: Sequence[str], timeout: int = 10) -> ExecResult:
        request = self.pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd),
                                          timeout=timeout)
        resp = self.runtime.ExecSync(request, timeout=timeout + self.timeout)
        return ExecResult(resp.exit_code, resp.stdout.decode(errors="replace"),
                          resp.stderr.decode(errors="replace"))

    def container_status(self, container_id: str, verbose: bool = False) -> Any:
        request = self.pb.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        return self.runtime.ContainerStatus(request, timeout=self.timeout)

    def container_info(self, container_id: str) -> dict[str, Any]:
        """containerd's verbose info JSON (``info["info"]``) for the container."""
        info = self.container_status(container_id, verbose=True).info
        return dict(json.loads(info["info"]))

    def runtime_spec(self, container_id: str) -> dict[str, Any]:
        """The final OCI runtime spec that containerd handed to runc."""
        return dict(self.container_info(container_id)["runtimeSpec"])

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        request = self.pb.StopContainerRequest(container_id=container_id, timeout=timeout)
        self.runtime.StopContainer(request, timeout=timeout + self.timeout)

    def remove_container(self, container_id: str) -> None:
        self.runtime.RemoveContainer(
            self.pb.RemoveContainerRequest(container_id=container_id), timeout=self.timeout
        )

    def list_containers(self) -> list[Any]:
        return list(self.runtime.ListContainers(self.pb.ListContainersRequest(),
                                                timeout=self.timeout).containers)
