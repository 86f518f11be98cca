"""What the LLM APIs mean: ``dialects`` (one parser per API), ``tokens``
(tokenizers, token counts and anomalies) and ``fingerprint`` (which requests
ask the same thing)."""
