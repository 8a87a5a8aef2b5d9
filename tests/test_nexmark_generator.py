"""The ``nexmark`` source's generator, without Spark: ``JavaRandoms`` draws what Java's own
``java.util.Random`` draws (a JVM run at test time); ``generate`` gives, field by field,
the events of the scalar oracle (tests/nexmark_oracle.py, itself checked against the JVM
release-0.1 generator) at the start of the stream, far into it and at low rates (the
``nextLong`` branch of auction expiry); it agrees with the JVM's own first 100 events
(tests/data/nexmark_jvm_first100.jsonl) on every field both make the same way; any split
of a range of events gives the same rows; the ``events`` view has Flink's ``datagen``
columns, with only the struct of each event's type set."""
from __future__ import annotations

import json
import random
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import nexmark_oracle as oracle
from microbatch.sources.nexmark.generator import EVENTS_SCHEMA, NexmarkConfig, generate
from microbatch.sources.nexmark.java_random import JavaRandoms

JVM_VECTOR = Path(__file__).with_name("data") / "nexmark_jvm_first100.jsonl"
BASE_TIME = 1_700_000_000_000
TYPE_NAMES = ("person", "auction", "bid")      # event_type 0, 1, 2 (Flink's datagen numbering)
REJECTING_BOUND = (1 << 30) + 1   # nextInt rejects every u >= bound: about half of the draws


# -- java.util.Random ---------------------------------------------------------------------------

JAVA_PROBE = """
import java.util.Random;

public class JavaRandomProbe {
    public static void main(String[] args) {
        int[] bounds = {13, 26, 2, 4, 1, 10000, (1 << 30) + 1};
        StringBuilder out = new StringBuilder();
        for (String arg : args) {
            String[] parts = arg.split(":");
            long seed = Long.parseLong(parts[0]);
            int ownBound = Integer.parseInt(parts[1]);
            Random r = new Random(seed);
            out.append(seed);
            for (int b : bounds) out.append(' ').append(r.nextInt(b));
            out.append(' ').append(r.nextInt());
            out.append(' ').append(r.nextLong());
            out.append(' ').append(Double.toString(r.nextDouble()));
            // draws only some generators make (the generator's masked draws)
            int k = r.nextInt(3);
            out.append(' ').append(k);
            for (int i = 0; i < 2; i++) out.append(' ').append(i < k ? r.nextInt((1 << 30) + 1) : -1);
            out.append(' ').append(r.nextInt(ownBound));
            out.append(' ').append(Double.toString(r.nextDouble()));
            out.append('\\n');
        }
        System.out.print(out);
    }
}
"""


def probe_seeds() -> list[int]:
    """~200 seeds: 0, small, negative, large, the int64 extremes, 2^48 (the same state as 0)."""
    seeds = [0, 1, -1, 42, 2 ** 47 + 5, -2 ** 40, 2 ** 48, 2 ** 63 - 1, -2 ** 63, 2 ** 31, -2 ** 31 - 1]
    rng = random.Random(20240601)
    seeds += [rng.randrange(-2 ** 63, 2 ** 63) for _ in range(120)]
    seeds += [rng.randrange(-10 ** 6, 10 ** 6) for _ in range(69)]
    return seeds


def own_bound(i: int) -> int:
    """A bound per generator: powers of two (including 1) and others, some rejecting often."""
    return 1 << (i % 31) if i % 3 == 0 else 1 + (i * 7919 * 104729) % 2_000_000_000


def draws_in_python(rnd, seeds, bounds):
    """The probe's calls on ``JavaRandoms`` (all generators at once): one list per seed."""
    columns = [rnd.next_int(b) for b in (13, 26, 2, 4, 1, 10000, REJECTING_BOUND)]
    columns += [rnd.next_int_unbounded(), rnd.next_long(), rnd.next_double()]
    k = rnd.next_int(3)
    columns.append(k)
    for i in range(2):
        masked = np.full(len(seeds), -1, dtype=np.int64)
        masked[k > i] = rnd.next_int(REJECTING_BOUND, where=k > i)
        columns.append(masked)
    columns += [rnd.next_int(np.asarray(bounds, dtype=np.int64)), rnd.next_double()]
    return [[column[j] for column in columns] for j in range(len(seeds))]


