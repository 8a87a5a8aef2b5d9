"""Nexmark's queries as Spark Structured Streaming DataFrame code, each in the form
closest to the reference SQL (the Flink Nexmark project's ``queries/q*.sql``) that
Spark's engine accepts. The same code runs on microbatch and on Spark's own engine:
give it the views of either session's event stream.

The views are Flink's ``person``, ``auction`` and ``bid`` (``ddl_views.sql``): the
fields of one event type and its ``dateTime``, with Flink's watermark (``dateTime``
minus 4 seconds, ``ddl_gen.sql``). ``QUERIES`` says for each query how it differs from
the reference; ``NOT_EXPRESSIBLE`` says which cannot run on Spark's engine and why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from microbatch.sources.nexmark.generator import AUCTION, BID, PERSON

WATERMARK_DELAY = "4 seconds"     #: ddl_gen.sql: WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND

PERSON_COLUMNS = ("id", "name", "emailAddress", "creditCard", "city", "state", "dateTime", "extra")
AUCTION_COLUMNS = ("id", "itemName", "description", "initialBid", "reserve", "dateTime", "expires", "seller",
                   "category", "extra")
BID_COLUMNS = ("auction", "bidder", "price", "channel", "url", "dateTime", "extra")


@dataclass
class NexmarkViews:
    """The three streams of one session. ``read_events()`` gives a new stream of Flink's
    ``datagen`` rows (the nexmark source's ``events`` view, or files of it); each view
    reads its own. ``side_input`` is q13's bounded table (a static DataFrame ``key``,
    ``value``)."""
    read_events: Callable[[], DataFrame]
    side_input: DataFrame | None = None

    def _view(self, event_type: int, struct: str, columns: tuple[str, ...]) -> DataFrame:
        events = self.read_events()
        return (events.where(F.col("event_type") == event_type)
                .select(*[F.col(f"{struct}.{c}").alias(c) if c != "dateTime" else F.col("dateTime")
                          for c in columns])
                .withWatermark("dateTime", WATERMARK_DELAY))

    @property
    def person(self) -> DataFrame:
        return self._view(PERSON, "person", PERSON_COLUMNS)

    @property
    def auction(self) -> DataFrame:
        return self._view(AUCTION, "auction", AUCTION_COLUMNS)

    @property
    def bid(self) -> DataFrame:
        return self._view(BID, "bid", BID_COLUMNS)


@dataclass(frozen=True)
class NexmarkQuery:
    name: str
    title: str
    output_mode: str
    build: Callable[[NexmarkViews], DataFrame]
    differs: str = "as the reference"      #: how it differs from the reference SQL

    @property
    def sql(self) -> str:
        """The query as SQL over the temporary views ``register_views`` makes: the same
        plan as ``build`` (the differences from the reference are the same)."""
        return SQL[self.name]


def register_views(session, views: NexmarkViews) -> None:
    """Make ``person``, ``auction`` and ``bid`` (and ``side_input``, when there is one)
    temporary views of ``session`` (microbatch's ``StreamingSession`` or a
    ``SparkSession``), each a stream of ``views`` with its watermark, for ``query.sql``."""
    for name in ("person", "auction", "bid"):
        getattr(views, name).createOrReplaceTempView(name)
    if views.side_input is not None:
        views.side_input.createOrReplaceTempView("side_input")


def _q0(v: NexmarkViews) -> DataFrame:
    return v.bid.select("auction", "bidder", "price", "dateTime", "extra")


def _q1(v: NexmarkViews) -> DataFrame:
    return v.bid.select("auction", "bidder", F.expr("0.908 * price").alias("price"), "dateTime", "extra")


def _q2(v: NexmarkViews) -> DataFrame:
    return v.bid.where(F.col("auction") % 123 == 0).select("auction", "price")


def _q3(v: NexmarkViews) -> DataFrame:
    auction = v.auction.where(F.col("category") == 10).select(F.col("id").alias("a_id"), "seller")
    person = (v.person.where(F.col("state").isin("OR", "ID", "CA"))
              .select(F.col("id").alias("p_id"), "name", "city", "state"))
    return auction.join(person, F.col("seller") == F.col("p_id")).select("name", "city", "state", F.col("a_id").alias("id"))


def _q5(v: NexmarkViews) -> DataFrame:
    window = F.window("dateTime", "10 seconds", "2 seconds")
    auction_bids = v.bid.groupBy("auction", window).agg(F.count(F.lit(1)).alias("num"))
    counts = v.bid.groupBy("auction", window).agg(F.count(F.lit(1)).alias("num"))
    max_bids = counts.groupBy(F.col("window").alias("max_window")).agg(F.max("num").alias("maxn"))
    return (auction_bids.join(max_bids, F.col("window") == F.col("max_window"))
            .where(F.col("num") >= F.col("maxn")).select("auction", "num"))


def _q7(v: NexmarkViews) -> DataFrame:
    highest = (v.bid.groupBy(F.window("dateTime", "10 seconds"))
               .agg(F.max(F.struct("price", "auction", "bidder", "dateTime", "extra")).alias("top")))
    return highest.select("top.auction", "top.price", "top.bidder", "top.dateTime", "top.extra")


def _q8(v: NexmarkViews) -> DataFrame:
    window = F.window("dateTime", "10 seconds")
    person = v.person.groupBy("id", "name", window).agg(F.count(F.lit(1)).alias("n"))
    auction = (v.auction.groupBy("seller", window).agg(F.count(F.lit(1)).alias("n"))
               .select("seller", F.col("window").alias("a_window")))
    return (person.join(auction, (F.col("id") == F.col("seller")) & (F.col("window") == F.col("a_window")))
            .select("id", "name", F.col("window.start").alias("stime")))


def _q11(v: NexmarkViews) -> DataFrame:
    sessions = v.bid.groupBy("bidder", F.session_window("dateTime", "10 seconds")).agg(F.count(F.lit(1)).alias("bid_count"))
    return sessions.select("bidder", "bid_count", F.col("session_window.start").alias("starttime"),
                           F.col("session_window.end").alias("endtime"))


def _q13(v: NexmarkViews) -> DataFrame:
    if v.side_input is None:
        raise ValueError("q13 joins a bounded side input: give NexmarkViews a side_input DataFrame (key, value)")
    return (v.bid.join(v.side_input, F.col("auction") % 10000 == F.col("key"))
            .select("auction", "bidder", "price", "dateTime", "value"))


def _q14(v: NexmarkViews) -> DataFrame:
    hour = F.hour("dateTime")
    euros = F.expr("0.908 * price")
    return (v.bid.where((euros > 1_000_000) & (euros < 50_000_000))
            .select("auction", "bidder", euros.alias("price"),
                    F.when((hour >= 8) & (hour <= 18), "dayTime")
                    .when((hour <= 6) | (hour >= 20), "nightTime").otherwise("otherTime").alias("bidTimeType"),
                    "dateTime", "extra",
                    (F.length("extra") - F.length(F.regexp_replace("extra", "c", ""))).cast("bigint").alias("c_counts")))


def _q17(v: NexmarkViews) -> DataFrame:
    price = F.col("price")
    return (v.bid.groupBy("auction", F.date_format("dateTime", "yyyy-MM-dd").alias("day"))
            .agg(F.count(F.lit(1)).alias("total_bids"),
                 F.count(F.when(price < 10_000, 1)).alias("rank1_bids"),
                 F.count(F.when((price >= 10_000) & (price < 1_000_000), 1)).alias("rank2_bids"),
                 F.count(F.when(price >= 1_000_000, 1)).alias("rank3_bids"),
                 F.min(price).alias("min_price"), F.max(price).alias("max_price"),
                 F.avg(price).alias("avg_price"), F.sum(price).alias("sum_price")))


def _q18(v: NexmarkViews) -> DataFrame:
    last = (v.bid.groupBy("bidder", "auction")
            .agg(F.max(F.struct("dateTime", "price", "channel", "url", "extra")).alias("last")))
    return last.select("auction", "bidder", "last.price", "last.channel", "last.url", "last.dateTime", "last.extra")


def _q20(v: NexmarkViews) -> DataFrame:
    auction = v.auction.where(F.col("category") == 10).select(
        *[F.col(c).alias("a_dateTime" if c == "dateTime" else "a_extra" if c == "extra" else c)
          for c in AUCTION_COLUMNS])
    return v.bid.join(auction, F.col("auction") == F.col("id")).drop("id")


def _q21(v: NexmarkViews) -> DataFrame:
    channel_id = F.regexp_extract("url", "(&|^)channel_id=([^&]*)", 2)
    channel = F.lower("channel")
    return (v.bid.where((channel_id != "") | channel.isin("apple", "google", "facebook", "baidu"))
            .select("auction", "bidder", "price", "channel",
                    F.when(channel == "apple", "0").when(channel == "google", "1").when(channel == "facebook", "2")
                    .when(channel == "baidu", "3").otherwise(channel_id).alias("channel_id")))


def _q22(v: NexmarkViews) -> DataFrame:
    parts = F.split("url", "/")
    return v.bid.select("auction", "bidder", "price", "channel",
                        F.get(parts, 3).alias("dir1"), F.get(parts, 4).alias("dir2"), F.get(parts, 5).alias("dir3"))


QUERIES: dict[str, NexmarkQuery] = {q.name: q for q in (
    NexmarkQuery("q0", "Pass Through", "append", _q0),
    NexmarkQuery("q1", "Currency Conversion", "append", _q1),
    NexmarkQuery("q2", "Selection", "append", _q2),
    NexmarkQuery("q3", "Local Item Suggestion", "append", _q3,
                 "an inner stream-stream join without time bounds, as the reference (its state grows)"),
    NexmarkQuery("q5", "Hot Items", "append", _q5,
                 "the 2-second-hop 10-second windows' counts per auction joined with the maximum of those counts "
                 "per window (a chained aggregation of a second read of the bids) on the window, then filtered by "
                 "num >= maxn (the reference puts it in the join condition; for an inner join it is the same)"),
    NexmarkQuery("q7", "Highest Bid", "append", _q7,
                 "the highest bid of each 10-second window by an aggregation (max of a struct led by the "
                 "price) instead of joining the bids back to the window's maximum: one row a window, where the "
                 "reference gives every bid at the maximum price (ties are rare: prices are drawn from 1e6 values)"),
    NexmarkQuery("q8", "Monitor New Users", "append", _q8,
                 "as the reference: persons and sellers per 10-second window, joined on id and window"),
    NexmarkQuery("q11", "User Sessions", "append", _q11,
                 "session windows closed by the watermark (append), where Flink emits a session when it closes too"),
    NexmarkQuery("q13", "Bounded Side Input Join", "append", _q13,
                 "a stream-static join instead of a processing-time lookup join (the side input does not change)"),
    NexmarkQuery("q14", "Calculation", "append", _q14,
                 "count_char (a Java UDF in the reference) as length(extra) - length(replace(extra, 'c', ''))"),
    NexmarkQuery("q17", "Auction Statistics Report", "update", _q17,
                 "count(*) FILTER (WHERE ...) as count(CASE WHEN ... THEN 1 END); update mode (the reference's "
                 "retracting aggregation)"),
    NexmarkQuery("q18", "Find Last Bid", "update", _q18,
                 "ROW_NUMBER() ... ORDER BY dateTime DESC = 1 as max(struct(dateTime, ...)) per (bidder, auction) "
                 "in update mode (Spark's engine has no streaming ROW_NUMBER); a tie on dateTime takes the larger "
                 "price, where the reference takes either"),
    NexmarkQuery("q20", "Expand Bid with Auction", "append", _q20,
                 "an inner stream-stream join without time bounds, as the reference; the auction's dateTime and "
                 "extra are renamed a_dateTime and a_extra (the reference's sink names them so)"),
    NexmarkQuery("q21", "Add Channel Id", "append", _q21,
                 "REGEXP_EXTRACT is '' (Spark) where it is NULL (Flink) when nothing matches: the filter tests "
                 "<> '' instead of IS NOT NULL"),
    NexmarkQuery("q22", "Get URL Directories", "append", _q22,
                 "SPLIT_INDEX(url, '/', i) as get(split(url, '/'), i)"),
)}

#: the reference queries Spark's engine cannot run, and why
NOT_EXPRESSIBLE = {
    "q4": "an aggregation over an aggregation without event-time windows (max per auction, then the average per "
          "category): Spark's engine refuses chained aggregations outside append mode with windows",
    "q6": "an OVER window (not supported by Flink either, FLINK-19059)",
    "q9": "ROW_NUMBER() over a join (top-1 per auction): Spark's engine has no streaming ROW_NUMBER, and an "
          "aggregation after a stream-stream join needs windows",
    "q10": "a partitioned file sink with Flink's partition-commit policies (the file sink runs; the query is a "
           "sink test, not a query)",
    "q12": "processing-time windows (PROCTIME()): not reproducible on two engines",
    "q15": "count(DISTINCT ...): not supported in streaming aggregations by Spark's engine",
    "q16": "count(DISTINCT ...): not supported in streaming aggregations by Spark's engine",
    "q19": "ROW_NUMBER() <= 10 (top-N): Spark's engine has no streaming ROW_NUMBER",
}


_COUNT_PRICE_RANKS = """count(*) AS total_bids,
           count(CASE WHEN price < 10000 THEN 1 END) AS rank1_bids,
           count(CASE WHEN price >= 10000 AND price < 1000000 THEN 1 END) AS rank2_bids,
           count(CASE WHEN price >= 1000000 THEN 1 END) AS rank3_bids,
           min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, sum(price) AS sum_price"""

#: Each query as SQL (Spark's dialect) over the views of ``register_views``, written as the
#: reference (Flink Nexmark's ``queries/q*.sql``) is, with the changes ``differs`` names.
SQL: dict[str, str] = {
    "q0": "SELECT auction, bidder, price, dateTime, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id
FROM (SELECT id, seller FROM auction WHERE category = 10) AS A
INNER JOIN (SELECT id, name, city, state FROM person WHERE state IN ('OR', 'ID', 'CA')) AS P
ON A.seller = P.id""",
    "q5": """SELECT AuctionBids.auction, AuctionBids.num
FROM (SELECT auction, count(*) AS num, window
      FROM bid GROUP BY auction, window(dateTime, '10 seconds', '2 seconds')) AS AuctionBids
JOIN (SELECT window AS max_window, max(num) AS maxn
      FROM (SELECT count(*) AS num, window
            FROM bid GROUP BY auction, window(dateTime, '10 seconds', '2 seconds'))
      GROUP BY window) AS MaxBids
ON AuctionBids.window = MaxBids.max_window
WHERE AuctionBids.num >= MaxBids.maxn""",
    "q7": """SELECT top.auction, top.price, top.bidder, top.dateTime, top.extra
FROM (SELECT max(struct(price, auction, bidder, dateTime, extra)) AS top
      FROM bid GROUP BY window(dateTime, '10 seconds'))""",
    "q8": """SELECT P.id, P.name, P.window.start AS stime
FROM (SELECT id, name, window, count(*) AS n FROM person GROUP BY id, name, window(dateTime, '10 seconds')) AS P
JOIN (SELECT seller, window AS a_window FROM (
        SELECT seller, window, count(*) AS n FROM auction GROUP BY seller, window(dateTime, '10 seconds'))) AS A
ON P.id = A.seller AND P.window = A.a_window""",
    "q11": """SELECT bidder, count(*) AS bid_count, session_window.start AS starttime,
       session_window.end AS endtime
FROM bid GROUP BY bidder, session_window(dateTime, '10 seconds')""",
    "q13": """SELECT B.auction, B.bidder, B.price, B.dateTime, S.value
FROM bid AS B JOIN side_input AS S ON B.auction % 10000 = S.key""",
    "q14": """SELECT auction, bidder, 0.908 * price AS price,
       CASE WHEN hour(dateTime) >= 8 AND hour(dateTime) <= 18 THEN 'dayTime'
            WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime'
            ELSE 'otherTime' END AS bidTimeType,
       dateTime, extra,
       CAST(length(extra) - length(regexp_replace(extra, 'c', '')) AS BIGINT) AS c_counts
FROM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000""",
    "q17": f"""SELECT auction, date_format(dateTime, 'yyyy-MM-dd') AS day,
           {_COUNT_PRICE_RANKS}
FROM bid GROUP BY auction, date_format(dateTime, 'yyyy-MM-dd')""",
    "q18": """SELECT auction, bidder, last.price, last.channel, last.url, last.dateTime, last.extra
FROM (SELECT bidder, auction, max(struct(dateTime, price, channel, url, extra)) AS last
      FROM bid GROUP BY bidder, auction)""",
    "q20": """SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.dateTime, B.extra,
       A.itemName, A.description, A.initialBid, A.reserve, A.dateTime AS a_dateTime, A.expires, A.seller,
       A.category, A.extra AS a_extra
FROM bid AS B INNER JOIN (SELECT * FROM auction WHERE category = 10) AS A ON B.auction = A.id""",
    "q21": """SELECT auction, bidder, price, channel,
       CASE WHEN lower(channel) = 'apple' THEN '0'
            WHEN lower(channel) = 'google' THEN '1'
            WHEN lower(channel) = 'facebook' THEN '2'
            WHEN lower(channel) = 'baidu' THEN '3'
            ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
FROM bid
WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) <> ''
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')""",
    "q22": """SELECT auction, bidder, price, channel,
       get(split(url, '/'), 3) AS dir1, get(split(url, '/'), 4) AS dir2, get(split(url, '/'), 5) AS dir3
FROM bid""",
}
