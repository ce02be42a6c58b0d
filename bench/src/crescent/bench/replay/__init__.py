"""`crescent replay`: a Mooncake-format trace sent to any OpenAI-compatible endpoint."""
