"""Verdicts: each rehearsal measurement turned into a `RehearsalCheck` with its number first,
and the fix when it would waste the run."""

from __future__ import annotations

from typing import Any

from synth_deploy.runs._capacity import CapacityReport
from synth_deploy.runs._determinism import DeterminismResult
from synth_deploy.runs._idle import IdleResult
from synth_deploy.runs._rehearsal_report import RehearsalCheck
from synth_deploy.runs._timeouts import TimeoutAssessment
from synth_deploy.runs._training_step import StepResult
from synth_deploy.taskapp.contracts import NO_REWARD


def duration(seconds: float | None) -> str:
    """``0.84s``, ``12.3s``, ``7m 05s``, ``2h 03m``."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def health_check(report: Any) -> RehearsalCheck:
    if report.healthy:
        return RehearsalCheck("health", "pass", "answers /health, /info and /task_info with "
                              "the key", data={"duration_ms": round(report.duration_ms, 1)})
    failure = report.failure
    return RehearsalCheck("health", "fail", f"{failure.name}: {failure.actual}",
                          fix=failure.hint, data=report.to_dict())


def step_check(step: StepResult) -> RehearsalCheck:
    finding = _step_finding(step)
    details = [f"{count}× {cause}" for cause, count in step.causes()]
    unrewarded = sum(1 for o in step.outcomes if o.ok and o.reward is None)
    if unrewarded:
        details.append(f"{unrewarded}× {NO_REWARD}")
    over = _past_max_turns(step)
    if over:
        details.append(f"{len(over)}× ran past [rollout] max_turns = {step.plan.max_turns} "
                       f"(up to {max(over)} steps): the app does not honour "
                       "env.config.max_turns")
    if step.failures:
        return _step_failure(step, finding, details)
    if unrewarded or over:
        return _step_warning(step, finding, details, unrewarded=unrewarded, over=len(over))
    return RehearsalCheck("training step", "pass", finding, data=step.to_dict())


def _step_failure(step: StepResult, finding: str, details: list[str]) -> RehearsalCheck:
    """Failed: some rollouts failed (their causes listed, then the count by kind)."""
    kinds = ", ".join(f"{kind} {n}" for kind, n in step.failure_kinds().items())
    return RehearsalCheck("training step", "fail", finding, details=[*details, f"by kind: {kinds}"],
                          fix="fix the causes listed: the trainer gets no reward from a "
                              "failed rollout", data=step.to_dict())


def _step_warning(step: StepResult, finding: str, details: list[str], *, unrewarded: int,
                  over: int) -> RehearsalCheck:
    """Warned: every rollout ran, but some recorded no reward or ran past max_turns."""
    n = len(step.outcomes)
    said = [f"{unrewarded} of {n} recorded no reward" if unrewarded else "",
            f"{over} of {n} ran past max_turns" if over else ""]
    return RehearsalCheck("training step", "warn", " · ".join([finding, *filter(None, said)]),
                          details=details,
                          fix="record each rollout's reward (ctx.tracer."
                              "record_outcome_reward, or outcome_reward in its metrics); "
                              "end an episode at env.config.max_turns (an environment the "
                              "kit drives does)", data=step.to_dict())


def _step_finding(step: StepResult) -> str:
    """The step in one line: failures, time per step, the whole run's projection, tokens."""
    tokens = "tokens not reported" if step.tokens is None else f"{step.tokens} tokens"
    run = (f"whole run ≈ {duration(step.projected_run_s)} of rollouts ({step.plan.steps} "
           "steps)" if step.projected_run_s is not None else "run length unknown (no "
           "iterations_per_epoch)")
    return (f"{step.failures} of {len(step.outcomes)} rollouts failed · "
            f"{duration(step.wall_s)} per step at concurrency {step.concurrency} · {run} · "
            f"{tokens}")


def _past_max_turns(step: StepResult) -> list[int]:
    """The step counts of the ok rollouts that ran past the plan's max_turns."""
    cap = step.plan.max_turns
    return [o.steps for o in step.outcomes if o.ok and cap and o.steps and o.steps > cap]