def draws_in_oracle(seed, bound):
    """The same calls on the oracle's scalar ``JavaRandom``; also how many of its
    ``nextInt(REJECTING_BOUND)`` calls rejected a draw: (all generators', masked ones')."""
    r = oracle.JavaRandom(seed)
    rejections = [0, 0]

    def rejecting(masked):
        before = r.steps
        value = r.nextInt(REJECTING_BOUND)
        rejections[masked] += r.steps - before > 1
        return value

    values = [r.nextInt(b) for b in (13, 26, 2, 4, 1, 10000)] + [rejecting(False)]
    values += [r.nextInt(), r.nextLong(), r.nextDouble()]
    k = r.nextInt(3)
    values.append(k)
    values += [rejecting(True) if i < k else -1 for i in range(2)]
    values += [r.nextInt(bound), r.nextDouble()]
    return values, rejections


def parse_java_line(line: str) -> list:
    fields = line.split()
    doubles = {10, 15}       # positions of the probe's nextDouble() values
    return [float(f) if i in doubles else int(f) for i, f in enumerate(fields)]


def test_java_randoms_draw_what_java_util_random_draws(tmp_path):
    java = shutil.which("java")
    if java is None:
        if os.environ.get("CI"):   # (Spark needs Java: under CI its absence is a broken machine)
            raise RuntimeError("no `java` on PATH: Java 17 is the project's requirement")
        pytest.skip("no `java` on PATH: cannot compare JavaRandoms with java.util.Random")
    seeds = probe_seeds()
    bounds = [own_bound(i) for i in range(len(seeds))]
    source = tmp_path / "JavaRandomProbe.java"
    source.write_text(JAVA_PROBE)
    run = subprocess.run([java, str(source)] + [f"{s}:{b}" for s, b in zip(seeds, bounds)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    java_rows = [parse_java_line(line) for line in run.stdout.splitlines()]
    assert [row[0] for row in java_rows] == seeds
    java_rows = [row[1:] for row in java_rows]

    numpy_rows = draws_in_python(JavaRandoms(np.array(seeds, dtype=np.int64)), seeds, bounds)
    mismatches = [(seed, j, want, got)
                  for seed, want_row, got_row in zip(seeds, java_rows, numpy_rows)
                  for j, (want, got) in enumerate(zip(want_row, got_row)) if want != got]
    assert not mismatches, mismatches[:10]
    # the doubles compare exactly: Double.toString names one double, and float() reads it back
    assert all(type(row[9]) is float and 0.0 <= row[9] < 1.0 for row in java_rows)

    # the oracle's scalar Random is Java's too; and the rejection loop really ran, also
    # in the draws only some generators made
    rejections = np.zeros(2, dtype=int)
    for seed, bound, want_row in zip(seeds, bounds, java_rows):
        values, rejected = draws_in_oracle(seed, bound)
        assert values == want_row, seed
        rejections += rejected
    assert rejections[0] > 50 and rejections[1] > 20, rejections


# -- generate() against the oracle --------------------------------------------------------------

def oracle_config(c: NexmarkConfig) -> oracle.Config:
    """The oracle's view of microbatch's configuration: Flink release 0.1 with one
    generator, plus the channel draws microbatch makes (``flink_channel``)."""
    return oracle.Config("flink01", base_time=c.base_time_ms, first_event_id=c.first_event_id,
                         first_event_number=c.first_event_number, first_event_rate=c.events_per_second,
                         num_event_generators=1, flink_channel=True)


def _int_timestamps(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _int_timestamps(f.type)) for f in t])
    return t


def rows(batch: pa.RecordBatch) -> list[dict]:
    """The batch's rows, timestamps as int64 microseconds."""
    table = pa.Table.from_batches([batch])
    target = pa.schema([pa.field(f.name, _int_timestamps(f.type)) for f in table.schema])
    return table.cast(target).to_pylist()


