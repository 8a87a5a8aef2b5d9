"""Nexmark's events, generated a range of event numbers at a time, vectorised.

The reference is the deterministic Nexmark generator: Apache Beam's, which the Flink
Nexmark project (``nexmark/nexmark``) ported and ran until its release 0.1. Each event
draws its fields from a ``java.util.Random`` seeded with the event's id, so an event is a
function of its number alone: a batch re-run regenerates the same events, and any split
of the numbers across tasks gives the same stream. It is set up as the Flink SQL
source sets it up with one generator (first event id 1, first event number 1, the
double inter-event delay ``1e6 / eventsPerSecond`` microseconds), so the stream is the one
Flink's ``datagen`` table yields at parallelism 1, up to the fields below.

Flink's generator after release 0.1 adds the bids' ``channel`` and ``url`` (and adds
1000 to ``bidder`` twice); it draws them from an unseeded random stream, so no run of it
repeats another. microbatch draws the channel with the same calls from the event's own
``Random`` (after the price, before ``extra``, where Flink makes them) and keeps Flink's
bidder ids; the URL tables, which Flink builds from an unseeded stream, are built from
``Random``s seeded with the channel number (the hot URLs with -1..-4). The ``extra``
padding is release 0.1's (Flink's newest cuts it from a shared random pool).

Every draw is replayed for all the events of a type at once (numpy), in the reference's
order; a draw that only some events make (the cold branch of a hot/cold choice, a
string's next character) advances only their generators.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from microbatch.sources.nexmark.java_random import JavaRandoms

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = HOT_AUCTION_RATIO = HOT_BIDDER_RATIO = 100
MIN_STRING_LENGTH = 3
CHANNELS_NUMBER = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle",
             "Kent", "Cheyenne")

PERSON, AUCTION, BID = 0, 1, 2   #: event_type, as Flink's datagen table numbers them

TIMESTAMP = pa.timestamp("us", tz="UTC")
PERSON_TYPE = pa.struct([("id", pa.int64()), ("name", pa.string()), ("emailAddress", pa.string()),
                         ("creditCard", pa.string()), ("city", pa.string()), ("state", pa.string()),
                         ("dateTime", TIMESTAMP), ("extra", pa.string())])
AUCTION_TYPE = pa.struct([("id", pa.int64()), ("itemName", pa.string()), ("description", pa.string()),
                          ("initialBid", pa.int64()), ("reserve", pa.int64()), ("dateTime", TIMESTAMP),
                          ("expires", TIMESTAMP), ("seller", pa.int64()), ("category", pa.int64()),
                          ("extra", pa.string())])
BID_TYPE = pa.struct([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                      ("channel", pa.string()), ("url", pa.string()), ("dateTime", TIMESTAMP),
                      ("extra", pa.string())])
EVENTS_SCHEMA = pa.schema([("event_type", pa.int32()), ("person", PERSON_TYPE), ("auction", AUCTION_TYPE),
                           ("bid", BID_TYPE), ("dateTime", TIMESTAMP)])
VIEW_SCHEMAS = {"person": pa.schema(list(PERSON_TYPE)), "auction": pa.schema(list(AUCTION_TYPE)),
                "bid": pa.schema(list(BID_TYPE)), "events": EVENTS_SCHEMA}


@dataclass(frozen=True)
class NexmarkConfig:
    """The generator's parameters (Nexmark's ``NexmarkConfiguration`` names in comments)."""
    base_time_ms: int                      #: the event time of event number 0 (baseTime)
    events_per_second: float = 10_000.0    #: firstEventRate = nextEventRate
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    first_event_id: int = 1                #: as the Flink SQL source sets it
    first_event_number: int = 1

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def inter_event_delay_us(self) -> float:
        return 1_000_000.0 / self.events_per_second

    def timestamp_ms(self, event_number: np.ndarray) -> np.ndarray:
        """``timestampForEvent``: base time + (long)(n * delay) / 1000."""
        product = np.trunc(np.asarray(event_number, dtype=np.float64) * self.inter_event_delay_us)
        return self.base_time_ms + product.astype(np.int64) // 1000

    def event_time_ms(self, count: int) -> int:
        """The event time of the ``count``-th event (0-based) of the stream."""
        return int(self.timestamp_ms(np.array([self.first_event_number + count]))[0])


# -- strings -------------------------------------------------------------------------------------
def _strings(chars: np.ndarray, keep: np.ndarray) -> pa.Array:
    """Arrow strings of each row's ``chars`` (uint8 codes) where ``keep``, in order."""
    lengths = keep.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = np.ascontiguousarray(chars[keep], dtype=np.uint8)
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data))