def tokens_check(step: StepResult) -> RehearsalCheck:
    """Token capture of the step's rollouts (their returned traces): skipped unless some
    policy call asked for it; failed when a turn's prompt does not begin with the previous
    turn's ids, which on-policy training would then learn from ids never sampled."""
    summaries = _token_summaries(step)
    if not summaries:
        return RehearsalCheck("token continuity", "skip", "no policy call asked for token ids "
                              "(set capture_tokens = true in [rollout] policy_config)")
    broken = [(o, s) for o, s in summaries if s.breaks]
    absent = [(o, s) for o, s in summaries if s.absent]
    data = _token_data(summaries, broken)
    finding = (f"{len(summaries)} rollout(s) with token ids · {data['sampled']} sampled · "
               f"{len(broken)} broke continuity")
    if broken:
        return RehearsalCheck(
            "token continuity", "warn", finding, data=data,
            details=[f"{o.run_id}: {s.breaks[0].describe()}" for o, s in broken[:5]],
            fix="a turn's prompt does not begin with the previous turn's prompt and "
                "completion: the chat template re-renders history (dropped reasoning, "
                "reformatted tool calls) or the app trims it. The token export starts a new "
                "sample at each break (each trains on what the policy saw), re-encoding the "
                "prefix each time; keep history as sent (a template that does not re-render "
                "it, no trimming window) to train an episode as one sequence")
    if absent:
        return RehearsalCheck(
            "token continuity", "warn", f"{finding} · {len(absent)} without token data",
            details=[f"{o.run_id}: {s.absent[0]}" for o, s in absent[:5]], data=data,
            fix="serve the policy with vLLM >= 0.10.2 (return_token_ids), or train from "
                "re-tokenized text knowing it may differ from what was sampled")
    return RehearsalCheck("token continuity", "pass", finding, data=data)


def _token_data(summaries: list[tuple[Any, Any]], broken: list[tuple[Any, Any]]
                ) -> dict[str, Any]:
    """The check's data: rollouts with token ids, tokens sampled, and each break."""
    return {"rollouts": len(summaries), "sampled": sum(s.sampled for _, s in summaries),
            "broken": len(broken),
            "breaks": [{"run_id": o.run_id, **s.breaks[0].__dict__} for o, s in broken]}


def _token_summaries(step: StepResult) -> list[tuple[Any, Any]]:
    """Each rollout whose returned trace holds token ids, with their summary."""
    from synth_deploy.tracing import TraceFormatError, session_from_trace, summarize

    summaries = []
    for outcome in step.outcomes:
        if not outcome.trace:
            continue
        try:
            turns = session_from_trace(outcome.trace).turn_tokens
        except TraceFormatError:
            continue
        if turns:
            summaries.append((outcome, summarize(turns)))
    return summaries


def sandbox_check(step: StepResult) -> RehearsalCheck:
    """The sandboxes of the step's rollouts (their returned traces): whether they started,
    how long starting one took, what their commands cost; failed when a rollout failed
    because a sandbox could not start or run."""
    from synth_deploy.sandbox import summarize_traces

    summary = summarize_traces(o.trace for o in step.outcomes)
    failed = [o for o in step.outcomes if not o.ok and "SandboxError" in (o.error or "")]
    if failed:
        return RehearsalCheck(
            "sandboxes", "fail", f"{len(failed)} rollout(s) failed in their sandbox",
            details=[f"{o.run_id}: {o.error}" for o in failed[:5]], data=summary.to_dict(),
            fix="read the error: locally, the sandbox folder and this machine's namespaces; "
                "on Modal, the image and the workspace's sandbox quota")
    if not summary.used:
        return RehearsalCheck("sandboxes", "skip", "the app started no sandbox")
    return RehearsalCheck("sandboxes", "warn" if summary.hint else "pass", summary.describe(),
                          fix=summary.hint, data=summary.to_dict())


