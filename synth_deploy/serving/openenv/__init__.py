"""OpenEnv's protocol, served beside `/rollout` under `/openenv`: the HTTP and WebSocket wire
(`_wire`) and the sessions it drives (`_sessions`), each an environment's episode."""
