"""The variant checkouts of this report: a copy of CHECKOUT per variant, each with exactly
one shortcut taken out (or put back), each its own git repository with the files staged so
that ``bench/bench_generate_cli.py --other NAME=FOLDER`` can install it.

Run: ``python3 make_variants.py CHECKOUT OUT_FOLDER [NAME ...]`` (the checkout of the commit
measured, 2c483ef; the edits fail loudly where the code has moved on).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SHA = ("try:\n    from _sha256 import sha256  # type: ignore[import-not-found]\n"
       "except ImportError:\n    from hashlib import sha256\n")
JSON_LINES = '''

def _json_lines(document: dict[str, Any]) -> str:
    entries = []
    for key, value in document.items():
        if isinstance(value, dict) and value:
            inner = ",\\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            entries.append(f"  {json.dumps(key)}: {{\\n{inner}\\n  }}")
        else:
            entries.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\\n" + ",\\n".join(entries) + "\\n}\\n"
'''
PYYAML = ('    import yaml\n    return "---\\n" + yaml.dump(document, Dumper=yaml.CSafeDumper, '
          'sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16)\n')
GC_PAUSE = ("    collecting = gc.isenabled()\n    gc.disable()\n    try:\n"
            "        return _cmd(args, out, err, environ)\n    finally:\n"
            "        if collecting:\n            gc.enable()\n\n\n"
            "def _cmd(args: Any, out: Any, err: Any, environ: Any) -> int:\n")
CLI, GEN = "cdi/nvidia/cli.py", "cdi/nvidia/generate.py"
# variant -> [(file, text, replacement)]
VARIANTS: dict[str, list[tuple[str, str, str]]] = {
    "private-sha256": [(CLI, "from hashlib import sha256\n", ""),
                       (CLI, "from cdi.errors import SpecError\n",
                        SHA + "from cdi.errors import SpecError\n"),
                       (GEN, "from hashlib import sha256\n", ""),
                       (GEN, "from cdi.hooks import entry as hook_entry\n",
                        SHA + "from cdi.hooks import entry as hook_entry\n")],
    "pyyaml-dumper": [("cdi/yaml11.py", "def dump_yaml(document: dict[str, Any]) -> str:\n",
                       "def dump_yaml(document: dict[str, Any]) -> str:\n" + PYYAML)],
    "no-string-cache": [("cdi/yaml11.py", "@functools.lru_cache(maxsize=4096)", "#")],
    "plain-argparse": [("nri_plugin/ops/cli.py", "    parser = _Parser(\n",
                        "    parser = argparse.ArgumentParser(\n")],
    "with-gc-pause": [(CLI, "import argparse\n", "import argparse\nimport gc\n"),
                      (CLI, "    out, err = out or sys.stdout, err or sys.stderr\n",
                       GC_PAUSE + "    out, err = out or sys.stdout, err or sys.stderr\n")],
    "no-gc-freeze": [("cdi/process.py", "    gc.freeze()\n", "")],
    "tempfile": [("cdi/spec.py", "    for _ in range(100):\n        name = os.path.join(folder,",
                  "    import tempfile\n    return tempfile.mkstemp(prefix=prefix, suffix=suffix, "
                  "dir=folder)\n    for _ in range(100):\n        name = os.path.join(folder,")],
    "no-ctypes-stand-in": [("cdi/nvidia/discover.py", "    with _ctypes_util_on_demand():\n",
                            "    with contextlib.nullcontext():\n")],
    "metadata-version": [(GEN, 'GENERATOR_VERSION = "0.1.0"\n',
                          "from importlib.metadata import version as _version\n"
                          'GENERATOR_VERSION = _version("nri-cdi")\n')],
    "import-all-commands": [("nri_plugin/ops/cli.py",
                             "    wanted = [COMMANDS[command]] if command in COMMANDS "
                             "else list(COMMANDS.values())\n",
                             "    wanted = list(COMMANDS.values())\n")],
    "no-folder-cache": [("cdi/nvidia/driver.py",
                         "        walked = self._folder(folder)\n        if walked is not None:\n"
                         "            walked = self._walk(walked[0], name, walked[1])\n",
                         "        walked = self._walk([], posixpath.normpath('/' + path), 0)\n")],
    "json-lines": [(CLI, '(json.dumps(meta, indent=2) + "\\n").encode()',
                    "_json_lines(meta).encode()"),
                   (CLI, "\n\ndef _unchanged(", JSON_LINES + "\n\ndef _unchanged(")],
}


def main() -> None:
    source, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    names = sys.argv[3:] or list(VARIANTS)
    listed = subprocess.run(["git", "-C", str(source), "ls-files", "-z", "-co",
                             "--exclude-standard"], capture_output=True, text=True, check=True)
    files = [f for f in listed.stdout.split("\0")
             if f and (source / f).is_file() and not (source / f).is_symlink()]
    for name in names:
        root = out / name
        shutil.rmtree(root, ignore_errors=True)
        for f in files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / f, root / f)
        for rel, old, new in VARIANTS[name]:
            text = (root / rel).read_text()
            if old not in text:
                raise SystemExit(f"{name}: {rel} no longer has {old[:60]!r}")
            (root / rel).write_text(text.replace(old, new, 1))
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
        print(f"{root}")


if __name__ == "__main__":
    main()
