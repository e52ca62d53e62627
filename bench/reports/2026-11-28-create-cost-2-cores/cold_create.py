"""CPU of one CreateContainer in-process, hot (the same request back to back) and after the
caches were thrashed (as between two creates on a busy node). Diagnostic, not a benchmark:
the figures are in this folder's README.

    python3 cold_create.py CHECKOUT create-request-1.7.24.bin SPEC_DIR [v1.7.24]
"""

import logging
import sys
import time

sys.path.insert(0, sys.argv[1])

from cdi.cache import SpecCache
from nri_plugin.nri import dispatch
from nri_plugin.plugins.cdi_injector.injector import CdiInjector
from nri_plugin.plugins.cdi_injector.vendor import RegistryHolder
from nri_plugin.vendors.nvidia.rules import NvidiaRules

logging.disable(logging.CRITICAL)
payload = open(sys.argv[2], "rb").read()  # noqa: SIM115
holder = RegistryHolder([NvidiaRules()])
holder.update(SpecCache([sys.argv[3]]).refresh())
injector = CdiInjector(holder.get, vendors=holder.vendors)
injector.configure("", "containerd", sys.argv[4] if len(sys.argv) > 4 else "v1.7.24")
dispatcher = dispatch.Dispatcher(injector)
junk = bytearray(64 << 20)  # larger than the last-level cache


def thrash() -> None:
    for i in range(0, len(junk), 64):
        junk[i] = (junk[i] + 1) & 255


def cpu_us() -> int:
    started = time.thread_time_ns()
    dispatcher.dispatch("CreateContainer", payload)
    return (time.thread_time_ns() - started) // 1000


hot = sorted(cpu_us() for _ in range(40))
cold = []
for _ in range(25):
    thrash()
    cold.append(cpu_us())
cold.sort()
print(f"{sys.argv[1]}: hot {hot[len(hot) // 2]} us, after a cache thrash {cold[len(cold) // 2]} us")
