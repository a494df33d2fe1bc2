"""The benchmark grid: passes in rotation (``bench``), one pass in its own process group (``runner``),
declared metrics and their directions (``metrics``), the verdict (``judge``), the busy-machine guard."""