def mismatches_with_oracle(c: NexmarkConfig, first: int, count: int, trace: bool = False):
    """(mismatches, the oracle's events) for events ``first`` .. ``first + count - 1``."""
    want = oracle.generate(oracle_config(c), count, trace=trace, first=first)
    got = rows(generate(c, first, first + count))
    assert len(got) == len(want)
    bad = []
    for k, (w, g) in enumerate(zip(want, got), start=first):
        kind = w["type"]
        if TYPE_NAMES[g["event_type"]] != kind:
            bad.append((k, "event_type", kind, g["event_type"]))
            continue
        row = g[kind]
        if g["dateTime"] != w["dateTime"] * 1000:
            bad.append((k, "dateTime (event)", w["dateTime"], g["dateTime"]))
        for field, value in w.items():
            if field.startswith("_") or field == "type":
                continue
            if field == "url":     # the oracle has no URL tables (Flink's are unseeded)
                assert value is None and row["url"].startswith("https://www.nexmark.com/")
                continue
            if field in ("dateTime", "expires"):
                value *= 1000      # ms in the oracle, us in Arrow
            if row[field] != value:
                bad.append((k, f"{kind}.{field}", value, row[field]))
    return bad, want


def test_generate_equals_the_oracle_from_the_start():
    c = NexmarkConfig(base_time_ms=BASE_TIME)
    bad, want = mismatches_with_oracle(c, 0, 20_000)
    assert not bad, bad[:10]
    assert {e["type"] for e in want} == set(TYPE_NAMES)


def test_generate_equals_the_oracle_far_into_the_stream():
    c = NexmarkConfig(base_time_ms=BASE_TIME)
    bad, want = mismatches_with_oracle(c, 10 ** 9, 3_000)
    assert not bad, bad[:10]
    assert want[0]["dateTime"] == BASE_TIME + (10 ** 9 + 1) // 10   # 100 us an event


def auctions_drawing_next_long(events) -> int:
    return sum(1 for e in events if e["type"] == "auction"
               and any(name == "nextLong" for name, _, _ in e["_calls"]))


class RejectionCountingRandom(oracle.JavaRandom):
    """The oracle's Random, counting the ``nextInt(bound)`` calls that rejected a draw."""
    rejections = 0

    def nextInt(self, bound=None):
        before = self.steps
        value = super().nextInt(bound)
        if bound is not None and self.steps - before > 1:
            RejectionCountingRandom.rejections += 1
        return value


@pytest.mark.parametrize("rate, next_long, rejects", [
    # 1 event/s: an auction's horizon is the time of 1666 events, 1666 s; twice that in ms
    # (3.3e6) is still below 2^31 - 1, so the expiry is nextInt(bound) with large bounds
    (1.0, False, False),
    # 1 event per 100 s: the expiry is nextInt(~3.3e8), which rejects ~15% of its draws
    # (the defaults' small bounds never reject in a few thousand events)
    (0.01, False, True),
    # 1 event per 1000 s: 2 * 1.666e9 ms >= 2^31 - 1, so LongGenerator.nextLong takes its
    # abs(nextLong() % n) branch (the spec's "rate 1, 1000 generators" check: the same delay)
    (0.001, True, False),
])
def test_generate_equals_the_oracle_at_low_rates(rate, next_long, rejects, monkeypatch):
    monkeypatch.setattr(oracle, "JavaRandom", RejectionCountingRandom)
    monkeypatch.setattr(RejectionCountingRandom, "rejections", 0)
    c = NexmarkConfig(base_time_ms=BASE_TIME, events_per_second=rate)
    bad, want = mismatches_with_oracle(c, 0, 3_000, trace=True)
    assert not bad, bad[:10]
    auctions = sum(1 for e in want if e["type"] == "auction")
    assert auctions_drawing_next_long(want) == (auctions if next_long else 0)
    assert (RejectionCountingRandom.rejections > 0) == rejects
    lengths = [e["expires"] - e["dateTime"] for e in want if e["type"] == "auction"]
    assert max(lengths) > (2 ** 31 if next_long else 1_000_000)   # the long horizons were drawn


