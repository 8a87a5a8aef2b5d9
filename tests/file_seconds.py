"""Refresh ``file_seconds.json``, the order CI's workers take the test files in (the
longest first, ``conftest.pytest_collection_modifyitems``), from the JUnit XML of runs:

    .venv/bin/python -m pytest ... --junitxml=run.xml   # make test, test-faults, test-porting
    .venv/bin/python tests/file_seconds.py run.xml [more.xml ...]

Each file's seconds are the sum of its tests' (setup, call and teardown); files under 20
seconds are left out (they count as short). A file the runs did not hold keeps its old
number.
"""
from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TABLE = Path(__file__).parent / "file_seconds.json"


def seconds_by_file(paths: list[str]) -> dict[str, float]:
    seconds: collections.Counter = collections.Counter()
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            module = case.get("classname", "").split(".")
            # (a test function's classname is tests.test_x; a test class's, tests.test_x.TestY)
            name = next((part for part in module if part.startswith("test_")), None)
            if name:
                seconds[name + ".py"] += float(case.get("time", 0))
    return dict(seconds)


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit(__doc__)
    table = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    table.update({name: round(s) for name, s in seconds_by_file(paths).items()})
    table = {name: s for name, s in sorted(table.items(), key=lambda kv: -kv[1]) if s >= 20}
    TABLE.write_text(json.dumps(table, indent=0) + "\n")
    print(f"{TABLE}: {len(table)} files, {sum(table.values())} s")


if __name__ == "__main__":
    main(sys.argv[1:])
