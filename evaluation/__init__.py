"""Evaluation: the demo, hole evaluation, replay with a simulated user, the position sampler, the
LSP client they drive the server with, and the benchmarks (`evaluation.bench`).

It sits above `lsp_server` and `backend` and may import anything; nothing imports it.
"""
