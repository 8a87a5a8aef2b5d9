"""Run in a virtual environment where pyspark 3.5 was installed before microbatch: the
install kept it, and a query runs on it (``make test-install-keeps-pyspark``)."""
import json
import sys
import tempfile
from pathlib import Path

import pyspark

from microbatch.api.session import StreamingSession

if not pyspark.__version__.startswith("3.5."):
    sys.exit(f"installing microbatch replaced PySpark 3.5 with {pyspark.__version__}")
with tempfile.TemporaryDirectory() as work:
    events = Path(work, "events")
    events.mkdir()
    (events / "a.json").write_text("\n".join(json.dumps({"id": i}) for i in range(5)) + "\n")
    ss = StreamingSession()
    query = (ss.readStream.schema("id INT").json(str(events)).selectExpr("id * 2 AS twice")
             .writeStream.format("memory").queryName("kept").option("checkpointLocation", str(Path(work, "ckpt")))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    rows = sorted(r.twice for r in ss.spark.sql("SELECT * FROM kept").collect())
    if rows != [0, 2, 4, 6, 8] or ss.spark.version != pyspark.__version__:
        sys.exit(f"a query on PySpark {pyspark.__version__} gave {rows}")
    print(f"kept PySpark {pyspark.__version__}; a query ran on it: {rows}")
