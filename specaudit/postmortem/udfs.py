"""The Python functions a trace connection registers in DuckDB: specaudit_depths (node
depths from parents, vectorised) and specaudit_agrees (the one comparison rule,
specaudit.audit.compare). The duckdb CLI cannot call Python: the shell gets the same
logic in SQL (view_sql.DEPTHS_REDUCE, view_sql.AGREES_MACRO_SQL)."""
from __future__ import annotations

import pyarrow as pa

from specaudit.trace.schema import tree_depths


def depths_udf(parents) -> pa.Array:
    """Arrow UDF body: list<int> parents -> list<int32> depths (root 0), same lengths.

    Vectorised over the chunk: pad to [B, Nmax] with -1 and run schema.tree_depths
    (one pass over node columns). A parent that is not an earlier node gives depth NULL
    (the checker's tree rule reports such rows).
    """
    import numpy as np
    import pyarrow.compute as pc

    if isinstance(parents, pa.ChunkedArray):
        parents = parents.combine_chunks()
    lens = pc.list_value_length(parents).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(parents).to_numpy(zero_copy_only=False).astype(np.int64)
    B = len(lens)
    offs = np.zeros(B + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    nmax = int(lens.max()) if B else 0
    if nmax == 0:
        vals = np.zeros(0, np.int32)
        valid = np.zeros(0, bool)
    else:
        row = np.repeat(np.arange(B), lens)
        col = np.arange(len(flat)) - offs[:-1][row]
        P = np.full((B, nmax), -1, np.int64)
        P[row, col] = flat
        D = tree_depths(P)
        bad = (P >= np.arange(nmax)) | ((P < 0) & (np.arange(nmax) > 0))  # not an earlier node
        badrow = np.zeros((B, nmax), bool)
        # a node under a bad node is bad too: propagate left to right (parents precede children)
        for i in range(1, nmax):
            p = np.clip(P[:, i], 0, nmax - 1)
            badrow[:, i] = bad[:, i] | badrow[np.arange(B), p]
        vals = D[row, col].astype(np.int32)
        valid = ~badrow[row, col]
    values = pa.array(vals, pa.int32(), mask=~valid if len(valid) else None)
    out = pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), values)
    if parents.null_count:
        out = pc.if_else(pc.is_null(parents), pa.scalar(None, out.type), out)
    return out


def register_depths(con) -> None:
    """specaudit_depths(parents INTEGER[]) -> INTEGER[]: depths_udf as an Arrow UDF."""
    import duckdb
    integer = duckdb.sqltype("INTEGER") if hasattr(duckdb, "sqltype") else duckdb.typing.INTEGER
    il = duckdb.list_type(integer)
    con.create_function("specaudit_depths", depths_udf, [il], il, type="arrow",
                        null_handling="special", side_effects=False)


def register_agrees(con) -> None:
    """specaudit_agrees(reported DOUBLE, derived DOUBLE) -> 'agrees' | 'disagrees' | 'no verdict':
    specaudit.audit.compare.verdict, the rule every surface uses."""
    from specaudit.audit.compare import verdict
    con.create_function("specaudit_agrees", lambda r, d: verdict(r, d), ["DOUBLE", "DOUBLE"], "VARCHAR",
                        null_handling="special", side_effects=False)
