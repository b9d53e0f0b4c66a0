"""SpillDir: the temporary folder where a run with many requests keeps the per-request
state it moves out of memory (the carry's pages, invariants/carry.py; the request facts'
partitions, specaudit/audit/check/facts.py).

Made on first use (a run that spills nothing makes none), under tempfile's folder
($TMPDIR); mkdtemp makes it private (0700), the files in it follow the user's umask.
close() removes it: the checker calls it in a `finally`, so an error removes it too;
a SpillDir dropped unclosed (the tiny-run pool's carry, say) removes it when collected.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref


class SpillDir:
    def __init__(self):
        self.path: str | None = None

    def file(self, name: str) -> str:
        """The path of file `name` inside the folder (made now if it is not yet)."""
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="specaudit-spill-")
            self._gone = weakref.finalize(self, shutil.rmtree, self.path, True)
        return os.path.join(self.path, name)

    def close(self) -> None:
        if self.path is not None:
            self._gone()              # rmtree, once (the finalizer is then dead)
            self.path = None
