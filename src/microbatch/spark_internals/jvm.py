"""The JVM behind the SparkContext: its classes, looked up once, and Scala values."""
from __future__ import annotations

import weakref
from typing import Any, Mapping

try:
    from pyspark import SparkContext
except ImportError:   # PySpark's client for Spark Connect alone (pyspark-client): no JVM classes
    SparkContext = None


def _jvm():
    jvm = None if SparkContext is None else SparkContext._jvm
    if jvm is None:
        from pyspark.sql.utils import is_remote
        if is_remote():   # a Spark Connect client: what needs the JVM does not run over Connect
            from microbatch.spark_internals.connect.support import refuse
            refuse("This step (it needs the JVM of a classic session)")
        raise RuntimeError("No active SparkContext: start a SparkSession first.")
    return jvm


#: JVM classes and Scala objects by name, per JVM (``jvm_class``)
_JVM_NAMES: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def jvm_class(path: str) -> Any:
    """The JVM class named ``path`` (``"java.util.HashMap"``), or the Scala object when
    the name ends in ``$`` (its ``MODULE$``), looked up once per JVM: py4j resolves each
    dotted name in a round trip, 1-2 ms for a class."""
    jvm = _jvm()
    known = _JVM_NAMES.setdefault(jvm, {})
    found = known.get(path)
    if found is None:
        found = jvm
        for part in path.split("."):
            found = getattr(found, part)
        if path.endswith("$"):
            found = getattr(found, "MODULE$")
        known[path] = found
    return found


def scala_map(values: Mapping[str, str]) -> Any:
    """A ``scala.collection.immutable.Map[String, String]``."""
    java_map = jvm_class("java.util.HashMap")()
    for key, value in values.items():
        java_map.put(str(key), str(value))
    return jvm_class("org.apache.spark.api.python.PythonUtils").toScalaMap(java_map)


def jvm_started() -> bool:
    """Whether a SparkContext's JVM runs in this process."""
    return SparkContext is not None and SparkContext._jvm is not None
