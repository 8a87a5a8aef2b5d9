"""Test helper: a scalar reference re-implementation of the *deterministic* Nexmark
generator (Apache Beam sdks/java/testing/nexmark == nexmark/nexmark release-0.1 Flink
generator), written from a spec of that generator.  Pure Python, no numpy: the oracle
for microbatch's vectorised generator (tests/test_nexmark_generator.py).

It was checked against the real release-0.1 Java generator run on a JVM: 0 mismatches
over ~280k events (the Flink SQL source's configuration, parallelism 4 at 10M events/s,
Beam's defaults, out-of-order groups of 1000, rate 1 with 1000 generators, a split
starting at a large first event id).  tests/data/nexmark_jvm_first100.jsonl holds the
first 100 events that JVM run produced for the Flink SQL source configuration
(Config("flink01", base_time=0, first_event_id=1, first_event_number=1)).

Adapted for the tests from the original script: ``JavaRandom`` also counts its LCG
steps (``steps``), ``generate`` takes a ``first`` event count, and the command-line
entry point is gone.

Variants (section 0 of the spec):
  variant="beam"      Beam Generator/GeneratorConfig: long inter-event delay
                      (rateToPeriodUs(rate) * numEventGenerators), timestamps
                      baseTime + (n*delay)//1000.
  variant="flink01"   nexmark/nexmark release-0.1: double delay
                      1e6/firstEventRate*numEventGenerators, timestamp
                      baseTime + int(n*delay)//1000; proportions configurable.
  flink_channel=True  additionally emulate the channel RNG calls added to
                      BidGenerator in nexmark/nexmark >= 0.2 (channel/url,
                      bidder += 1000 twice) but with the per-event seeded RNG.
                      (Real Flink >= 0.2 is unseeded -> not reproducible.)
"""
import math

MASK48 = (1 << 48) - 1
MULT = 0x5DEECE66D


def _i32(x):
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _i64(x):
    x &= 0xFFFFFFFFFFFFFFFF
    return x - (1 << 64) if x & (1 << 63) else x


class JavaRandom:
    """Bit-exact java.util.Random (legacy LCG)."""

    def __init__(self, seed):
        self.s = (seed ^ MULT) & MASK48          # initialScramble
        self.calls = []                          # trace (name, arg, result)
        self.steps = 0                           # LCG steps taken (rejections add steps)

    def next(self, bits):
        self.steps += 1
        self.s = (self.s * MULT + 0xB) & MASK48
        return _i32(self.s >> (48 - bits))

    def nextInt(self, bound=None):
        if bound is None:
            r = self.next(32)
            self.calls.append(("nextInt", None, r))
            return r
        assert bound > 0
        r = self.next(31)
        m = bound - 1
        if bound & m == 0:                       # power of two
            r = (bound * r) >> 31
        else:
            u = r
            while True:
                r = u % bound
                if _i32(u - r + m) >= 0:          # int overflow => reject
                    break
                u = self.next(31)
        self.calls.append(("nextInt", bound, r))
        return r

    def nextLong(self):
        r = _i64((self.next(32) << 32) + self.next(32))
        self.calls.append(("nextLong", None, r))
        return r

    def nextDouble(self):
        r = ((self.next(26) << 27) + self.next(27)) * (1.0 / (1 << 53))
        self.calls.append(("nextDouble", None, r))
        return r


def jdiv(a, b):      # Java long/int division (truncate toward zero)
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def jmod(a, b):      # Java % (sign of dividend)
    return a - jdiv(a, b) * b


def jround(x):       # Java Math.round(double) -> long, for finite x
    return math.floor(x + 0.5)


FIRST_NAMES = "Peter,Paul,Luke,John,Saul,Vicky,Kate,Julie,Sarah,Deiter,Walter".split(",")
LAST_NAMES = "Shultz,Abrams,Spencer,White,Bartels,Walton,Smith,Jones,Noris".split(",")
US_STATES = "AZ,CA,ID,OR,WA,WY".split(",")
US_CITIES = "Phoenix,Los Angeles,San Francisco,Boise,Portland,Bend,Redmond,Seattle,Kent,Cheyenne".split(",")
HOT_CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10
AUCTION_ID_LEAD = 10
HOT_SELLER_RATIO = HOT_AUCTION_RATIO = HOT_BIDDER_RATIO = 100
MIN_STRING_LENGTH = 3


