"""Query results written out: an aligned text table, CSV, a JSON array or Parquet.

Streams record batches (a query over 20M steps never sits in memory as Python rows);
-o writes atomically, through the one output guard (specaudit/outfile.py) that refuses
any file of the dataset being read.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from specaudit.audit.formats import printable
from specaudit.trace.safe_io import temporary_beside


def _isatty(f) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError):
        return False


def _cell_text(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, (list, dict, tuple)):
        return json.dumps(_jsonable(v), separators=(",", ":"))
    return str(v)


def _jsonable(v):
    """Python values from Arrow -> JSON-safe (NaN/inf -> null, bytes -> hex, times -> ISO)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if hasattr(v, "isoformat"):
        return v.isoformat()
    try:
        return float(v)             # Decimal
    except (TypeError, ValueError):
        return str(v)


def write_table(schema, batches, out, max_rows: int, max_width: int = 60) -> None:
    """Aligned text table: numbers right, text left; cells cut at max_width."""
    import pyarrow as pa
    names = schema.names
    rows, more = [], 0
    for b in batches:
        for r in pa.Table.from_batches([b]).to_pylist():
            if max_rows and len(rows) >= max_rows:
                more += 1
                continue
            rows.append([printable(_cell_text(r[n])) for n in names])   # ESC, OSC, bidi: shown, never obeyed
    cut = [[c if len(c) <= max_width else c[: max_width - 1] + "…" for c in r] for r in rows]
    num = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
           for f in schema]
    names = [printable(n) for n in names]
    widths = [max([len(n)] + [len(r[i]) for r in cut]) for i, n in enumerate(names)]

    def fmt(cells):
        return "  ".join(c.rjust(w) if isn else c.ljust(w) for c, w, isn in zip(cells, widths, num)).rstrip()
    out.write(fmt(names) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for r in cut:
        out.write(fmt(r) + "\n")
    n = len(rows) + more
    tail = f"({n} row{'s' if n != 1 else ''}"
    if more:
        tail += f"; {more} not shown: --max-rows 0 for all, or --output-format csv -o FILE"
    out.write(tail + ")\n")


def write_csv(schema, batches, out, escape: bool = False) -> None:
    """CSV; escape (to a terminal): text cells with control characters shown as visible
    escapes (a file keeps the data exact)."""
    import csv
    w = csv.writer(out, lineterminator="\n")
    safe = printable if escape else (lambda x: x)
    w.writerow([safe(n) for n in schema.names])
    for b in batches:
        cols = [c.to_pylist() for c in b.columns]
        for r in zip(*cols):
            w.writerow(["" if v is None else (json.dumps(_jsonable(v), ensure_ascii=escape)
                                               if isinstance(v, (list, dict)) else
                                               safe(v) if isinstance(v, str) else _csv_scalar(v)) for v in r])


def _csv_scalar(v):
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    return v


def write_json(schema, batches, out, escape: bool = False) -> None:
    """A JSON array of row objects, one per line (streams; NaN/inf become null). escape (to a
    terminal): every non-ASCII character as \\uXXXX, so no C1 control or bidi mark is obeyed."""
    out.write("[")
    first = True
    for b in batches:
        for r in b.to_pylist():
            out.write(("\n" if first else ",\n") + json.dumps(_jsonable(r), ensure_ascii=escape))
            first = False
    out.write("\n]\n" if not first else "]\n")


def _check_output_path(path: Path, ds, inputs=()) -> Path:
    from specaudit.outfile import guard_output
    return guard_output(path, [str(rf.run_dir) for rf in (ds.runs if ds is not None else ())] + list(inputs))


def emit(schema, batches, fmt: str, output: str | None, max_rows: int, ds, inputs=()) -> None:
    """Write the result in fmt to output (atomic: temporary name then rename) or stdout."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if fmt == "parquet" and not output:
        raise ValueError("--output-format parquet needs -o FILE")
    if schema is None:
        schema, batches = pa.schema([]), iter(())
    if not output:
        tty = _isatty(sys.stdout)   # trace strings reach a terminal: never its escapes
        {"table": lambda: write_table(schema, batches, sys.stdout, max_rows),
         "csv": lambda: write_csv(schema, batches, sys.stdout, escape=tty),
         "json": lambda: write_json(schema, batches, sys.stdout, escape=tty)}[fmt]()
        return
    path = _check_output_path(Path(output), ds, inputs)   # never over a trace or a log read, nor a device or FIFO
    tmp = temporary_beside(path)
    try:
        if fmt == "parquet":
            with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
                for b in batches:
                    w.write_batch(b)
        else:
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                {"table": lambda: write_table(schema, batches, f, 0),
                 "csv": lambda: write_csv(schema, batches, f),
                 "json": lambda: write_json(schema, batches, f)}[fmt]()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    print(f"wrote {printable(path)}", file=sys.stderr)
