"""Deprecated import path (kept as an alias): the Parquet sink lives in `specaudit.trace.parquet`."""
from specaudit.trace.parquet import ParquetSink, prepare_run_dir, write_parquet_atomic

__all__ = ["ParquetSink", "prepare_run_dir", "write_parquet_atomic"]
