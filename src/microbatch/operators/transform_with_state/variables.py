"""A transformWithState's state variables, as its processor's ``init`` declares them
(collected on the driver, as Spark collects them before the query starts)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The store of a partition's timers (a name no state variable can take in Spark either).
TIMERS_STORE = "$timers"
#: With a TTL, a value, list element or map entry keeps when it expires (ms), as Spark's does.
EXPIRATION = "ttlExpirationMs"
VALUE, LIST, MAP = "value", "list", "map"


@dataclass(frozen=True)
class StateVariable:
    """A state variable as the processor's ``init`` declares it (collected on the driver,
    as Spark collects them before the query starts)."""

    name: str
    kind: str                      # value, list or map
    schema: Any                    # the value's (element's) StructType
    key_schema: Any = None         # a map state's user key StructType
    ttl_ms: int | None = None

    def describe(self) -> str:
        if self.kind == MAP:
            return f"{self.name}: map<{self.key_schema.simpleString()}, {self.schema.simpleString()}>"
        return f"{self.name}: {self.kind}<{self.schema.simpleString()}>"


def _struct(schema: Any) -> Any:
    from pyspark.sql.types import StructType
    if isinstance(schema, str):
        from microbatch import spark_internals
        return spark_internals.parse_schema_ddl(schema)
    if not isinstance(schema, StructType):
        raise TypeError(f"A state schema must be a StructType or a DDL string, not {schema!r}")
    return schema


def declared_state_variables(processor: Any, time_mode: str = "none") -> tuple[StateVariable, ...]:
    """The state variables the processor's ``init`` declares, found by running ``init`` on
    a copy of it with a declaring handle (Spark runs it on the driver the same way, to
    learn the state's schemas before the query starts)."""
    from copy import deepcopy

    from pyspark.sql.streaming.stateful_processor import (ListState, MapState, StatefulProcessorHandle,
                                                          ValueState)
    declared: dict[str, StateVariable] = {}
    deleted: set[str] = set()

    def declare(variable: StateVariable) -> None:
        if variable.ttl_ms is not None:
            if time_mode != "processingtime":
                from microbatch import spark_internals
                raise spark_internals.spark_error(
                    "AnalysisException", "STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL",
                    stateName=variable.name, timeMode="NoTime" if time_mode == "none" else "EventTime")
            if int(variable.ttl_ms) <= 0:
                raise ValueError(f"The TTL of the state variable {variable.name!r} must be positive, "
                                 f"not {variable.ttl_ms} ms.")
        if variable.name in declared and variable.name not in deleted:
            raise ValueError(f"The state variable {variable.name!r} is declared twice in init().")
        deleted.discard(variable.name)
        declared[variable.name] = variable

    class DeclaringHandle(StatefulProcessorHandle):
        def __init__(self):
            super().__init__(None)

        def getValueState(self, stateName, schema, ttlDurationMs=None):
            declare(StateVariable(stateName, VALUE, _struct(schema), ttl_ms=ttlDurationMs))
            return ValueState(None, stateName)

        def getListState(self, stateName, schema, ttlDurationMs=None):
            declare(StateVariable(stateName, LIST, _struct(schema), ttl_ms=ttlDurationMs))
            return ListState(None, stateName)

        def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
            declare(StateVariable(stateName, MAP, _struct(valueSchema), _struct(userKeySchema), ttlDurationMs))
            return MapState(None, stateName)

        def registerTimer(self, expiryTimestampMs):
            pass

        def deleteTimer(self, expiryTimestampMs):
            pass

        def listTimers(self):
            return iter([])

        def deleteIfExists(self, stateName):
            deleted.add(stateName)   # it may be declared again (an empty one)

    try:   # the user's instance stays as it was; its copies go to the tasks
        copy = deepcopy(processor)
    except Exception:  # noqa: BLE001 - an attribute that cannot be copied: declare on the instance
        copy = processor
    copy.init(DeclaringHandle())
    copy.close()
    if TIMERS_STORE in declared:
        raise ValueError(f"{TIMERS_STORE!r} is the timers' store: name the state variable otherwise.")
    return tuple(declared.values())
