"""scripts/llama_server_build.py and scripts/llama_gguf.py without building anything: the one-line
errors for a missing tool or a refused tokenizer, the patch bookkeeping, the cache layout."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import llama_gguf as G  # noqa: E402
import llama_server_build as B  # noqa: E402


def test_a_missing_tool_is_one_line_naming_the_step_and_the_package(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECAUDIT_CACHE", str(tmp_path))
    monkeypatch.setattr(B.shutil, "which", lambda name: None if name == "ninja" else "/usr/bin/" + name)
    with pytest.raises(B.StepError) as e:
        B.need_tools()
    assert e.value.code == 2 and "ninja" in str(e.value) and "apt-get install" in str(e.value)
    assert "\n" not in str(e.value)


def test_patched_builds_touch_only_the_diffs_files_and_are_keyed_by_its_hash():
    d = REPO / "tests" / "fixtures" / "llamacpp_patches"
    files = {p.name: B.touched_files(p.read_text()) for p in d.glob("*.diff")}
    assert files["bonus-counted-as-accepted.diff"] == ["tools/server/server-context.cpp"]
    assert files["draft-below-min-counted-as-generated.diff"] == ["common/speculative.cpp",
                                                                  "tools/server/server-context.cpp"]
    L = B.Layout(root=Path("/nonexistent"))
    assert L.patched("abc") != L.binary and L.binary.parent.name == f"llama-cpp-python-{B.VERSION}"


def test_restore_puts_a_touched_file_back_with_a_fresh_mtime(tmp_path):
    import tarfile
    import time
    root = tmp_path / "cache"
    L = B.Layout(root=root)
    src = tmp_path / f"{B.PKG}-{B.VERSION}" / "vendor" / "llama.cpp" / "common"
    src.mkdir(parents=True)
    (src / "x.cpp").write_text("pristine\n")
    L.tarball.parent.mkdir(parents=True)
    with tarfile.open(L.tarball, "w:gz") as t:
        t.add(tmp_path / f"{B.PKG}-{B.VERSION}", arcname=f"{B.PKG}-{B.VERSION}")
    (L.tree / "common").mkdir(parents=True)
    (L.tree / "common" / "x.cpp").write_text("patched\n")
    L.out.mkdir(parents=True)
    L.journal.write_text(json.dumps(["common/x.cpp", "common/new.cpp"]))
    (L.tree / "common" / "new.cpp").write_text("added by a patch\n")
    before = time.time() - 1
    B.restore_journal(L)
    assert (L.tree / "common" / "x.cpp").read_text() == "pristine\n"
    assert (L.tree / "common" / "x.cpp").stat().st_mtime >= before     # newer than any object file
    assert not (L.tree / "common" / "new.cpp").exists() and not L.journal.exists()


def test_a_tokenizer_without_merges_is_refused_in_one_line(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}))
    with pytest.raises(G.ConvertError) as e:
        G.check_merges(tmp_path)
    assert "cannot find tokenizer merges" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "merges": ["a b"]}}))
    G.check_merges(tmp_path)


def test_a_folder_that_is_not_a_checkpoint_is_named(tmp_path, capsys):
    assert G.main([str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
