"""synth-containers' contract, served beside `/rollout` under `/containers`: the wire
(`_wire`) and the durable asynchronous rollouts it submits (`_durable`)."""
