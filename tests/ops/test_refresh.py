"""The watcher's decisions with a scripted node: one generator run per settled change, no
write when nothing changed, retries after a failure; and the generator arguments."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from nri_plugin.ops.refresh import NodeState, Outcome, Watcher, generator_args
from nri_plugin.ops.settings import Settings

A = NodeState(driver=("580",), mig=(), devices=("195 nvidia",))
B = NodeState(driver=("590",), mig=(), devices=("195 nvidia",))
C = NodeState(driver=("590",), mig=("gpu0/mig/gi7",), devices=("195 nvidia",))


class Script:
    def __init__(self, states: list[NodeState]) -> None:
        self._states: Iterator[NodeState] = itertools.chain(states, itertools.repeat(states[-1]))
        self.runs = 0
        self.fail_next = 0

    def probe(self) -> NodeState:
        return next(self._states)

    def generate(self) -> Outcome:
        self.runs += 1
        if self.fail_next:
            self.fail_next -= 1
            return Outcome(ok=False, written=False, fingerprint=None, message="no driver")
        return Outcome(ok=True, written=True, fingerprint=f"fp{self.runs}")


def watcher(script: Script, clock: list[float]) -> Watcher:
    settings = Settings().with_values({"watch.settle": 0.001, "watch.resync_interval": 100.0})
    return Watcher(settings, generate=script.generate, probe_node=script.probe,
                   clock=lambda: clock[0])


def test_one_run_per_settled_change_and_none_when_still() -> None:
    # start, then A A, then a change that flickers (B C) before settling on C, then C...
    script = Script([A, A, A, B, C, C, C, C])
    clock = [0.0]
    w = watcher(script, clock)
    w.refresh("start")
    for _ in range(6):
        w.step()
    assert script.runs == 2  # start + the settled change to C
    clock[0] = 150.0  # resync interval passed: one periodic run
    w.step()
    w.step()
    assert script.runs == 3


def test_failed_generation_is_retried_each_poll_until_it_works() -> None:
    script = Script([A])
    script.fail_next = 2
    w = watcher(script, [0.0])
    w.refresh("start")
    w.step()
    w.step()
    w.step()
    assert script.runs == 3  # start (fail), retry (fail), retry (ok), then quiet
    w.step()
    assert script.runs == 3


def test_changes_are_named() -> None:
    assert C.changes(A) == ["driver", "MIG layout"]


def test_generator_args() -> None:
    s = Settings().with_values({"generate.mode": "procfs", "generate.dev_root": "/host",
                            "generate.disabled_hooks": ["update-ldcache"],
                            "generate.extra_args": ["--no-all-device"]})
    args = generator_args(s)
    assert args[:2] == ["--if-changed", "--output"]
    assert "--dev-root" in args and args[-1] == "--no-all-device"
    assert args.count("--device-name-strategy") == 2
    assert args[args.index("--disable-hook") + 1] == "update-ldcache"


def test_generator_args_are_the_generate_options_the_section_declares() -> None:
    # Each generate key sets the generator option it is declared from: refresh's arguments,
    # read by generate's own parser, give back the section's values.
    import argparse

    from cdi.nvidia.options import add_arguments, resolve
    from nri_plugin.ops.settings import keys_of

    s = Settings().with_values({"generate.mode": "procfs", "generate.dev_root": "/host",
                                "generate.device_name_strategies": ["uuid"],
                                "generate.hook_path": "/usr/bin/nri-cdi",
                                "generate.disabled_hooks": ["chmod", "update-ldcache"],
                                "generate.link_mode": "mounts"})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    given = resolve(parser.parse_args(generator_args(s)), {})
    assert given.if_changed
    checked = 0
    for name, key in keys_of("generate").items():
        if key.option is not None:
            assert getattr(given, key.option) == getattr(s.generate, name), name
            checked += 1
    assert checked == len(keys_of("generate")) - 1  # all but extra_args
