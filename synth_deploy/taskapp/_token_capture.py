"""Asking a policy server for the tokens it saw and sampled, and reading them from its reply.

A trainer asks with ``policy.config.capture_tokens: true`` (an app may default it on, see
`TaskApp.capture_tokens`). The request then carries what vLLM's OpenAI-compatible server
reads (vLLM >= 0.10.2; SGLang servers patched for RL answer the same shape):

    "logprobs": true            -> choices[0].logprobs.content[i].logprob
    "return_token_ids": true    -> prompt_token_ids (top level), choices[0].token_ids

A server that ignores the
fields still answers, and one that refuses them (OpenAI and Groq answer 400 to a field they
do not know) is asked again without them: either way the turn is recorded as having no
token data, and why.
"""

from __future__ import annotations

from typing import Any

from synth_deploy.errors import BadRequest
from synth_deploy.tracing import TurnTokens, valid_ids, valid_logprobs

CAPTURE_FIELD = "capture_tokens"
CAPTURE_REQUEST = {"logprobs": True, "return_token_ids": True}


def wants_tokens(config: dict[str, Any], default: bool = False) -> bool:
    """Whether the rollout's policy config asks for token capture (else ``default``);
    `BadRequest` when it says something other than true or false."""
    value = config.get(CAPTURE_FIELD, default)
    if not isinstance(value, bool):
        raise BadRequest(f"policy.config.{CAPTURE_FIELD} must be true or false, got "
                         f"{str(value)[:40]!r}", code="invalid_policy_config",
                         field=f"policy.config.{CAPTURE_FIELD}")
    return value


def capture_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` asking for token data; what the caller set itself is kept."""
    return {**CAPTURE_REQUEST, **body}


def reply_tokens(data: dict[str, Any], refused: bool = False) -> TurnTokens:
    """The token data of a chat completion (see the module docstring); an absent one saying
    what was missing when the reply has none, or has some that is not what vLLM returns.
    ``refused``: the server answered 400 to the capture fields, and was asked without."""
    choice = data["choices"][0]
    model = data.get("model") if isinstance(data.get("model"), str) else None
    fingerprint = data.get("system_fingerprint")
    revision = fingerprint if isinstance(fingerprint, str) else None
    if refused:
        return TurnTokens.absent(f"the policy server refused {' and '.join(CAPTURE_REQUEST)} "
                                 "(HTTP 400); it was asked again without them",
                                 model=model, revision=revision)
    prompt = data.get("prompt_token_ids", choice.get("prompt_token_ids"))
    content = _logprob_entries(choice)
    completion = choice.get("token_ids")
    missing = [name for name, value in (("prompt_token_ids", prompt),
                                        ("choices[0].token_ids", completion)) if value is None]
    if missing:
        return TurnTokens.absent(f"the policy server returned no {' or '.join(missing)} "
                                 "(vLLM >= 0.10.2 returns them for return_token_ids)",
                                 model=model, revision=revision)
    try:
        turn = TurnTokens(prompt_ids=valid_ids(prompt, "prompt_token_ids"),
                          completion_ids=valid_ids(completion, "choices[0].token_ids"),
                          model=model, revision=revision)
    except ValueError as exc:
        return TurnTokens.absent(f"the policy server's {exc}", model=model, revision=revision)
    if not content and turn.completion_ids:
        turn.absent_reason = "the policy server returned no choices[0].logprobs.content"
        return turn
    try:
        turn.completion_logprobs = valid_logprobs([e.get("logprob") for e in content],
                                                  len(turn.completion_ids))
    except ValueError as exc:
        turn.absent_reason = f"logprobs not kept: the policy server's {exc}"
    return turn


def _logprob_entries(choice: dict[str, Any]) -> list[dict[str, Any]]:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
        return []
    return content


__all__ = ["CAPTURE_FIELD", "CAPTURE_REQUEST", "capture_fields", "reply_tokens",
           "wants_tokens"]
