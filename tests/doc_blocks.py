"""The marked code blocks of the documentation pages whose commands the tests run.

A fenced block is marked by an HTML comment on the line before it:

* ``<!-- doc-test: sim -->``: a ``sh`` block run on the simulated GPU node
  (tests/e2e/test_docs_commands_e2e.py), in page order;
* ``<!-- doc-test: real-node: REASON -->`` / ``<!-- doc-test: skip: REASON -->``: not run; the
  reason says why and what covers it;
* ``<!-- doc-test: nvidia-smi -->``: a ``text`` block, the expected output of ``nvidia-smi -L``
  in a container given ``nvidia.com/gpu=0``; ``…`` stands for any text.

Every ``sh`` block of these pages must be marked (tests/test_docs_blocks.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The pages whose commands an operator types first, in the order the e2e test runs them.
TESTED_PAGES = ("docs/get-started/systemd.md", "docs/operations/troubleshooting.md",
                "docs/get-started/kubernetes.md", "docs/get-started/without-a-gpu.md")
KINDS = ("sim", "real-node", "skip", "nvidia-smi")
FENCE = re.compile(r"(?:<!-- doc-test: ([\w-]+)(?::\s*(.*?))? -->\n)?^```(\w*)\n(.*?)^```",
                   re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str | None  # None: unmarked
    reason: str
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str, root: Path = ROOT) -> list[Block]:
    body = (root / page).read_text()
    return [Block(page, body.count("\n", 0, m.start()) + 1, m.group(1), m.group(2) or "",
                  m.group(3), m.group(4)) for m in FENCE.finditer(body)]


def commands(text: str) -> list[str]:
    """A shell block's commands, one per logical line (continuations joined)."""
    joined = re.sub(r"\\\n\s*", "", text)
    return [line.split("  #", 1)[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def expected_pattern(text: str) -> re.Pattern[str]:
    """An expected-output block as a pattern: ``…`` matches any text on its line."""
    parts = [re.escape(part) for part in text.strip().split("…")]
    return re.compile("^" + "[^\n]*".join(parts) + "$")
