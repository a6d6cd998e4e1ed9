"""``local-task``: CPU driver with one worker thread per queue; the embedded default."""
