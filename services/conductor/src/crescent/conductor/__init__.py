"""The conductor: the OpenAI-compatible front door and the cluster's global scheduler."""
