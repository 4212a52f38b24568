"""Shared-memory weight segments outlive a killed pushing process (/dev/shm is memory): the
next writer removes those whose process is gone, and only those."""

import os
import subprocess
import sys

from venusrl.weights.shared_memory import PREFIX, remove_orphans


def test_segments_of_processes_that_are_gone_are_removed_and_live_ones_kept(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"{PREFIX}{gone.stdout.strip()}-abc"
    mine = tmp_path / f"{PREFIX}{os.getpid()}-def"
    for path in (orphan, mine):
        path.write_bytes(b"x")
    assert remove_orphans(tmp_path) == [orphan]
    assert mine.exists() and not orphan.exists()