# -- the JVM's own events -----------------------------------------------------------------------

def test_generate_agrees_with_the_jvm_first_100_events():
    """The vector is release 0.1 run in a JVM as the Flink SQL source sets it up (first event
    id 1, first event number 1, 10000 events/s, base time 0). Release 0.1's bids have no
    channel/url and add FIRST_PERSON_ID to the bidder once; microbatch (like Flink's later
    generator) adds it twice and draws the channel after the price, before ``extra``: so a
    bid's ``extra`` comes from a later point of its Random and differs from the vector's. The
    oracle without and with those channel draws shows which fields they leave alone."""
    vector = [json.loads(line) for line in JVM_VECTOR.read_text().splitlines()]
    assert len(vector) == 100

    release01 = oracle.generate(oracle.Config("flink01", base_time=0, first_event_id=1, first_event_number=1,
                                              num_event_generators=1), 100)
    with_channel = oracle.generate(oracle.Config("flink01", base_time=0, first_event_id=1, first_event_number=1,
                                                 num_event_generators=1, flink_channel=True), 100)
    assert [{k: v for k, v in e.items() if k != "_eventId"} for e in release01] == vector

    # the channel draws come after auction, bidder and price: those draw the same; only the
    # bidder's constant, the channel/url and the extra (drawn after them) change
    extras_differ = 0
    for plain, channelled in zip(release01, with_channel):
        if plain["type"] != "bid":
            assert plain == channelled
            continue
        assert {k: channelled[k] for k in plain if k not in ("bidder", "extra")} == \
            {k: plain[k] for k in plain if k not in ("bidder", "extra")}
        assert channelled["bidder"] == plain["bidder"] + 1000
        extras_differ += channelled["extra"] != plain["extra"]
    assert extras_differ > 0.9 * sum(e["type"] == "bid" for e in vector)

    got = rows(generate(NexmarkConfig(base_time_ms=0), 0, 100))
    for k, (want, g) in enumerate(zip(vector, got)):
        kind = want["type"]
        assert TYPE_NAMES[g["event_type"]] == kind, k
        row = g[kind]
        assert g["dateTime"] == want["dateTime"] * 1000, k
        for field, value in want.items():
            if field in ("type", "_watermark"):
                continue
            if kind == "bid" and field == "extra":
                continue          # drawn after microbatch's channel draws: different by construction
            if kind == "bid" and field == "bidder":
                value += 1000     # Flink >= 0.2 adds FIRST_PERSON_ID twice; release 0.1 once
            if field in ("dateTime", "expires"):
                value *= 1000
            assert row[field] == value, (k, kind, field, value, row[field])


# -- splits and views -----------------------------------------------------------------------------

VIEWS = ("events", "person", "auction", "bid")
#: uneven sub-ranges of [0, 6000), an empty one among them
SPLITS = (0, 1, 7, 7, 50, 1234, 1235, 4001, 6000)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("offset", [0, 987_654_321])
def test_any_split_gives_the_same_rows(view, offset):
    c = NexmarkConfig(base_time_ms=BASE_TIME)
    whole = generate(c, offset + SPLITS[0], offset + SPLITS[-1], view)
    parts = [generate(c, offset + a, offset + b, view) for a, b in zip(SPLITS, SPLITS[1:])]
    assert all(p.schema == whole.schema for p in parts)
    joined = pa.Table.from_batches(parts, schema=whole.schema).combine_chunks()
    assert joined.equals(pa.Table.from_batches([whole]).combine_chunks())


@pytest.mark.parametrize("first", [0, 10 ** 6 + 3])
def test_each_type_view_is_the_events_views_structs_of_that_type(first):
    c = NexmarkConfig(base_time_ms=BASE_TIME)
    events = generate(c, first, first + 5_000)
    for code, name in enumerate(TYPE_NAMES):
        structs = events.column(name).filter(pc.equal(events.column("event_type"), code))
        expected = pa.RecordBatch.from_struct_array(structs)
        view = generate(c, first, first + 5_000, name)
        assert view.num_rows == expected.num_rows > 0
        assert view.equals(expected), name


