"""Servers under load: one OpenAI client for every server (``client``), the servers it drives (``servers``),
the streams sweep (``sweep``: ``run-load``), the soak (``soak``: ``run-soak``) and their plots (``plot``)."""
