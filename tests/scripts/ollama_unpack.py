#!/usr/bin/env python3
"""Unpack the Ollama server of an ipex-llm wheel (PyPI bigdl-core-cpp).

Usage: ollama_unpack.py WHEEL PREFIX DEST [KEEP]

Extracts the wheel's members directly under PREFIX (e.g.
"bigdl/cpp/libs/ollama/") whose names are "ollama-lib" or end in ".so"
(and, with KEEP, a comma-separated list of name prefixes, start with one of
them), flat into DEST, keeping their executable bits (zipfile does not
restore them by itself). Nothing else of the wheel (llama.cpp tools, Python
code) is needed to run the server.
"""

import os
import sys
import zipfile


def main():
    wheel, prefix, dest = sys.argv[1:4]
    keep = tuple(p for p in (sys.argv[4] if len(sys.argv) > 4 else "").split(",") if p)
    os.makedirs(dest, exist_ok=True)
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            name = info.filename
            if not name.startswith(prefix) or "/" in name[len(prefix):]:
                continue
            base = name[len(prefix):]
            if base != "ollama-lib" and not base.endswith(".so"):
                continue
            if keep and base != "ollama-lib" and not base.startswith(keep):
                continue
            target = os.path.join(dest, base)
            with archive.open(info) as src, open(target, "wb") as out:
                out.write(src.read())
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, mode | 0o644 if mode else 0o755)
            count += 1
    if count == 0:
        sys.exit(f"no ollama-lib or .so under {prefix} in {wheel}")
    print(f"unpacked {count} files into {dest}")


if __name__ == "__main__":
    main()