def test_events_view_has_flinks_datagen_columns_and_one_struct_per_row():
    c = NexmarkConfig(base_time_ms=BASE_TIME)
    events = generate(c, 0, 5_000)
    assert events.schema.names == ["event_type", "person", "auction", "bid", "dateTime"]
    assert events.schema == EVENTS_SCHEMA
    types = events.column("event_type").to_numpy()
    assert set(np.unique(types)) == {0, 1, 2}
    # proportions 1 : 3 : 46 in every 50 events
    assert [int((types == code).sum()) for code in range(3)] == [100, 300, 4600]
    for code, name in enumerate(TYPE_NAMES):
        valid = pc.is_valid(events.column(name)).to_numpy(zero_copy_only=False)
        assert (valid == (types == code)).all(), name
        structs = events.column(name).filter(pc.is_valid(events.column(name)))
        assert structs.field("dateTime").equals(
            events.column("dateTime").filter(pc.is_valid(events.column(name))))


def test_scatter_spreads_rows_without_copying_strings_and_equals_a_take():
    """``_scatter`` (the ``events`` view's struct columns) gives what a ``take`` with nulls
    gives, for the fields it spreads by hand (strings, int32/int64, timestamps) and for any
    other (a double, a string slice: the ``take`` path)."""
    from microbatch.sources.nexmark.generator import _scatter
    strings = pa.array(["x", "", "yz", "héllo", "w"])
    rows = pa.StructArray.from_arrays(
        [strings, pa.array([1, 2, 3, 4, 5], pa.int32()), pa.array([10, 20, 30, 40, 50], pa.int64()),
         pa.array([1, 2, 3, 4, 5], pa.timestamp("us", tz="UTC")), pa.array([0.5, 1.5, 2.5, 3.5, 4.5]),
         pa.array(["", "a", "b", "c", "d", "e"])[1:]],
        names=["s", "i", "l", "t", "d", "sliced"])
    pick = np.array([False, True, True, False, False, True, False, True, True, False])
    positions = np.full(len(pick), -1)
    positions[pick] = np.arange(5)
    want = rows.take(pa.array(positions, mask=~pick))
    got = _scatter(rows, pick, rows.type)
    assert got.equals(want)
    assert got.to_pylist()[1] == {"s": "x", "i": 1, "l": 10, "t": want[1]["t"].as_py(), "d": 0.5, "sliced": "a"}
    assert got.field(0).buffers()[2].address == strings.buffers()[2].address   # the strings were not copied
    assert _scatter(rows.slice(0, 0), np.zeros(3, dtype=bool), rows.type).null_count == 3


def test_scatter_keeps_strings_whose_offsets_do_not_start_at_zero():
    """A string field built over a shared data buffer (offsets from 3, not 0), and one whose
    strings are all empty (an empty data buffer)."""
    from microbatch.sources.nexmark.generator import _scatter
    shifted = pa.StringArray.from_buffers(2, pa.py_buffer(np.array([3, 5, 6], dtype=np.int32)),
                                          pa.py_buffer(b"abcdef"))
    empty = pa.array(["", ""])
    rows = pa.StructArray.from_arrays([shifted, empty], names=["s", "e"])
    pick = np.array([False, True, False, True])
    got = _scatter(rows, pick, rows.type)
    assert got.to_pylist() == [None, {"s": "de", "e": ""}, None, {"s": "f", "e": ""}]


def test_next_ints_unbounded_is_count_calls_of_next_int():
    seeds = np.array([0, 1, -5, 2**40 + 7, -(2**62)], dtype=np.int64)
    one_by_one = JavaRandoms(seeds)
    want = np.stack([one_by_one.next_int_unbounded() for _ in range(4)], axis=1)
    at_once = JavaRandoms(seeds)
    got = at_once.next_ints_unbounded(4)
    assert got.dtype == np.int32 and (got == want).all()
    assert (got < 0).any()                                   # the signed cast is exercised
    assert (at_once.next_int(1000) == one_by_one.next_int(1000)).all()   # the states agree after
