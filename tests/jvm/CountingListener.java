package microbatch.test;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.spark.sql.streaming.StreamingQueryListener;

/**
 * A JVM listener as a team's lineage or APM agent registers one: named in
 * spark.sql.streaming.streamingQueryListeners, it counts the events of each query (by id).
 */
public class CountingListener extends StreamingQueryListener {
    private static final ConcurrentHashMap<String, AtomicInteger> COUNTS = new ConcurrentHashMap<>();

    private static void count(String kind, Object id) {
        COUNTS.computeIfAbsent(kind + " " + id, k -> new AtomicInteger()).incrementAndGet();
    }

    @Override
    public void onQueryStarted(StreamingQueryListener.QueryStartedEvent event) {
        count("started", event.id());
    }

    @Override
    public void onQueryProgress(StreamingQueryListener.QueryProgressEvent event) {
        count("progress", event.progress().id());
    }

    @Override
    public void onQueryTerminated(StreamingQueryListener.QueryTerminatedEvent event) {
        count("terminated", event.id());
    }

    /** The counts, "kind id" -> events, for the test to read through py4j. */
    public static Map<String, Integer> counts() {
        Map<String, Integer> out = new TreeMap<>();
        COUNTS.forEach((k, v) -> out.put(k, v.get()));
        return out;
    }
}
