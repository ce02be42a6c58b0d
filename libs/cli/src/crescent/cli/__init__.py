"""The `crescent` command."""
