"""Operations pieces against a real containerd: the launcher that `nri-cdi install-plugin-launcher`
writes, started by containerd itself from its NRI plugin folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_cdi_testbed.waiting import wait_until
from nri_plugin.ops.status import CONNECTED, DISCONNECTED, LAUNCHED_SOCKET, Reading, read_status
from nri_plugin.ops.units import render_launcher
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import REPO, PluginProcess, annotation_policy
from tests.helpers import simple_spec, write_specs

KIND = "ops.example/dev"


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_specs(tmp_path_factory.mktemp("ops") / "cdi",
                       {"ops.yaml": simple_spec(KIND, "a", env="OPS=1")})


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _wait_for(path: Path, text: str) -> str:
    """The log at ``path`` once it says ``text``."""
    return wait_until(lambda: text in (content := _read(path)) and content,
                      f"{path.name} to say {text!r}", seen=lambda: _read(path)[-3000:])


def test_installed_launcher_is_started_by_containerd(
    containerd: ContainerdFactory, specs: Path, tmp_path: Path
) -> None:
    log = tmp_path / "launched.log"
    launcher = tmp_path / "launcher"
    # containerd gives it an empty environment: the launcher must bring everything.
    # (--config is left out until the plugin command reads the configuration file.)
    status_dir = tmp_path / "status"
    policy = tmp_path / "policy.yaml"  # its pods ask by annotation
    policy.write_text(annotation_policy(["*"]))
    launcher.write_text(render_launcher(config=None, log_file=str(log), pythonpath=str(REPO),
                                        extra_args=["--spec-dir", str(specs),
                                                    "--status-dir", str(status_dir),
                                                    "--policy", str(policy)]))
    launcher.chmod(0o755)
    ctrd = containerd(nri_plugins={"10-nri-cdi": launcher})
    _wait_for(log, "connected to containerd")
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("launched", annotations={"cdi.k8s.io/dev": f"{KIND}=a"})
        ctr = cri.run_container(pod, "app", BUSYBOX_IMAGE, command=["sleep", "600"])
        assert "DEV_0=a" in cri.exec_sync(ctr, ["env"]).stdout
    assert "plugin 10-nri-cdi starting" in log.read_text()
    # Launched by the runtime, the plugin's socket is the fd it was given; doctor still
    # confirms the connection, whatever plugin.socket it was told.
    reading = _wait_for_state(status_dir, CONNECTED)
    assert reading.status is not None and reading.status.socket == LAUNCHED_SOCKET
    _, checks = _doctor(ctrd, status_dir, socket="/nowhere.sock")
    assert checks["plugin connected"]["status"] == "ok", checks["plugin connected"]


# --- doctor confirms the plugin without metrics (its status file) -------------------------


def _wait_for_state(status_dir: Path, state: str) -> Reading:
    def reached() -> Reading | None:
        reading = read_status(str(status_dir), "nri-cdi", "10")
        ok = reading.status is not None and reading.status.state == state
        return reading if ok else None

    return wait_until(reached, f"the status file to say {state}",
                      seen=lambda: str(read_status(str(status_dir), "nri-cdi", "10")))


def _doctor(ctrd: Containerd, status_dir: Path, *,
            socket: str | None = None) -> tuple[int, dict[str, dict[str, str]]]:
    """``nri-cdi doctor --json`` as an operator runs it, with metrics off (the default)."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--json", "--no-generate",
         "--config", "/dev/null", "--socket", socket or ctrd.nri_socket,
         "--status-dir", str(status_dir), "--containerd-config", str(ctrd.config_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout, done.stderr
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)}


def test_doctor_confirms_the_plugin_without_metrics(
    containerd: ContainerdFactory, specs: Path, tmp_path: Path
) -> None:
    ctrd = containerd()
    plugin = PluginProcess(ctrd.nri_socket, [specs], tmp_path / "plugin.log").start()
    try:
        _wait_for_state(plugin.status_dir, CONNECTED)
        _, checks = _doctor(ctrd, plugin.status_dir)
        check = checks["plugin connected"]
        assert check["status"] == "ok", check
        assert f"connected to containerd {ctrd.version}." in check["detail"]
        assert plugin.process is not None and f"pid {plugin.process.pid}," in check["detail"]
        assert f"socket {ctrd.nri_socket})" in check["detail"]
        assert "plugin health endpoint" not in checks  # metrics are off

        ctrd.stop_daemon()  # the plugin stays, disconnected, and waits for a new runtime
        _wait_for_state(plugin.status_dir, DISCONNECTED)
        _, checks = _doctor(ctrd, plugin.status_dir)
        check = checks["plugin connected"]
        assert check["status"] == "fail" and "running but not connected" in check["detail"]

        ctrd.start()
        _wait_for_state(plugin.status_dir, CONNECTED)
        assert _doctor(ctrd, plugin.status_dir)[1]["plugin connected"]["status"] == "ok"
    finally:
        plugin.kill()
    _, checks = _doctor(ctrd, plugin.status_dir)
    check = checks["plugin connected"]
    assert check["status"] == "fail", check
    assert "the plugin is not running" in check["detail"] and "was last connected" in \
        check["detail"]


# --- metrics and health, counting real injections ----------------------------------------
# The daemon's wiring of Metrics is mirrored here (the injector's metrics, registry callback,
# on_close), so that the endpoint is tested on the real CreateContainer path.

