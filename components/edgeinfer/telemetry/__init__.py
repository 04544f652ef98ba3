"""com.edgeinfer.Telemetry: windowed latency histograms and counters streamed to IoT Core."""
