"""A patched copy of vLLM's Python source for the bug-reproduction tests (helper module).

`patched_vllm(python, dest, patches)` builds dest/vllm/ as a mirror of the installed
package: every entry a symlink to the original, except along the path of each patched
file, where folders are real and the file is a copy with the fixture diff applied. Put
dest first on PYTHONPATH and `import vllm` (in the server and in its worker processes)
runs the patched code; the installed venv is never touched.

A patch is (relative path, [(old, new), ...]); each `old` must occur exactly once in
the file, so a vLLM whose code moved fails loudly instead of testing nothing.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


def vllm_dir(python: str) -> Path:
    code = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return Path(out.stdout.strip())


def _mirror(src: Path, dst: Path) -> None:
    """dst/ holds a symlink to each entry of src/ (dst made real)."""
    dst.mkdir(parents=True, exist_ok=True)
    for e in os.scandir(src):
        if e.name == "__pycache__":
            continue
        link = dst / e.name
        if not os.path.lexists(link):
            link.symlink_to(Path(src) / e.name)


def patched_vllm(python: str, dest: Path, patches: dict[str, list[tuple[str, str]]]) -> Path:
    """Build dest/vllm (see the module doc); returns dest (the PYTHONPATH entry)."""
    src = vllm_dir(python)
    dest = Path(dest)
    _mirror(src, dest / "vllm")
    for rel, edits in patches.items():
        parts = Path(rel).parts
        cur_src, cur_dst = src, dest / "vllm"
        for p in parts[:-1]:            # make each folder on the way real
            cur_src, cur_dst = cur_src / p, cur_dst / p
            if cur_dst.is_symlink():
                cur_dst.unlink()
                _mirror(cur_src, cur_dst)
        f = cur_dst / parts[-1]
        text = (cur_src / parts[-1]).read_text()
        for old, new in edits:
            n = text.count(old)
            if n != 1:
                raise AssertionError(f"fixture diff for {rel}: expected the text once, found it {n} times: "
                                     f"{old[:80]!r}")
            text = text.replace(old, new)
        if f.is_symlink():
            f.unlink()
        f.write_text(text)
    return dest