def signal_check(step: StepResult) -> RehearsalCheck:
    plan, data = step.plan, step.to_dict()
    total, zero = plan.groups, step.zero_variance_groups
    scored = total - step.groups_without_rewards
    finding = f"{zero} of {total} groups have zero reward variance"
    if step.groups_without_rewards:
        finding += f" ({step.groups_without_rewards} returned no reward)"
    if step.outcomes and step.failures == len(step.outcomes):
        return RehearsalCheck("reward signal", "skip", "not measured: every rollout failed "
                              "(see the training step)", data=data)
    if scored == 0:
        return RehearsalCheck("reward signal", "fail", f"no group returned a reward "
                              f"({total} groups)", fix="make the rollout record a reward "
                              "(ctx.tracer.record_outcome_reward)", data=data)
    if step.groups_without_rewards:
        return _unrewarded_groups_check(step, data)
    if plan.group_size < 2:
        return RehearsalCheck("reward signal", "warn", f"group_size {plan.group_size}: no "
                              "group to compare", fix="set [training] group_size to 2 or more "
                              "for GRPO/GSPO", data=data)
    return _variance_check(step, finding, data)


def _unrewarded_groups_check(step: StepResult, data: dict[str, Any]) -> RehearsalCheck:
    """Failed: some groups have no reward to compare (every rollout failed, or none
    recorded one)."""
    total, zero = step.plan.groups, step.zero_variance_groups
    scored = total - step.groups_without_rewards
    failed = sum(1 for g in step.groups if g.outcomes and g.failures == len(g.outcomes))
    unrecorded = step.groups_without_rewards - failed
    why = ", ".join(part for part in (
        f"{failed} had every rollout fail" if failed else "",
        f"{unrecorded} recorded no reward" if unrecorded else "") if part)
    return RehearsalCheck(
        "reward signal", "fail", f"{step.groups_without_rewards} of {total} groups have no "
        f"reward to compare ({why}); {zero} of the {scored} others have zero variance",
        fix="a group without rewards teaches nothing: fix the failed rollouts (training "
            "step) and make every rollout record a reward", data=data)


def _variance_check(step: StepResult, finding: str, data: dict[str, Any]) -> RehearsalCheck:
    """Every group scored: failed when none varies, warned when most do not."""
    total, zero = step.plan.groups, step.zero_variance_groups
    scored = total - step.groups_without_rewards
    rewards = {r for g in step.groups for r in g.rewards}
    if zero == scored:
        same = (f"every rollout scored {rewards.pop():g}" if len(rewards) == 1
                else "each group's members all scored alike")
        return RehearsalCheck(
            "reward signal", "fail", f"{finding}: no learning signal", details=[same],
            fix="the reward must depend on what the policy does: check how the rollout "
                "computes it, and that the policy samples (temperature > 0)", data=data)
    if zero * 4 > total * 3:  # GRPO tolerates some; past three in four, little is learnt
        return RehearsalCheck(
            "reward signal", "warn", f"{finding}: most of each step teaches nothing",
            fix="tasks the policy always (or never) solves give no gradient: mix "
                "difficulties or pick other seeds", data=data)
    return RehearsalCheck("reward signal", "pass", finding, data=data)


def determinism_check(result: DeterminismResult) -> RehearsalCheck:
    data, seed = result.to_dict(), result.seed
    if result.error:
        return RehearsalCheck("determinism", "warn", f"seed {seed}: could not compare: "
                              f"{result.error}", data=data)
    if result.task_info_difference:
        return RehearsalCheck(
            "determinism", "fail", f"seed {seed} gave 2 different tasks: "
            f"{result.task_info_difference}",
            fix="derive each instance from its seed alone (random.Random(seed)), not from "
                "global state or the clock: a group must share one task", data=data)
    if result.rollout_difference:
        finding = f"seed {seed} twice, 2 different rollouts: {result.rollout_difference}"
        if not result.policy_deterministic:
            return RehearsalCheck(
                "determinism", "warn", finding, data=data,
                fix="may be the policy (a real endpoint need not be deterministic at "
                    "temperature 0); rerun with the mock policy to tell")
        if result.seed_ignored:  # no RNG of theirs can be seeded from a seed never passed
            return RehearsalCheck(
                "determinism", "fail", f"{finding} ({result.seed_ignored})", data=data,
                fix="the environment's reset() takes no seed, so nothing it draws can follow "
                    "the seed: add a `seed` parameter to reset() and seed its RNG from it "
                    "(the kit passes the seed to a reset() that accepts one)")
        return RehearsalCheck(
            "determinism", "fail", finding, data=data,
            fix="the environment draws randomness that is not derived from the seed: seed "
                "every RNG the rollout uses from request.env.seed")
    reward = result.rewards[0]
    return RehearsalCheck("determinism", "pass", f"seed {seed} twice: same task, same "
                          f"trajectory, reward {'-' if reward is None else f'{reward:g}'}",
                          data=data)


