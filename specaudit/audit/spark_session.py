"""The Spark session the checker runs on, and Spark's failures as one line.

    from specaudit.audit.spark_session import session
    spark = session("local[2]")          # or session(None) under spark-submit

A failure of Spark itself (no Java, a master that does not answer, a lost executor) is
SparkCheckError: one line for the user (the CLI exits 2), the Java trace chained as
its cause for logs.
"""
from __future__ import annotations

import os
import sys


class SparkCheckError(ValueError):
    """Spark failed (not the data): one line for the user (the CLI exits 2), the cause
    chained for logs."""


def one_line(e: Exception) -> str:
    """An exception (a Py4J error's Java message included) as its first line, at most 300
    characters."""
    msg = str(getattr(e, "desc", None) or e).strip()
    first = msg.splitlines()[0] if msg else type(e).__name__
    return first[:300]


def _cores(master: str | None) -> int:
    """Shuffle partitions for a master: its cores for local[N] / local[*] (more only adds
    task overhead: the group stage sets its own partitioning), else 8."""
    import re
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]|local", master or "")
    if not m:
        return 8
    return os.cpu_count() or 1 if m.group(1) in (None, "*") else int(m.group(1))


MASTER_CONNECT_S = 5.0   # a standalone master that does not accept a connection by then is unreachable


def check_master_reachable(master: str | None, timeout: float = MASTER_CONNECT_S) -> None:
    """spark://HOST:PORT[,HOST:PORT]: one TCP connect to each, before the JVM starts, so an
    unreachable master is one line (SparkCheckError) instead of a minute of Java retries
    and a stack trace that blames the Java version. Other masters (local[*], yarn,
    k8s://) are left to Spark."""
    import socket
    if not master or not master.startswith("spark://"):
        return
    problems = []
    for hp in master[len("spark://"):].split(","):
        host, _, port = hp.rpartition(":")
        if not host or not port.isdigit():
            raise SparkCheckError(f"--spark-master {master}: expected spark://HOST:PORT")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return   # one master answers: Spark picks the leader
        except OSError as e:
            problems.append(f"{hp}: {getattr(e, 'strerror', None) or e}")
    raise SparkCheckError(f"cannot reach the Spark master {master} ({'; '.join(problems)}); is it running?")


def session(master: str | None = "local[2]", app: str = "specaudit-check", **conf):
    """A SparkSession for the checker: workers run this interpreter (PYSPARK_PYTHON),
    Arrow enabled, Spark's own logging at ERROR so a failure prints one line. master
    None: the one spark-submit (or an existing session) gives."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    check_master_reachable(master)
    from pyspark.sql import SparkSession
    b = SparkSession.builder
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"   # not under spark-submit (which sets the master and starts the JVM)
    if master:
        b = b.master(master)
    b = (b.appName(app)
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.sql.shuffle.partitions", str(conf.pop("shuffle_partitions", None) or _cores(master)))
         .config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.host", "127.0.0.1"))
    for k, v in conf.items():
        b = b.config(k, v)
    try:
        s = b.getOrCreate()
    except Exception as e:
        raise SparkCheckError(f"cannot start Spark ({master or 'from spark-submit'}): {one_line(e)}; "
                              "PySpark 4.x needs Java 17 or 21 (java on PATH or JAVA_HOME)") from e
    s.sparkContext.setLogLevel("ERROR")
    return s
