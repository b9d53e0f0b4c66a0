"""An InputError raised in a process-pool worker comes back to the caller intact.

concurrent.futures pickles a worker's exception (the parallel log audit and the checker's
pools of tiny runs run in such workers); without InputError.__reduce__ the unpickling
calls __init__ with the message alone and the pool breaks (BrokenProcessPool) instead of
giving the one-line error. This is the one pickle the project keeps: an error in flight
between its own processes, never a file or a Spark task (tests/test_spark_runs.py).
"""
from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import pytest

from specaudit.audit.sources.reading import NoFigures
from specaudit.trace.parquet import SinkError
from specaudit.trace.safe_io import InputError


def _raise(kind: str):
    if kind == "plain":
        raise InputError("/x/engine.log", "cannot read: permission denied")
    if kind == "sink":
        e = SinkError("/x/steps-000001.parquet", "disk full")
        e.rows_kept = 37
        raise e
    raise NoFigures("/x/engine.log", "no spec-decoding figures", recognised="vllm",
                    notes=[{"file": "/x/engine.log", "line": 3, "reason": "cut", "text": ""}])


def test_input_errors_come_back_from_a_worker_with_their_class_and_attributes():
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork")) as ex:
        got = []
        for kind in ("plain", "sink", "figures"):
            with pytest.raises(InputError) as info:
                ex.submit(_raise, kind).result()
            got.append(info.value)
    plain, sink, figures = got
    assert (type(plain), plain.path, plain.reason) == (InputError, "/x/engine.log", "cannot read: permission denied")
    assert str(plain) == "/x/engine.log: cannot read: permission denied"
    assert type(sink) is SinkError and sink.rows_kept == 37 and str(sink) == "/x/steps-000001.parquet: disk full"
    assert type(figures) is NoFigures and figures.recognised == "vllm" and figures.notes[0]["line"] == 3
