"""The decode worker: admits requests by KV room, runs the continuous batch, streams tokens."""