def _table_strings(table: tuple[str, ...], index: np.ndarray) -> pa.Array:
    return pa.array(np.asarray(table, dtype=object)[index], pa.string())


def _next_string(rnd: JavaRandoms, max_length: int, special: str = " ") -> tuple[np.ndarray, np.ndarray]:
    """``nextString(random, maxLength, special)`` for every generator: (chars, keep), trimmed
    of leading and trailing spaces as Java's ``trim`` does."""
    n = len(rnd)
    length = MIN_STRING_LENGTH + rnd.next_int(max_length - MIN_STRING_LENGTH)
    width = max_length - 1
    chars = np.zeros((n, width), dtype=np.uint8)
    for j in range(width):
        active = length > j
        if not active.any():
            break
        is_special = np.zeros(n, dtype=bool)
        is_special[active] = rnd.next_int(13, where=active) == 0
        letter = active & ~is_special
        chars[is_special, j] = ord(special)
        if letter.any():
            chars[letter, j] = ord("a") + rnd.next_int(26, where=letter)
    columns = np.arange(width)
    inside = columns[None, :] < length[:, None]
    if special == " ":
        solid = inside & (chars != ord(" "))
        any_solid = solid.any(axis=1)
        first = np.where(any_solid, solid.argmax(axis=1), width)
        last = np.where(any_solid, width - 1 - solid[:, ::-1].argmax(axis=1), -1)
        inside = (columns[None, :] >= first[:, None]) & (columns[None, :] <= last[:, None])
    return chars, inside