def capacity_check(report: CapacityReport, wanted: int, modal: Any = None, *,
                   one_process: bool = True, mocked: bool = False) -> RehearsalCheck:
    """``one_process``: the app was served here, so a level is what one container holds
    (a remote URL may be many containers: no per-container advice then). ``mocked``: the
    rollouts called the mock policy, whose replies take milliseconds."""
    data = report.to_dict(wanted)
    stopped = report.stopped_by
    tested = report.levels[-1].concurrency if report.levels else 0
    sustained = report.sustained
    details = _capacity_details(report, data["recommended"], one_process=one_process,
                                mocked=mocked)
    if sustained == 0:
        return RehearsalCheck("capacity", "fail", "fails even one rollout at a time",
                              details=details, fix="fix the failures first (see the training "
                              "step)", data=data)
    knee = report.knee
    if stopped is None:  # the ramp ended without a failure: a lower bound, not a limit
        finding = f"held {sustained} concurrent rollouts, not measured above"
    else:
        finding = (f"held {sustained} concurrent rollouts (tried up to {tested}); knee at "
                   f"{knee.concurrency} ({knee.rate})")
    if sustained < wanted:
        return RehearsalCheck("capacity", "fail", f"{finding}; the config asks for {wanted}",
                              details=details, fix=_short_capacity_fix(report, wanted),
                              data=data)
    warnings = []
    if tested < wanted:
        warnings.append(f"only tried up to {tested} (the config asks for {wanted})")
    if modal is not None:
        warnings += _modal_warnings(modal, report, wanted)
    if warnings:
        return RehearsalCheck("capacity", "warn", f"{finding}; {warnings[0]}",
                              details=warnings[1:] + details,
                              fix="adjust ModalSettings as recommended", data=data)
    return RehearsalCheck("capacity", "pass", finding, details=details, data=data)


def _capacity_details(report: CapacityReport, rec: dict[str, Any], *, one_process: bool,
                      mocked: bool) -> list[str]:
    """Where the ramp stopped, the settings to paste (per container only when one process
    was measured), the mock policy's caveat, the report's notes."""
    stopped, sustained = report.stopped_by, report.sustained
    details = [f"stopped at {stopped.concurrency}: {stopped.problem}"] if stopped else []
    if rec["concurrent_inputs"] and one_process:
        # Settings to paste, each where it is written; a limit only where one was found.
        limit = f", max_rollouts={sustained}" if stopped else ""
        details += [
            f"rl.toml:    [rollout] max_concurrent_rollouts = {rec['max_concurrent_rollouts']}",
            f"app file:   ModalSettings(concurrent_inputs={rec['concurrent_inputs']}, "
            f"max_containers={rec['max_containers']}{limit})"]
        details.append(f"serve:      synth-deploy serve APP --max-rollouts {sustained}" if stopped
                       else f"max_rollouts: none to paste; nothing gave way up to {sustained}")
    elif rec["concurrent_inputs"]:
        details.append(f"recommended: max_concurrent_rollouts = {rec['max_concurrent_rollouts']}"
                       " (measured across the whole deployment; rehearse with --app for "
                       "per-container advice)")
    if mocked:
        details.append("measured with the mock policy, whose replies take milliseconds: with "
                       "a real model each rollout holds its slot longer (rehearse with "
                       "--inference-url for figures that hold)")
    return details + report.notes


