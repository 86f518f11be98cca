"""The drivers and everything that owns a loop, thread, signal or clock:
``replay`` (capture files), ``daemon`` (live capture), ``config`` (the
daemon's TOML configuration) and ``probe`` (a load generator)."""

#: The garbage collector's thresholds while capturing (the daemon's loop, and
#: ``run``/``replay`` from their start: ``sniffer.cli.common.few_collections``):
#: many short-lived objects per packet and no cycles worth chasing.
CAPTURE_GC_THRESHOLDS = (100_000, 50, 100)
