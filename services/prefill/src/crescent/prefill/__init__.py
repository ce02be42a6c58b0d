"""The prefill worker: runs prefill jobs from the conductor and answers with the first token."""
