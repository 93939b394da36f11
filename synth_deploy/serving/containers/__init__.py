"""synth-containers' contract, served beside `/rollout` under `/containers`: the wire
(`_wire`), what the app can do in the contract's terms (`_capabilities`), its datasets'
splits (`_datasets`), its documents (`_document`) and events (`_events`), the durable
asynchronous rollouts it submits (`_durable`), and the client's side the kit's runners and
`check` share (`_client`; light: no server imports)."""

from synth_deploy.serving.containers._client import (
    ADMISSION_MAX_DELAY_S,
    ADMISSION_PATIENCE_S,
    FIRST_POLL_S,
    MAX_POLL_S,
    METADATA_PATH,
    POLL_FAILURES_ALLOWED,
    POLL_WAIT_MS,
    PREFIX,
    SUBMIT_PATH,
    AdmissionWaits,
    advertises_async,
    async_submission,
    document_path,
    next_poll_delay,
    poll_path,
    retryable,
    rollout_answer,
)
from synth_deploy.serving.containers._events import envelope_digest

__all__ = ["ADMISSION_MAX_DELAY_S", "ADMISSION_PATIENCE_S", "AdmissionWaits", "FIRST_POLL_S",
           "MAX_POLL_S", "METADATA_PATH", "POLL_FAILURES_ALLOWED",
           "POLL_WAIT_MS", "PREFIX", "SUBMIT_PATH", "advertises_async", "async_submission",
           "document_path", "envelope_digest", "next_poll_delay", "poll_path", "retryable",
           "rollout_answer"]
