"""The drivers and everything that owns a loop, thread, signal or clock:
``replay`` (capture files), ``daemon`` (live capture), ``config`` (the
daemon's TOML configuration) and ``probe`` (a load generator)."""