def _short_capacity_fix(report: CapacityReport, wanted: int) -> str:
    """The fix when less than ``wanted`` was held: a limit where one was found, else a
    ramp that goes as far as the config asks."""
    sustained = report.sustained
    if report.stopped_by:
        return (f"set [rollout] max_concurrent_rollouts = {sustained}, or give the app more "
                "capacity (Modal: concurrent_inputs, max_containers)")
    return (f"nothing failed up to {sustained}: measure up to {wanted} (rehearse "
            f"--max-concurrency {wanted}, with the app's own limit at least that), or set "
            f"[rollout] max_concurrent_rollouts = {sustained}")


def _modal_warnings(modal: Any, report: CapacityReport, wanted: int) -> list[str]:
    """ModalSettings that ask one process for more than it held, or cap the deployment
    below what the config asks."""
    sustained, warnings = report.sustained, []
    if modal.concurrent_inputs > sustained and report.stopped_by is not None:
        warnings.append(f"ModalSettings.concurrent_inputs = {modal.concurrent_inputs} is "
                        f"more than one app process held here ({sustained})")
    if modal.max_containers and modal.max_containers * modal.concurrent_inputs < wanted:
        warnings.append(f"Modal carries at most {modal.max_containers} × "
                        f"{modal.concurrent_inputs} rollouts at once; the config asks for "
                        f"{wanted}")
    return warnings


def timeouts_check(assessment: TimeoutAssessment) -> RehearsalCheck:
    data = assessment.to_dict()
    details = assessment.outlived[1:] + assessment.inverted + assessment.notes
    fix = assessment.fixes[0] if assessment.fixes else None
    if assessment.outlived:
        return RehearsalCheck("timeouts", "fail", assessment.outlived[0], fix=fix,
                              details=details, data=data)
    chain = " ≤ ".join(f"{layer.name} {layer.seconds:g}s" for layer in assessment.layers)
    observed = duration(assessment.observed_max_s)
    if assessment.inverted:
        return RehearsalCheck("timeouts", "warn", f"{len(assessment.inverted)} out of order: "
                              f"{assessment.inverted[0]}", fix=fix,
                              details=assessment.inverted[1:] + assessment.notes, data=data)
    return RehearsalCheck("timeouts", "pass", f"slowest rollout {observed}; in order: {chain}",
                          details=assessment.notes, data=data)


def idle_check(result: IdleResult) -> RehearsalCheck:
    data = result.to_dict()
    idle = f"{result.idle_s:g}s"
    if result.survived is None:
        return RehearsalCheck("idle connection", "skip", f"not measured: {result.error}",
                              data=data)
    if result.refused is not None:
        cut = result.refused in (502, 504, 520, 522, 524)
        return RehearsalCheck(
            "idle connection", "fail", f"closed ({result.refused}): {result.error}", data=data,
            fix="a proxy on the path cut a rollout that sent no byte for longer than it "
                "waits: the app must answer, or send its head, within the proxy's limit "
                "(apps this kit serves send the head after 20 s: lower it with serve "
                "--head-after S, SYNTH_DEPLOY_HEAD_AFTER_S or ModalSettings(head_after_s=))"
            if cut else "the app refused the probe's rollout: see the capacity and step checks")
    if not result.survived:
        return RehearsalCheck(
            "idle connection", "fail", f"lost after {idle} idle: {result.error}", data=data,
            fix="something on the path drops idle connections without closing them: set the "
                f"trainer's keep-alive expiry below {idle}, or have it retry a rollout that "
                "failed before any answer on a fresh connection")
    how = ("on a new connection (the server closed the idle one cleanly)"
           if result.reconnected else "on the same connection")
    return RehearsalCheck("idle connection", "pass", f"a rollout after {idle} idle survived "
                          f"{how}", data=data)


__all__ = ["capacity_check", "determinism_check", "duration", "health_check", "idle_check",
           "signal_check", "step_check", "timeouts_check"]
