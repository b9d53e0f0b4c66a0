"""Progress of `specaudit check` over trace datasets: check_paths tells a callable the step
rows as they are checked, each row once (a big run batch by batch; pooled tiny runs, a run
checked again alone and worker results as they are merged); the CLI shows it as a counter
on a terminal and nowhere else."""
from __future__ import annotations

import io
import time

import pyarrow as pa
import pyarrow.parquet as pq
from test_check_pool import _tiny

from specaudit import cli_progress
from specaudit.audit import check as C
from specaudit.audit.check import pool
from specaudit.trace.synth import write_synthetic_dataset


def test_a_big_run_is_told_batch_by_batch_each_row_once(tmp_path):
    run = write_synthetic_dataset(tmp_path, n_steps=3000, seed=4)
    told = []
    res = C.check_paths([run], batch_rows=500, progress=told.append)
    assert res.steps >= 3000 and sum(told) == res.steps
    assert len(told) >= 6 and all(n > 0 for n in told)   # as the batches come, not once at the end
    assert res.on_rows is None                          # the result does not keep the callable


def test_pooled_tiny_runs_and_a_run_checked_again_alone_count_once(tmp_path, monkeypatch):
    for i in range(12):
        _tiny(tmp_path / "ds", i)
    bad = tmp_path / "ds" / "run_id=t5" / "steps-000000.parquet"   # a counter bug: checked again alone
    t = pq.read_table(bad)
    cl = t.column("commit_len").to_pylist()
    cl[1] += 1
    pq.write_table(t.set_column(t.schema.get_field_index("commit_len"), "commit_len", pa.array(cl, pa.int32())), bad)
    alone = []
    real = pool.check_run
    monkeypatch.setattr(pool, "check_run", lambda rf, *a, **k: (alone.append(rf.run_id), real(rf, *a, **k)))
    for workers in (1, 2):
        told = []
        res = C.check_paths([tmp_path / "ds"], workers=workers, progress=told.append)
        assert len(res.runs) == 12 and res.errors
        assert sum(told) == res.steps > 0
    assert "t5" in alone


class _Recorder:
    def __init__(self):
        self.n, self.closed = 0, False

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True


def test_the_command_feeds_its_counter_every_step(tmp_path, monkeypatch, capsys):
    from specaudit.cli import main
    run = write_synthetic_dataset(tmp_path, n_steps=800, seed=2)
    rec = _Recorder()
    monkeypatch.setattr(cli_progress, "step_progress", lambda: rec)
    assert main(["check", str(run), "--output-format", "json"]) == 0
    import json
    steps = json.loads(capsys.readouterr().out)["summary"]["steps"]
    assert rec.n == steps > 0 and rec.closed


def test_the_report_counts_the_steps_it_checks(tmp_path, monkeypatch):
    from specaudit.cli import main
    run = write_synthetic_dataset(tmp_path, n_steps=600, seed=3)
    rec = _Recorder()
    monkeypatch.setattr(cli_progress, "step_progress", lambda: rec)
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert rec.n >= 600 and rec.closed


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_the_counter_shows_on_a_terminal_only_after_a_second():
    assert cli_progress.step_progress(io.StringIO()) is None   # a pipe or a file: the report alone
    tty = _Tty()
    bar = cli_progress.step_progress(tty)
    bar.update(1000)
    assert "steps" not in tty.getvalue()                     # a short check shows nothing
    time.sleep(1.1)
    bar.update(2_500_000)
    bar.close()
    out = tty.getvalue()
    assert "checking" in out and "2.50M steps" in out and "steps/s" in out, out