class Config:
    def __init__(self, variant="beam", base_time=1436918400000, first_event_id=0,
                 first_event_number=0, first_event_rate=10000, num_event_generators=1,
                 person_proportion=1, auction_proportion=3, bid_proportion=46,
                 avg_person=200, avg_auction=500, avg_bid=100, hot_auction_ratio=2,
                 hot_sellers_ratio=4, hot_bidders_ratio=4, num_in_flight_auctions=100,
                 num_active_people=1000, out_of_order_group_size=1, flink_channel=False):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.total = person_proportion + auction_proportion + bid_proportion
        if variant == "beam":
            # RateUnit.PER_SECOND.rateToPeriodUs(rate) * numGenerators (firstRate == nextRate)
            self.delay = ((1_000_000 + first_event_rate // 2) // first_event_rate) * num_event_generators
        else:
            self.delay = 1000000.0 / first_event_rate * num_event_generators

    def timestamp_for_event(self, n):
        if self.variant == "beam":
            return self.base_time + jdiv(n * self.delay, 1000)
        return self.base_time + jdiv(int(n * self.delay), 1000)   # (long) cast truncates

    def next_event_number(self, k):
        return self.first_event_number + k

    def next_adjusted_event_number(self, k):
        g = self.out_of_order_group_size
        en = self.next_event_number(k)
        return (en // g) * g + (en * 953) % g

    def next_event_number_for_watermark(self, k):
        g = self.out_of_order_group_size
        return (self.next_event_number(k) // g) * g


def last_base0_person_id(c, event_id):
    epoch, off = divmod(event_id, c.total)
    if off >= c.person_proportion:
        off = c.person_proportion - 1
    return epoch * c.person_proportion + off


def last_base0_auction_id(c, event_id):
    epoch, off = divmod(event_id, c.total)
    if off < c.person_proportion:
        epoch -= 1
        off = c.auction_proportion - 1
    elif off >= c.person_proportion + c.auction_proportion:
        off = c.auction_proportion - 1
    else:
        off -= c.person_proportion
    return epoch * c.auction_proportion + off


def next_long(rnd, n):                  # LongGenerator.nextLong
    if n < 2147483647:
        return rnd.nextInt(n)
    return abs(jmod(rnd.nextLong(), n))


def next_base0_person_id(c, event_id, rnd):
    num_people = last_base0_person_id(c, event_id) + 1
    active = min(num_people, c.num_active_people)
    return num_people - active + next_long(rnd, active + PERSON_ID_LEAD)


def next_base0_auction_id(c, event_id, rnd):
    mx = last_base0_auction_id(c, event_id)
    mn = max(mx - c.num_in_flight_auctions, 0)
    return mn + next_long(rnd, mx - mn + 1 + AUCTION_ID_LEAD)


def next_string(rnd, max_len, special=" "):
    n = MIN_STRING_LENGTH + rnd.nextInt(max_len - MIN_STRING_LENGTH)
    out = []
    for _ in range(n):
        if rnd.nextInt(13) == 0:
            out.append(special)
        else:
            out.append(chr(ord("a") + rnd.nextInt(26)))
    return "".join(out).strip(" ")      # Java trim(); only ' ' can occur at ends


def next_exact_string(rnd, length):     # Beam / Flink <= 0.2 version
    out, rv, left = [], 0, 0
    for _ in range(length):
        if left == 0:
            rv = rnd.nextInt()
            left = 6
        out.append(chr(ord("a") + jmod(rv, 26)))
        rv = jdiv(rv, 26)
        left -= 1
    return "".join(out)


def next_extra(rnd, current_size, avg):
    if current_size > avg:
        return ""
    avg -= current_size
    delta = jround(avg * 0.2)
    min_size = avg - delta
    size = min_size + (0 if delta == 0 else rnd.nextInt(2 * delta))
    return next_exact_string(rnd, size)


def next_price(rnd):
    return jround(math.pow(10.0, rnd.nextDouble() * 6.0) * 100.0)


def gen_person(c, event_id, rnd, ts):
    pid = last_base0_person_id(c, event_id) + FIRST_PERSON_ID
    name = FIRST_NAMES[rnd.nextInt(len(FIRST_NAMES))] + " " + LAST_NAMES[rnd.nextInt(len(LAST_NAMES))]
    email = next_string(rnd, 7) + "@" + next_string(rnd, 5) + ".com"
    cc = " ".join("%04d" % rnd.nextInt(10000) for _ in range(4))
    city = US_CITIES[rnd.nextInt(len(US_CITIES))]
    state = US_STATES[rnd.nextInt(len(US_STATES))]
    cur = 8 + len(name) + len(email) + len(cc) + len(city) + len(state)
    extra = next_extra(rnd, cur, c.avg_person)
    return dict(type="person", id=pid, name=name, emailAddress=email, creditCard=cc,
                city=city, state=state, dateTime=ts, extra=extra)


def gen_auction(c, events_so_far, event_id, rnd, ts):
    aid = last_base0_auction_id(c, event_id) + FIRST_AUCTION_ID
    if rnd.nextInt(c.hot_sellers_ratio) > 0:
        seller = (last_base0_person_id(c, event_id) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    else:
        seller = next_base0_person_id(c, event_id, rnd)
    seller += FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + rnd.nextInt(NUM_CATEGORIES)
    initial_bid = next_price(rnd)
    # nextAuctionLengthMs
    cur_en = c.next_adjusted_event_number(events_so_far)
    n_ev = (c.num_in_flight_auctions * c.total) // c.auction_proportion
    horizon = c.timestamp_for_event(cur_en + n_ev) - ts
    expires = ts + 1 + next_long(rnd, max(horizon * 2, 1))
    name = next_string(rnd, 20)
    desc = next_string(rnd, 100)
    reserve = initial_bid + next_price(rnd)
    cur = 8 + len(name) + len(desc) + 8 + 8 + 8 + 8 + 8
    extra = next_extra(rnd, cur, c.avg_auction)
    return dict(type="auction", id=aid, itemName=name, description=desc, initialBid=initial_bid,
                reserve=reserve, dateTime=ts, expires=expires, seller=seller, category=category,
                extra=extra)


def gen_bid(c, event_id, rnd, ts):
    if rnd.nextInt(c.hot_auction_ratio) > 0:
        auction = (last_base0_auction_id(c, event_id) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    else:
        auction = next_base0_auction_id(c, event_id, rnd)
    auction += FIRST_AUCTION_ID
    if rnd.nextInt(c.hot_bidders_ratio) > 0:
        bidder = (last_base0_person_id(c, event_id) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    else:
        bidder = next_base0_person_id(c, event_id, rnd)
    bidder += FIRST_PERSON_ID
    price = next_price(rnd)
    d = dict(type="bid", auction=auction, bidder=bidder, price=price)
    if c.flink_channel:
        if rnd.nextInt(2) > 0:
            d["channel"] = HOT_CHANNELS[rnd.nextInt(4)]
        else:
            d["channel"] = "channel-%d" % rnd.nextInt(10000)
        d["url"] = None          # URL tables are built from an unseeded RNG in Flink
        bidder += FIRST_PERSON_ID  # Flink >= 0.2 adds FIRST_PERSON_ID twice
        d["bidder"] = bidder
    d["dateTime"] = ts
    d["extra"] = next_extra(rnd, 32, c.avg_bid)
    return d


def generate(c, count, trace=False, first=0):
    """Events ``first`` .. ``first + count - 1`` (``k``: events emitted so far)."""
    out = []
    for k in range(first, first + count):
        adj = c.next_adjusted_event_number(k)
        ts = c.timestamp_for_event(adj)
        wm = c.timestamp_for_event(c.next_event_number_for_watermark(k))
        event_id = c.first_event_id + adj
        rnd = JavaRandom(event_id)
        rem = event_id % c.total
        if rem < c.person_proportion:
            e = gen_person(c, event_id, rnd, ts)
        elif rem < c.person_proportion + c.auction_proportion:
            e = gen_auction(c, k, event_id, rnd, ts)
        else:
            e = gen_bid(c, event_id, rnd, ts)
        e["_eventId"] = event_id
        e["_watermark"] = wm
        if trace:
            e["_calls"] = rnd.calls
        out.append(e)
    return out
