"""Engine backends that prefill and decode workers drive: `emulated` (a cost model, no model)
now; `vllm` (a real model with the CrescentConnector) next."""