def _next_exact_string(rnd: JavaRandoms, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``nextExactString(random, size)``: six characters from each ``nextInt()``, the
    remainders of Java's truncating division by 26 (negative ones give 'H'..'`').

    It is every event's last draw (the ``extra`` padding), so every generator draws as
    many ``nextInt()`` as the longest string needs: the draws a shorter string does not
    use only advance its own generator past the event's end, and are never read."""
    n = len(rnd)
    width = int(size.max()) if n else 0
    draws = (width + 5) // 6
    values = rnd.next_ints_unbounded(draws)                  # (n, draws) int32
    unsigned = values.view(np.uint32)
    negative = values < 0
    quotient = np.where(negative, -unsigned, unsigned)         # |value|: 2^31 fits in uint32
    # 'a' + digit, or 'a' - digit for a negative value: in uint8, -d is (d ^ 0xFF) + 1
    flip = negative.astype(np.uint8) * np.uint8(0xFF)
    base = np.uint8(ord("a")) + negative.astype(np.uint8)
    letters = np.empty((n, draws, 6), dtype=np.uint8)
    twenty_six = np.uint32(26)
    for k in range(6):   # each draw's characters, lowest digit first
        next_quotient = quotient // twenty_six
        digit = (quotient - next_quotient * twenty_six).astype(np.uint8)
        quotient = next_quotient
        letters[:, :, k] = (digit ^ flip) + base
    chars = letters.reshape(n, draws * 6)[:, :width]
    keep = np.arange(width)[None, :] < size[:, None]
    return chars, keep


def _next_extra(rnd: JavaRandoms, current_size: np.ndarray, average: int) -> pa.Array:
    """``nextExtra``: padding towards ``average`` bytes (no draw when already larger)."""
    current_size = np.broadcast_to(np.asarray(current_size, dtype=np.int64), (len(rnd),))
    wanted = average - current_size
    delta = np.floor(wanted * 0.2 + 0.5).astype(np.int64)       # Math.round
    size = wanted - delta
    drawn = (current_size <= average) & (delta != 0)
    if drawn.any():
        size[drawn] += rnd.next_int(2 * delta[drawn], where=drawn)
    size = np.where(current_size > average, 0, size)
    chars, keep = _next_exact_string(rnd, size)
    return _strings(chars, keep)


def _next_price(rnd: JavaRandoms, where: np.ndarray | None = None) -> np.ndarray:
    return np.floor(np.power(10.0, rnd.next_double(where=where) * 6.0) * 100.0 + 0.5).astype(np.int64)


def _next_long(rnd: JavaRandoms, bound: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``LongGenerator.nextLong(random, n)`` for the generators ``where`` selects (their
    ``bound``s): ``nextInt`` below 2^31 - 1, else ``abs(nextLong() % n)``."""
    small = bound < 2_147_483_647
    result = np.zeros(len(bound), dtype=np.int64)
    # the two branches never meet in one event: each generator makes exactly one call
    selected = where.copy()
    if (selected & small).any():
        pick = selected & small
        result[pick] = rnd.next_int(bound[pick], where=pick)
    if (selected & ~small).any():
        pick = selected & ~small
        drawn = rnd.next_long(where=pick)
        result[pick] = np.abs(np.fmod(drawn, bound[pick]))
    return result


# -- ids -------------------------------------------------------------------------------------------
def _last_base0_person_id(c: NexmarkConfig, event_id: np.ndarray) -> np.ndarray:
    epoch, offset = np.divmod(event_id, c.total_proportion)
    offset = np.minimum(offset, c.person_proportion - 1)
    return epoch * c.person_proportion + offset


def _last_base0_auction_id(c: NexmarkConfig, event_id: np.ndarray) -> np.ndarray:
    epoch, offset = np.divmod(event_id, c.total_proportion)
    person = offset < c.person_proportion
    bid = offset >= c.person_proportion + c.auction_proportion
    epoch = np.where(person, epoch - 1, epoch)
    offset = np.where(person | bid, c.auction_proportion - 1, offset - c.person_proportion)
    return epoch * c.auction_proportion + offset


def _next_base0_person_id(c, event_id, rnd, where) -> np.ndarray:
    num_people = _last_base0_person_id(c, event_id) + 1
    active = np.minimum(num_people, c.num_active_people)
    return num_people - active + _next_long(rnd, active + PERSON_ID_LEAD, where)


def _next_base0_auction_id(c, event_id, rnd, where) -> np.ndarray:
    max_auction = _last_base0_auction_id(c, event_id)
    min_auction = np.maximum(max_auction - c.num_in_flight_auctions, 0)
    return min_auction + _next_long(rnd, max_auction - min_auction + 1 + AUCTION_ID_LEAD, where)


def _hot_or_drawn(rnd: JavaRandoms, ratio: int, hot: np.ndarray, draw) -> np.ndarray:
    """Nexmark's hot/cold choice: ``nextInt(ratio) > 0`` keeps the hot id; the others
    (``cold``) take ``draw(cold)``, which advances only their generators."""
    cold = rnd.next_int(ratio) == 0
    return np.where(cold, draw(cold), hot) if cold.any() else hot


# -- URLs ------------------------------------------------------------------------------------------
_URLS: dict[str, np.ndarray] = {}


def _base_urls(seeds: np.ndarray) -> np.ndarray:
    rnd = JavaRandoms(seeds)
    parts = []
    for _ in range(3):
        chars, keep = _next_string(rnd, 5, "_")
        parts.append(_strings(chars, keep).to_numpy(zero_copy_only=False))
    return np.asarray(["https://www.nexmark.com/" + a + "/" + b + "/" + d + "/item.htm?query=1"
                       for a, b, d in zip(*parts)], dtype=object), rnd


def _channel_urls() -> tuple[np.ndarray, np.ndarray]:
    """(hot URLs, the URL of each channel number), as Flink's tables are made, seeded."""
    if not _URLS:
        hot, _ = _base_urls(np.array([-1, -2, -3, -4]))
        channels = np.arange(CHANNELS_NUMBER, dtype=np.int64)
        urls, rnd = _base_urls(channels)
        with_id = rnd.next_int(10) > 0
        reversed_ids = np.array([_reverse_int(int(c)) for c in channels], dtype=np.int64)
        suffix = np.char.add("&channel_id=", np.abs(reversed_ids).astype(str)).astype(object)
        _URLS["hot"] = hot
        _URLS["channels"] = np.where(with_id, urls + suffix, urls)
    return _URLS["hot"], _URLS["channels"]


_CHANNEL_TABLES: list[pa.Array] = []


def _channel_tables() -> tuple[pa.Array, pa.Array]:
    """(channel names, URLs) as Arrow arrays: the channel numbers 0 .. 9999, then the hot
    channels (index ``CHANNELS_NUMBER + i``): a bid's channel and URL are a ``take``."""
    if not _CHANNEL_TABLES:
        hot_urls, channel_urls = _channel_urls()
        names = [f"channel-{number}" for number in range(CHANNELS_NUMBER)] + list(HOT_CHANNELS)
        _CHANNEL_TABLES.extend([pa.array(names, pa.string()),
                                pa.array(list(channel_urls) + list(hot_urls), pa.string())])
    return _CHANNEL_TABLES[0], _CHANNEL_TABLES[1]


def _reverse_int(value: int) -> int:
    """Java's ``Integer.reverse`` (as a signed int); ``Math.abs`` of MIN_VALUE stays negative."""
    bits = int(f"{value & 0xFFFFFFFF:032b}"[::-1], 2)
    return bits - (1 << 32) if bits >= 1 << 31 else bits


# -- events ----------------------------------------------------------------------------------------
def _persons(c: NexmarkConfig, event_id: np.ndarray, timestamp: pa.Array) -> pa.StructArray:
    rnd = JavaRandoms(event_id)
    first, last = rnd.next_int(len(FIRST_NAMES)), rnd.next_int(len(LAST_NAMES))
    names = pa.compute.binary_join_element_wise(_table_strings(FIRST_NAMES, first),
                                                _table_strings(LAST_NAMES, last), " ")
    user = _strings(*_next_string(rnd, 7))
    host = _strings(*_next_string(rnd, 5))
    emails = pa.compute.binary_join_element_wise(user, "@", host, ".com", "")
    cards = [rnd.next_int(10000) for _ in range(4)]
    if len(rnd):   # (np.char.zfill fails on an empty array: a range with no person)
        cards = [np.char.zfill(card.astype(str), 4) for card in cards]
    credit = pa.array([" ".join(parts) for parts in zip(*cards)], pa.string())
    city = _table_strings(US_CITIES, rnd.next_int(len(US_CITIES)))
    state = _table_strings(US_STATES, rnd.next_int(len(US_STATES)))
    size = 8 + sum(pa.compute.utf8_length(a).to_numpy(zero_copy_only=False).astype(np.int64)
                   for a in (names, emails, credit, city, state))
    extra = _next_extra(rnd, size, c.avg_person_bytes)
    ids = _last_base0_person_id(c, event_id) + FIRST_PERSON_ID
    return pa.StructArray.from_arrays([pa.array(ids), names, emails, credit, city, state, timestamp, extra],
                                      fields=list(PERSON_TYPE))


def _auctions(c: NexmarkConfig, count: np.ndarray, event_id: np.ndarray, timestamp_ms: np.ndarray,
              timestamp: pa.Array) -> pa.StructArray:
    rnd = JavaRandoms(event_id)
    n = len(rnd)
    seller = _hot_or_drawn(rnd, c.hot_sellers_ratio,
                           (_last_base0_person_id(c, event_id) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO,
                           lambda cold: _next_base0_person_id(c, event_id, rnd, cold)) + FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + rnd.next_int(NUM_CATEGORIES)
    initial_bid = _next_price(rnd)
    # nextAuctionLengthMs: twice the time the next numInFlightAuctions auctions take
    current = c.first_event_number + count
    events_for_auctions = (c.num_in_flight_auctions * c.total_proportion) // c.auction_proportion
    horizon = c.timestamp_ms(current + events_for_auctions) - timestamp_ms
    expires = timestamp_ms + 1 + _next_long(rnd, np.maximum(horizon * 2, 1), np.ones(n, dtype=bool))
    item = _strings(*_next_string(rnd, 20))
    description = _strings(*_next_string(rnd, 100))
    reserve = initial_bid + _next_price(rnd)
    size = (8 + pa.compute.utf8_length(item).to_numpy(zero_copy_only=False).astype(np.int64)
            + pa.compute.utf8_length(description).to_numpy(zero_copy_only=False).astype(np.int64) + 40)
    extra = _next_extra(rnd, size, c.avg_auction_bytes)
    ids = _last_base0_auction_id(c, event_id) + FIRST_AUCTION_ID
    return pa.StructArray.from_arrays(
        [pa.array(ids), item, description, pa.array(initial_bid), pa.array(reserve), timestamp,
         pa.array(expires * 1000, TIMESTAMP), pa.array(seller), pa.array(category.astype(np.int64)), extra],
        fields=list(AUCTION_TYPE))


def _bids(c: NexmarkConfig, event_id: np.ndarray, timestamp: pa.Array) -> pa.StructArray:
    rnd = JavaRandoms(event_id)
    n = len(rnd)
    auction = _hot_or_drawn(rnd, c.hot_auction_ratio,
                            (_last_base0_auction_id(c, event_id) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
                            lambda cold: _next_base0_auction_id(c, event_id, rnd, cold)) + FIRST_AUCTION_ID
    bidder = _hot_or_drawn(rnd, c.hot_bidders_ratio,
                           (_last_base0_person_id(c, event_id) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
                           lambda cold: _next_base0_person_id(c, event_id, rnd, cold))
    bidder = bidder + 2 * FIRST_PERSON_ID          # (Flink adds FIRST_PERSON_ID twice)
    price = _next_price(rnd)
    hot = rnd.next_int(2) > 0
    channel_index = np.zeros(n, dtype=np.int64)
    if hot.any():
        channel_index[hot] = CHANNELS_NUMBER + rnd.next_int(len(HOT_CHANNELS), where=hot)
    if (~hot).any():
        channel_index[~hot] = rnd.next_int(CHANNELS_NUMBER, where=~hot)
    channel_names, channel_urls = _channel_tables()
    channel, url = channel_names.take(channel_index), channel_urls.take(channel_index)
    extra = _next_extra(rnd, np.full(n, 32), c.avg_bid_bytes)
    return pa.StructArray.from_arrays(
        [pa.array(auction), pa.array(bidder), pa.array(price), channel, url, timestamp, extra],
        fields=list(BID_TYPE))


def event_types(c: NexmarkConfig, first: int, end: int) -> np.ndarray:
    """The type of each event ``first`` .. ``end - 1`` (0-based counts of the stream)."""
    remainder = (c.first_event_id + c.first_event_number + np.arange(first, end, dtype=np.int64)) % c.total_proportion
    return np.where(remainder < c.person_proportion, PERSON,
                    np.where(remainder < c.person_proportion + c.auction_proportion, AUCTION, BID)).astype(np.int32)


def generate(c: NexmarkConfig, first: int, end: int, view: str = "events") -> pa.RecordBatch:
    """The events ``first`` .. ``end - 1`` (0-based counts of the stream) as one record
    batch of ``view``: ``events`` (Flink's ``datagen`` row: the type, one struct per
    type, the event time) or the rows of one type (``person``, ``auction``, ``bid``)."""
    count = np.arange(first, end, dtype=np.int64)
    number = c.first_event_number + count
    event_id = c.first_event_id + number
    types = event_types(c, first, end)
    timestamp_ms = c.timestamp_ms(number)
    parts = {}
    for kind, name in ((PERSON, "person"), (AUCTION, "auction"), (BID, "bid")):
        if view not in ("events", name):
            continue
        pick = types == kind
        ts = pa.array(timestamp_ms[pick] * 1000, TIMESTAMP)
        if name == "person":
            parts[name] = (pick, _persons(c, event_id[pick], ts))
        elif name == "auction":
            parts[name] = (pick, _auctions(c, count[pick], event_id[pick], timestamp_ms[pick], ts))
        else:
            parts[name] = (pick, _bids(c, event_id[pick], ts))
    if view != "events":
        pick, rows = parts[view]
        return pa.RecordBatch.from_struct_array(rows)
    columns = [pa.array(types, pa.int32())]
    for name, struct_type in (("person", PERSON_TYPE), ("auction", AUCTION_TYPE), ("bid", BID_TYPE)):
        pick, rows = parts[name]
        columns.append(_scatter(rows, pick, struct_type))
    columns.append(pa.array(timestamp_ms * 1000, TIMESTAMP))
    return pa.RecordBatch.from_arrays(columns, schema=EVENTS_SCHEMA)


def _scatter(rows: pa.StructArray, pick: np.ndarray, struct_type: pa.StructType) -> pa.Array:
    """``rows`` at the positions ``pick`` selects, null elsewhere. No string is copied: a
    string field keeps its data buffer and gets offsets that give the null rows empty
    strings; a number or time field is spread with numpy."""
    if not len(rows):
        return pa.nulls(len(pick), struct_type)
    positions = np.flatnonzero(pick)
    children = []
    for i, field in enumerate(struct_type):
        child = rows.field(i)
        buffers = child.buffers()
        if (pa.types.is_string(field.type) and not child.null_count and not child.offset
                and buffers[2] is not None):
            offsets = np.frombuffer(buffers[1], dtype=np.int32, count=len(child) + 1)
            spread = np.zeros(len(pick) + 1, dtype=np.int32)
            spread[0] = offsets[0]
            spread[positions + 1] = offsets[1:]
            np.maximum.accumulate(spread, out=spread)      # a null row: the previous row's end
            children.append(pa.StringArray.from_buffers(len(pick), pa.py_buffer(spread), buffers[2]))
        elif ((pa.types.is_integer(field.type) or pa.types.is_timestamp(field.type))
              and field.type.bit_width in (32, 64) and not child.null_count and not child.offset):
            dtype = np.int32 if field.type.bit_width == 32 else np.int64
            spread = np.zeros(len(pick), dtype=dtype)
            spread[positions] = np.frombuffer(buffers[1], dtype=dtype, count=len(child))
            children.append(pa.Array.from_buffers(field.type, len(pick), [None, pa.py_buffer(spread)]))
        else:   # (not met by the generator's own fields)
            taken = np.full(len(pick), -1, dtype=np.int64)
            taken[positions] = np.arange(len(positions))
            children.append(child.take(pa.array(taken, mask=~pick)))
    return pa.StructArray.from_arrays(children, fields=list(struct_type), mask=pa.array(~pick))
