"""Adapters that give moekit's ops the calling conventions of inference engines.

- ``moekit.integrations.vllm``: vLLM's ``fused_topk`` and ``fused_experts`` (names,
  defaults, layouts of vLLM's public API) run on moekit's ops.

Nothing is imported here: each adapter is imported on its own (it needs PyTorch, and
raises an ``ImportError`` that says so where the torch layer is absent).
"""
