"""Fixtures for the end-to-end tests: a private containerd per test module, images loaded.

Every test that uses the ``containerd`` factory runs once per containerd version in
``paths.RUNTIMES`` (1.7 and 2.1; ids ``ctrd1.7``/``ctrd2.1``). A test or module specific to
some versions says so with ``@pytest.mark.containerd_versions("2.1", ...)``: the other
versions are not generated at all (never skipped). ``NRI_CDI_E2E_RUNTIMES=1.7`` narrows a
local run to fewer versions.

Missing prerequisites skip these tests with a reason naming the install script, except when
``CI`` is set: there they fail, because CI must never silently skip the e2e tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.node_check import plugin as plugin_processes
from nri_cdi_testbed.waiting import WaitTimeout
from tests import arm64, prerequisites
from tests.e2e import binfmt, images, paths
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient

E2E_DIR = Path(__file__).parent

# Started containerds, so that a failing test's report shows their log tails.
_LIVE: list[Containerd] = []

ContainerdFactory = Callable[..., Containerd]


def require_prerequisites() -> None:
    """pytest.skip (or pytest.fail under CI) when the e2e tests cannot run here."""
    missing = paths.missing_prerequisites(tuple(paths.runtimes()))
    if not missing:
        return
    prerequisites.missing("e2e tests", f"e2e prerequisites missing ({'; '.join(missing)}); "
                          f"run: bash {paths.INSTALL_SCRIPT}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "containerd_versions(*versions): run this e2e test only on these "
        "containerd versions (keys of tests/e2e/paths.py RUNTIMES)")


def _versions_for(metafunc: pytest.Metafunc) -> list[str]:
    versions = paths.runtimes()
    for mark in metafunc.definition.iter_markers("containerd_versions"):
        unknown = set(mark.args) - set(paths.RUNTIMES)
        if unknown:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: containerd_versions "
                                    f"names unknown versions {sorted(unknown)}")
        versions = [v for v in versions if v in mark.args]
    return versions


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Parametrizes the module-scoped factory (and so every fixture built on it) per version.
    if "containerd" in metafunc.fixturenames:
        versions = _versions_for(metafunc)
        metafunc.parametrize("containerd", versions, indirect=True, scope="module",
                             ids=[f"ctrd{v}" for v in versions])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items: mark only those under tests/e2e.
    for item in items:
        if E2E_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # The plugins of earlier tests that have ended are no business of this test's report.
    plugin_processes.SPAWNED[:] = [p for p in plugin_processes.SPAWNED if p.running]
    for ctrd in _LIVE:
        ctrd.slow_calls.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.passed and report.when == "call":
        _warn_of_slow_calls(item)
    if report.failed and E2E_DIR in Path(str(item.path)).parents:
        for plugin in plugin_processes.SPAWNED:  # running, or spawned during this test
            report.sections.append((f"plugin log (tail) {plugin.log_path}",
                                    plugin.log()[-6000:] or "(nothing logged)"))
        for i, ctrd in enumerate(_LIVE):
            report.sections.append((f"containerd #{i} log (tail) {ctrd.log_path}",
                                    ctrd.log_tail(60)))
            for slow in ctrd.slow_calls:  # taken while a CRI call still waited
                report.sections.append((f"containerd #{i} slow CRI call", slow))
            if _timed_out(call):
                # A call that hung: what each process waits on, for the next reader.
                report.sections.append((f"containerd #{i} processes", ctrd.processes()))
                report.sections.append((f"containerd #{i} goroutines",
                                        ctrd.dump_goroutines()))


def _warn_of_slow_calls(item: pytest.Item) -> None:
    """A test that passed although a CRI call waited past the watch (a sandbox asked for
    again): what the processes waited on goes into the warning, whole, so that the run's
    output keeps the evidence of the runtime's hang."""
    for i, ctrd in enumerate(_LIVE):
        for slow in ctrd.slow_calls:
            item.warn(pytest.PytestWarning(f"containerd #{i} ({ctrd.version}): {slow}"))


def _timed_out(call: pytest.CallInfo[None]) -> bool:
    """Whether the test failed on a deadline: a CRI call's or one of our waits'."""
    error = call.excinfo.value if call.excinfo is not None else None
    code = getattr(error, "code", None)
    return isinstance(error, WaitTimeout) or (
        callable(code) and getattr(code(), "name", "") == "DEADLINE_EXCEEDED")


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    require_prerequisites()


@pytest.fixture(scope="session")
def image_archives(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The pause and busybox image archives, built once per session."""
    out = tmp_path_factory.mktemp("images")
    return [images.pause_image(out), images.busybox_image(out)]


@pytest.fixture(scope="module")
def containerd(request: pytest.FixtureRequest,
               image_archives: list[Path]) -> Iterator[ContainerdFactory]:
    """Factory: ``containerd(**options)`` starts a fresh private containerd of this
    parameter's version (options as for ``Containerd``: enable_cdi, cdi_spec_dirs,
    nri_plugins, ...) with the test images imported. Every containerd it made is stopped
    and removed at the end of the module. ``ctrd.version`` says which one it is."""
    version = getattr(request, "param", paths.DEFAULT_RUNTIME)
    made: list[Containerd] = []

    def start(**options: Any) -> Containerd:
        options.setdefault("version", version)
        ctrd = Containerd(**options)
        made.append(ctrd)
        ctrd.start()
        _LIVE.append(ctrd)
        ctrd.import_images(*image_archives)
        return ctrd

    try:
        yield start
    finally:
        for ctrd in made:
            if ctrd in _LIVE:
                _LIVE.remove(ctrd)
            ctrd.close()


@pytest.fixture
def cri(ctrd: Containerd) -> Iterator[CriClient]:
    """A CRI client on the module's ``ctrd`` (each module defines that fixture: its own
    containerd set-up); pods and containers it made are removed afterwards."""
    with ctrd.cri() as client, client.cleanup():
        yield client


@pytest.fixture(scope="session")
def arm64_containers(e2e_ready: None) -> Iterator[arm64.Arm64]:
    """The arm64 parts (tests/arm64.py), with qemu-aarch64 registered with binfmt_misc for
    the session (tests/e2e/binfmt.py: a system-wide change, said on stderr, undone at the
    end). Where the machine refuses the registration the tests skip with its reason, under
    CI too: that is the machine's, not a missing install step."""
    parts = arm64.parts()
    try:
        with binfmt.registered(parts.qemu, parts.binfmt_line):
            yield parts
    except binfmt.BinfmtUnavailable as exc:
        pytest.skip(f"arm64 containers need qemu-aarch64 registered with binfmt_misc, and "
                    f"this machine refuses it: {exc}")
