"""A pod whose NRI message is over 4 MiB: the runtime cannot synchronize the plugin.

containerd 2.1 (NRI 0.8.0) pages Synchronize, but rounds one over-sized pod down to zero
objects per page and then sends empty ``more: true`` pages until its 2 s timeout, on every
reconnect; containerd 1.7 (NRI 0.6.1) has no paging and sends a frame over ttrpc's 4 MiB.
Either way the plugin must say so clearly and back off, not reconnect silently in a loop.
"""

from __future__ import annotations

import re
from pathlib import Path

from nri_cdi_testbed.waiting import wait_until
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.plugin import PluginProcess

# over 4 MiB in one pod; 9 containers so that NRI 0.8's first shrink keeps >= 8 objects
BLOB = "x" * 4_500_000
CONTAINERS = 9


def _backoffs(log: str) -> list[float]:
    return [float(s) for s in re.findall(r"reconnecting in ([0-9.]+) s", log)]


def test_oversized_pod_is_reported_and_reconnects_back_off(
        containerd: ContainerdFactory, tmp_path: Path) -> None:
    ctrd = containerd()
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("huge", annotations={"example.com/blob": BLOB})
        for i in range(CONTAINERS):
            cri.create_container(pod, f"c{i}", BUSYBOX_IMAGE, command=["sleep", "600"])
        (tmp_path / "cdi").mkdir()
        plugin = PluginProcess(ctrd.nri_socket, [tmp_path / "cdi"], tmp_path / "plugin.log")
        try:
            plugin.start()
            if ctrd.major >= 2:
                plugin.wait_for_log("Synchronize cannot complete: after 0 pods and "
                                    f"{CONTAINERS} containers the runtime sent a page with "
                                    "nothing in it and more=true")
            else:
                plugin.wait_for_log("announces 45")  # the 4.5 MB frame, refused
            wait_until(lambda: len(_backoffs(plugin.log())) >= 3, "three back-offs logged",
                       seen=lambda: plugin.log()[-3000:])
        finally:
            plugin.kill()
        waits = _backoffs(plugin.log())
        # backing off (doubling after each failed session), not a fresh short wait each time
        assert waits[1] == 2 * waits[0] and waits[2] == 2 * waits[1], waits
        if ctrd.major >= 2:  # refused at once: no 2 s of empty pages per attempt
            log = ctrd.log_path.read_text(errors="replace")
            assert "Synchronize cannot complete" in log
            assert "failed to synchronize plugin: context deadline exceeded" not in log
