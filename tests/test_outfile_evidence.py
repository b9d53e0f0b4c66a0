"""outfile.evidence: only the files a command reads are evidence. A log file's folder is
not a run folder (`check logs/a.log -o logs/out.txt` writes), while a run folder read
through its folder or one of its trace files stays closed to `-o`."""
from __future__ import annotations

import pytest

from specaudit.outfile import evidence, guard_output, guard_output_dir, write_output
from specaudit.trace.safe_io import InputError

LINE = ("INFO 05-01 14:24:50 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 2.37, Accepted: 89 "
        "tokens, Drafted: 975 tokens, Avg Draft acceptance rate: 9.1%\n")


def _run_folder(tmp_path):
    run = tmp_path / "data" / "run_id=r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "steps-0.parquet").write_bytes(b"PAR1")
    return run


def test_a_log_files_folder_is_not_a_run_folder(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "a.log"
    log.write_text(LINE)
    files, dirs = evidence([log])
    assert files == {log.resolve()} and dirs == set()
    out = write_output(logs / "out.txt", "report\n", inputs=[log])
    assert out.read_text() == "report\n"
    with pytest.raises(InputError, match="one of the files this command reads"):
        guard_output(log, [log])                    # the log itself stays evidence
    assert guard_output_dir(logs / "sub", [log]) == logs / "sub"


def test_a_run_folder_read_through_a_trace_file_or_its_dataset_stays_closed(tmp_path):
    run = _run_folder(tmp_path)
    for inputs in ([run / "run.json"], [run / "steps-0.parquet"], [tmp_path / "data"], [run]):
        files, dirs = evidence(inputs)
        assert run.resolve() in dirs, inputs
        assert (run / "steps-0.parquet").resolve() in files
        with pytest.raises(InputError, match="inside the run folder"):
            guard_output(run / "out.txt", inputs)
        with pytest.raises(InputError, match="run folder"):
            guard_output_dir(run / "sub", inputs)
    assert not (run / "out.txt").exists()


def test_a_log_beside_a_run_json_is_still_only_itself(tmp_path):
    run = _run_folder(tmp_path)
    log = run / "server.log"           # an engine log kept inside a run folder
    log.write_text(LINE)
    files, dirs = evidence([log])
    assert files == {log.resolve()} and dirs == set()
