"""PolicyReloader: a real file, real inotify, a real event loop; no containerd."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from nri_cdi_testbed.waiting import wait_until_async
from nri_plugin.ops.policy_reload import PolicyReloader
from nri_plugin.plugins.cdi_injector.policy import Policy, load_policy


async def _until(current: list[Policy], caplog: pytest.LogCaptureFixture, reloads: int,
                 rejected: int = 0) -> None:
    """Policies swapped in after the first, and new versions refused (their log line)."""
    def counts() -> tuple[int, int]:
        return len(current) - 1, sum(r.getMessage().endswith("the previous policy stays in "
                                                             "force") for r in caplog.records)

    await wait_until_async(lambda: counts() == (reloads, rejected),
                           f"{reloads} reloads and {rejected} rejected", seen=counts)


def test_reload_on_change_refuse_bad_and_sighup(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("privilegedExempt: false\n")
    current: list[Policy] = [load_policy(str(path))]

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        reloader = PolicyReloader(str(path), lambda: load_policy(str(path)),
                                  current.append).start(loop)
        try:
            tmp = tmp_path / "policy.new"  # replaced by rename, as editors do
            tmp.write_text("privilegedExempt: true\n")
            tmp.rename(path)
            await _until(current, caplog, 1)
            assert current[-1].privileged_exempt is True
            path.write_text("privilegedExempt: yes please\nnope: 1\n")
            await _until(current, caplog, 1, 1)
            assert len(current) == 2  # the old policy stays
            path.write_text("privilegedExempt: false\n")
            await _until(current, caplog, 2, 1)
            assert current[-1].privileged_exempt is False
            os.kill(os.getpid(), signal.SIGHUP)  # forced, even though unchanged
            await _until(current, caplog, 3, 1)
        finally:
            reloader.stop(loop)

    with caplog.at_level(logging.INFO, logger="nri_cdi.policy"):
        asyncio.run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors[0].endswith("new version refused, the previous policy stays in force")
    assert any("privilegedExempt: must be true or false, got 'yes please'" in e
               for e in errors[1:])
    assert any("nope: unknown key" in e for e in errors[1:])
    assert len(errors) == 3  # one line, then one per problem
