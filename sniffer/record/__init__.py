"""The recording chain between the pipeline and the store: observers (metrics,
token collector, OTLP export) see every event as captured, transforms (sampling,
redaction) decide what is written, then the writer. ``chain`` builds it once
from the configuration for both drivers (replay and the daemon);
``tokenize_pass`` writes the token rows of closed streams."""
