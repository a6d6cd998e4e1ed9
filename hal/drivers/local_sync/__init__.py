"""``local-sync``: CPU driver that runs each submission inline on the thread that makes it ready."""
