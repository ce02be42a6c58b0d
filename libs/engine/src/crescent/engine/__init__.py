"""Engine backends that prefill and decode workers drive: `emulated` (a cost model, no model)
and `vllm` (a real model with the CrescentConnector)."""
