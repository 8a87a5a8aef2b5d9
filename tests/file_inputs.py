"""Deterministic input files for file source tests (distinct modification times)."""
from __future__ import annotations

import json
import os
import time

BASE_MTIME = time.time() - 100_000


def write_json_files(directory, first: int, count: int, rows_per_file: int = 3,
                     mtime_base: float = BASE_MTIME) -> list[dict]:
    """Write files ``f<first>.json``..; file i holds ids ``i*100 .. i*100+rows-1``.

    File i gets modification time ``mtime_base + i`` seconds, so the order Spark and
    microbatch take them in is the file number. Returns the rows written.
    """
    os.makedirs(directory, exist_ok=True)
    rows = []
    for i in range(first, first + count):
        path = os.path.join(directory, f"f{i:03d}.json")
        file_rows = [{"id": i * 100 + j, "name": f"n{i}"} for j in range(rows_per_file)]
        tmp = os.path.join(directory, f".f{i:03d}.json.tmp")  # hidden: never listed
        with open(tmp, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in file_rows))
        os.utime(tmp, (mtime_base + i, mtime_base + i))
        os.replace(tmp, path)
        rows.extend(file_rows)
    return rows
