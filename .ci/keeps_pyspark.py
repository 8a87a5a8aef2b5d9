"""Run in a virtual environment where pyspark 3.5 was installed before microbatch: the
install kept it, and a session refuses that Spark at start with a message naming what
is missing (``make test-install-keeps-pyspark``)."""
import sys

import pyspark

from microbatch.api.session import StreamingSession
from microbatch.errors import UnsupportedOperationError

if not pyspark.__version__.startswith("3.5."):
    sys.exit(f"installing microbatch replaced PySpark 3.5 with {pyspark.__version__}")
try:
    StreamingSession()
except UnsupportedOperationError as refused:
    assert "PySpark 4.1 to 4.3" in str(refused) and pyspark.__version__ in str(refused), refused
    print(f"kept PySpark {pyspark.__version__}; a session refuses it: {refused}")
else:
    sys.exit(f"a session started on PySpark {pyspark.__version__}, which microbatch does not support yet")