HARNESS = """\
import asyncio, logging, sys
from cdi.cache import SpecCache
from cdi.watch import AutoRefresh, Timing
from nri_plugin.plugins.cdi_injector.injector import CdiInjector, Wiring
from nri_plugin.plugins.cdi_injector.policy import parse_policy
from nri_plugin.plugins.cdi_injector.vendor import Registry
from nri_plugin.ops.metrics import Metrics
from nri_plugin.plugins.cdi_injector.injector import Counters
from nri_plugin.nri.stub import Stub, StubOptions
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
metrics = Metrics(Counters())
server = metrics.serve("127.0.0.1:0")
print("PORT", server.port, file=sys.stderr, flush=True)
cache = SpecCache([sys.argv[2]])
AutoRefresh(cache, Timing(rescan_interval=3600), on_refresh=metrics.registry).start()
# Its pods ask by annotation in every namespace.
anywhere = parse_policy({"sources": {"podAnnotations": {"namespaces": ["*"]}}})
plugin = CdiInjector(lambda: Registry(cache.snapshot), policy=anywhere,
                     wiring=Wiring(metrics=metrics))
stub = Stub(plugin, StubOptions(name="nri-cdi", idx="10", socket_path=sys.argv[1],
            on_close=lambda stub, error: metrics.disconnected()))
asyncio.run(stub.run())
"""


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _sample(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_start} in:\n{text}")


def test_metrics_and_health_count_real_injections(
    containerd: ContainerdFactory, specs: Path, tmp_path: Path
) -> None:
    import json
    import os
    import subprocess
    import sys

    ctrd = containerd()
    log = tmp_path / "metered.log"
    (tmp_path / "harness.py").write_text(HARNESS)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, str(tmp_path / "harness.py"), ctrd.nri_socket, str(specs)],
            stdout=out, stderr=out, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        text = _wait_for(log, "connected to containerd")
        base = f"http://127.0.0.1:{text.split('PORT ', 1)[1].split()[0]}"
        status, body = _get(base + "/healthz")
        assert status == 200 and json.loads(body)["runtime"].startswith("containerd")
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("m", annotations={"cdi.k8s.io/dev": f"{KIND}=a"})
            cri.run_container(pod, "one", BUSYBOX_IMAGE, command=["sleep", "600"])
            cri.run_container(pod, "two", BUSYBOX_IMAGE, command=["sleep", "600"])
            bad = cri.run_pod("bad", annotations={"cdi.k8s.io/dev": f"{KIND}=nope"})
            with pytest.raises(cri.grpc.RpcError):
                cri.create_container(bad, "app", BUSYBOX_IMAGE, command=["sleep", "600"])
            plain = cri.run_pod("plain")
            cri.run_container(plain, "app", BUSYBOX_IMAGE, command=["sleep", "600"])
        _, metrics = _get(base + "/metrics")
        assert _sample(metrics, 'nri_cdi_injections_total{outcome="injected"}') == 2
        assert _sample(metrics, 'nri_cdi_injections_total{outcome="refused"}') == 1
        assert _sample(metrics, "nri_cdi_injection_seconds_count") == 3  # not the plain one
        assert _sample(metrics, "nri_cdi_registry_devices") == 1
        assert _sample(metrics, "nri_cdi_registry_file_errors") == 0
        assert _sample(metrics, "nri_cdi_connected") == 1
        assert _sample(metrics, "nri_cdi_reconnects_total") == 0

        ctrd.stop_daemon()
        wait_until(lambda: _get(base + "/healthz")[0] == 503,
                   "health to say 503 with containerd down",
                   seen=lambda: _get(base + "/healthz"))
        ctrd.start()
        wait_until(lambda: _get(base + "/healthz")[0] == 200,
                   "health to say 200 with containerd back",
                   seen=lambda: (_get(base + "/healthz"), _read(log)[-2000:]))
        _, metrics = _get(base + "/metrics")
        assert _sample(metrics, "nri_cdi_reconnects_total") == 1
        assert _get(base + "/livez")[0] == 200
    finally:
        process.kill()
        process.wait()


# --- the CRI client and the node's grpcio -------------------------------------------------

OLD_GRPC = """
import sys, grpc
grpc.__version__ = "1.0.0"  # older than the grpcio-tools of any install
sys.path.insert(0, sys.argv[2])
{body}
"""


def test_the_cri_client_works_with_an_older_grpcio(containerd: ContainerdFactory,
                                                   tmp_path: Path) -> None:
    # On a node with grpcio 1.84.0 the CRI stubs made with grpcio-tools 1.85.1 refused to
    # load (GRPC_GENERATED_VERSION): doctor --e2e could not run. The client now makes its
    # stubs from the proto's descriptors; only the messages are compiled.
    import os
    import shutil
    import subprocess
    import sys

    ctrd = containerd()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ours = OLD_GRPC.format(body="from nri_cdi_testbed.node_check.cri import CriClient\n"
                                "with CriClient(sys.argv[1]) as cri:\n"
                                "    print(cri.version().runtime_name)")
    done = subprocess.run([sys.executable, "-c", ours, ctrd.address, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "containerd", done.stderr

    # The control: the module grpcio-tools generates refuses that grpcio.
    pytest.importorskip("grpc_tools")
    from tests.e2e import paths

    package = tmp_path / "cri_api_v1"
    shutil.copytree(paths.cache_dir() / "cri_gen" / "cri_api_v1", package,
                    ignore=shutil.ignore_patterns("*_grpc.py", "__pycache__"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc",
                    f"-I{paths.cache_dir() / 'cri_src'}", f"--grpc_python_out={tmp_path}",
                    "cri_api_v1/api.proto"], check=True, capture_output=True, timeout=120)
    generated = OLD_GRPC.format(body="import cri_api_v1.api_pb2_grpc")
    done = subprocess.run([sys.executable, "-c", generated, ctrd.address, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0 and "grpc package installed is at version 1.0.0" in done.stderr
