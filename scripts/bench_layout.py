"""Benchmark the Parquet layout of the step files: how fast the checker's list columns decode
(rows/s) and how large the file is, per layout, with pyarrow, polars and DuckDB as readers.

    python3 scripts/bench_layout.py                       # chain N=8 and tree N=32 (~3-5 minutes)
    python3 scripts/bench_layout.py --steps 200000 --json-out -    # a quick look, nothing recorded

The checker cannot run faster than its input decodes (scripts/bench_check.py's
`decode_steps_per_s`), and that limit is set by how the files are written. For each shape
(synthetic data from specaudit.synth: a chain of N=8 and a tree of N=32) the same steps
table is written in several layouts:

- writer options only (the contract unchanged: every reader, DuckDB view and older
  dataset keeps working): compression zstd / lz4 / snappy / none, dictionary encoding
  on or off for the list columns, row-group sizes;
- a study (`fixed_binary`): each per-node list column as fixed_size_binary(4 N) (int32
  little endian) and the ragged lists as binary: NOT the contract (a new contract
  version with a reader for the old one), measured to show what a layout change could gain.

Each file is read back one thread per reader (pyarrow iter_batches as the checker reads,
polars read_parquet, DuckDB read_parquet fetched as Arrow), best of --repeat, on the list
columns the checker decodes (those of bench_check's decode limit). The writer's current
options are `specaudit.trace.parquet.STEP_WRITE_OPTIONS`; that layout is marked `current`.
Every contract layout is also checked with the full catalog: the findings must be identical
across layouts (the bench fails loudly when not). One JSON line per shape, then the summary,
recorded to docs/benchmarks/layout.json (scripts/benchutil.py); the ratios to the current
layout are withheld when the machine was busy.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# one thread per reader: rows/s per core (set before polars and DuckDB are imported)
os.environ.setdefault("POLARS_MAX_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import add_json_out, guard_ratios, load_fields, quiet_machine, record  # noqa: E402

# the list columns the checker decodes (bench_check's decode limit: the diagnostic lists
# are proven from the metadata and skipped)
LISTS = ("node_tokens", "parents", "positions", "target_argmax", "accepted_path", "committed_tokens")


def layouts(rg: int) -> list[dict]:
    """(name, writer keyword arguments) of every contract layout measured."""
    from specaudit.trace.parquet import STEP_WRITE_OPTIONS
    out = []
    for comp in ("zstd", "lz4", "snappy", "none"):
        for dic in (True, False):
            out.append({"name": f"{comp}{'' if dic else '-nodict'}", "compression": comp,
                        "dictionary": dic, "row_group_size": rg})
    for comp in ("zstd", "lz4"):   # data pages v2: levels stored uncompressed, apart from the values
        out.append({"name": f"{comp}-pagev2", "compression": comp, "dictionary": True, "row_group_size": rg,
                    "data_page_version": "2.0"})
    for size in (16384, 262144, 1 << 20):
        out.append({"name": f"zstd-rg{size}", "compression": "zstd", "dictionary": True, "row_group_size": size})
    o = STEP_WRITE_OPTIONS   # written with exactly these options (write_layout)
    cur = {"name": "current", "compression": o.get("compression", "snappy"),
           "dictionary": o.get("use_dictionary", True),
           "row_group_size": rg, "data_page_version": o.get("data_page_version", "1.0")}
    return [cur] + out


def write_layout(tbl: pa.Table, path: Path, lay: dict) -> int:
    if lay["name"] == "current":   # as the sink writes (trace/parquet.py)
        from specaudit.trace.parquet import STEP_WRITE_OPTIONS
        pq.write_table(tbl, path, row_group_size=lay["row_group_size"], **STEP_WRITE_OPTIONS)
        return path.stat().st_size
    names = tbl.schema.names
    dic = lay["dictionary"]
    if dic is True:
        use_dictionary = True
    elif dic is False:   # off for the list columns only: the string columns keep theirs
        use_dictionary = [c for c in names if not pa.types.is_list(tbl.schema.field(c).type)]
    else:
        use_dictionary = dic
    pq.write_table(tbl, path, compression=lay["compression"], use_dictionary=use_dictionary,
                   row_group_size=lay["row_group_size"], data_page_version=lay.get("data_page_version", "1.0"))
    return path.stat().st_size


def fixed_binary(tbl: pa.Table) -> pa.Table:
    """The study layout: uniform per-node lists as fixed_size_binary(4 N), ragged ones as
    binary (the bytes of the int32 values), the other columns unchanged."""
    import numpy as np
    cols, fields = [], []
    for f, col in zip(tbl.schema, tbl.columns, strict=True):
        if f.name in LISTS:
            arr = col.combine_chunks()
            off = arr.offsets.to_numpy()
            vals = arr.values.to_numpy(zero_copy_only=False).astype("<i4")
            lens = np.diff(off)
            data = pa.py_buffer(vals[off[0]: off[-1]].tobytes())
            if len(lens) and (lens == lens[0]).all() and lens[0] > 0:
                typ = pa.binary(4 * int(lens[0]))
                col = pa.Array.from_buffers(typ, len(arr), [None, data])
            else:
                boff = pa.py_buffer(((off - off[0]) * 4).astype(np.int32).tobytes())
                typ = pa.binary()
                col = pa.Array.from_buffers(typ, len(arr), [None, boff, data])
            f = pa.field(f.name, typ)
        cols.append(col)
        fields.append(f)
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def _best(fn, repeat: int) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds of this process) over `repeat` calls: one
    thread per reader, so CPU time is the figure a busy machine does not distort."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        fn()
        cpu = min(cpu, time.process_time() - c)
        wall = min(wall, time.perf_counter() - t)
    return wall, cpu


def read_pyarrow(path: Path, cols) -> int:
    n = 0
    for b in pq.ParquetFile(path).iter_batches(batch_size=65536, columns=list(cols), use_threads=False):
        n += b.num_rows
    return n


def read_polars(path: Path, cols) -> int:
    import polars as pl
    return pl.read_parquet(path, columns=list(cols), use_pyarrow=False).height


def read_duckdb(path: Path, cols, con) -> int:
    sel = ", ".join(f'"{c}"' for c in cols)
    lit = str(path).replace("'", "''")
    return con.sql(f"SELECT {sel} FROM read_parquet('{lit}')").to_arrow_table().num_rows


def measure(path: Path, rows: int, repeat: int, con) -> dict:
    out = {}
    for name, fn in (("pyarrow", lambda: read_pyarrow(path, LISTS)),
                     ("polars", lambda: read_polars(path, LISTS)),
                     ("duckdb", lambda: read_duckdb(path, LISTS, con))):
        got = fn()
        if got != rows:
            raise SystemExit(f"{name} read {got} rows of {path.name}, expected {rows}")
        wall, cpu = _best(fn, repeat)
        out[f"{name}_rows_per_s"] = round(rows / wall)
        out[f"{name}_rows_per_cpu_s"] = round(rows / cpu) if cpu > 0 else None
    return out


def check_findings(run_dir: Path) -> dict:
    from specaudit.audit.check import check_paths
    r = check_paths([str(run_dir)], max_per_code=100)
    return {"steps": r.steps, "counts": dict(sorted(r.counts.items())), "bad_files": len(r.bad_files)}


def study_shape(base: Path, algo: str, n_nodes: int, steps: int, rg: int, repeat: int, seed: int) -> dict:
    """Every layout of one shape -> {shape, rows, layouts: [...]} (raises on differing findings)."""
    import duckdb

    from specaudit.trace.synth import write_synthetic_dataset
    src = write_synthetic_dataset(base / "src", steps, n_nodes=n_nodes, algo=algo, seed=seed,
                                  run_id=f"layout-{algo}-n{n_nodes}", rollups=False)
    tbl = pa.concat_tables(pq.read_table(f) for f in sorted(src.glob("steps-*.parquet")))
    rows = tbl.num_rows
    con = duckdb.connect()
    con.execute("SET threads = 1")
    rows_out, ref = [], None
    for lay in layouts(rg):
        run_dir = base / lay["name"] / src.name
        run_dir.mkdir(parents=True)
        for f in ("run.json", "requests.parquet"):
            shutil.copy(src / f, run_dir / f)
        path = run_dir / "steps-000000.parquet"
        size = write_layout(tbl, path, lay)
        got = check_findings(run_dir)
        if ref is None:
            ref = got
        elif got != ref:
            raise SystemExit(f"findings differ between layouts {rows_out[0]['layout']} and {lay['name']}: "
                             f"{ref} != {got}")
        rows_out.append({"layout": lay["name"], "compression": lay["compression"],
                         "dictionary": lay["dictionary"], "row_group_size": lay["row_group_size"],
                         "page_version": lay.get("data_page_version", "1.0"),
                         "mb": round(size / 1e6, 1), **measure(path, rows, repeat, con)})
        print(json.dumps({"shape": f"{algo} N={n_nodes}", **rows_out[-1]}), file=sys.stderr, flush=True)
        shutil.rmtree(base / lay["name"])
    # the study: not the contract (the checker cannot read it), decode speed and size only
    path = base / "fixed_binary.parquet"
    fb = fixed_binary(tbl)
    pq.write_table(fb, path, compression="zstd", use_dictionary=False, row_group_size=rg)
    rows_out.append({"layout": "fixed_binary (study, not the contract)", "compression": "zstd",
                     "dictionary": False, "row_group_size": rg, "page_version": "1.0",
                     "mb": round(path.stat().st_size / 1e6, 1), **measure(path, rows, repeat, con)})
    print(json.dumps({"shape": f"{algo} N={n_nodes}", **rows_out[-1]}), file=sys.stderr, flush=True)
    path.unlink()
    shutil.rmtree(base / "src")
    con.close()
    return {"shape": f"{algo} N={n_nodes}", "rows": rows, "findings": ref["counts"], "layouts": rows_out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000, help="steps of the chain N=8 data (default 1,000,000)")
    ap.add_argument("--tree-steps", type=int, default=None, help="steps of the tree N=32 data (default steps / 4)")
    ap.add_argument("--row-group", type=int, default=65536, help="row-group size of the compression layouts")
    ap.add_argument("--repeat", type=int, default=3, help="reads per reader and layout; the best is kept")
    ap.add_argument("--seed", type=int, default=0)
    add_json_out(ap, "layout")
    args = ap.parse_args(argv)
    tree_steps = args.tree_steps or max(args.steps // 4, 1)
    base = Path(tempfile.mkdtemp(prefix="bench-layout-"))
    try:
        quiet_machine()
        shapes = []
        for algo, n, steps in (("chain", 8, args.steps), ("tree", 32, tree_steps)):
            shapes.append(study_shape(base / f"{algo}{n}", algo, n, steps, args.row_group, args.repeat, args.seed))
        load = load_fields()   # read right after the measured phase
    finally:
        shutil.rmtree(base, ignore_errors=True)
    table, ratios = [], []
    cpu = lambda r: r["pyarrow_rows_per_cpu_s"]   # the checker's reader, per CPU second
    for s in shapes:
        cur = s["layouts"][0]
        for r in s["layouts"]:
            row = {"shape": s["shape"], **r}
            # pyarrow (the checker's reader) against the writer's current layout
            row["pyarrow_over_current"] = round(cpu(r) / cpu(cur), 2)
            row["size_over_current"] = round(r["mb"] / cur["mb"], 2) if cur["mb"] else None
            table.append(row)
        best = max((r for r in s["layouts"] if "study" not in r["layout"]), key=cpu)
        study = s["layouts"][-1]
        key = s["shape"].replace(" ", "_").replace("=", "")
        ratios += [f"best_contract_over_current_{key}", f"fixed_binary_over_current_{key}"]
        s["best_contract_layout"] = best["layout"]
        s[f"best_contract_over_current_{key}"] = round(cpu(best) / cpu(cur), 2)
        s[f"fixed_binary_over_current_{key}"] = round(cpu(study) / cpu(cur), 2)
    out = {"chain_steps": shapes[0]["rows"], "tree_steps": shapes[1]["rows"], "repeat": args.repeat,
           "findings_identical": True, "columns": list(LISTS),
           **{k: v for s in shapes for k, v in s.items() if k.startswith(("best_contract_over", "fixed_binary_over"))},
           "best_contract_layout_chain": shapes[0]["best_contract_layout"],
           "best_contract_layout_tree": shapes[1]["best_contract_layout"],
           "layouts": table, **load}
    if not out["machine_quiet"]:   # the per-layout ratios are ratios too
        for r in table:
            r["pyarrow_over_current"] = None
    print(json.dumps(guard_ratios(out, ratios)))
    record("layout", out, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
