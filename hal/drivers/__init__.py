"""Built-in drivers. Each subpackage's ``plugin`` module registers it without importing its backend."""
