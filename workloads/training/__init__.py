"""The shared skeleton under every workload: ranks and device (runtime), DeepSpeed configs
(dsconfig), the engine and its training loop (engine, phases), JIT op builds (opbuild)."""
