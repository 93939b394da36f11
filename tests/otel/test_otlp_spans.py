"""The mapping of a stored session to spans, on sessions of every shape the store holds (a
multi-turn episode with images and tool calls, a failed rollout, synth-ai's rows): every
span encodes as OTLP, ids are derived from the session, parents exist, and the ids do not
change between two reads of the same session."""

from __future__ import annotations

from known_traces import EPISODE, ERROR, build_known_store
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from synth_deploy.otel import session_spans, trace_id_of
from synth_deploy.tracing import open_trace_store


def test_every_known_session_maps_to_a_consistent_trace(tmp_path):
    known = build_known_store(tmp_path / "known.db")
    with open_trace_store(str(tmp_path / "known.db"), read_only=True) as store:
        sessions = [store.get_session(k.session_id) for k in known]
        again = [store.get_session(k.session_id) for k in known]

    for facts, session, reread in zip(known, sessions, again, strict=True):
        spans = session_spans(session)
        ids = [s.context.span_id for s in spans]
        assert len(set(ids)) == len(ids)
        assert {s.context.trace_id for s in spans} == {trace_id_of(session.session_id)}
        assert [s.parent.span_id for s in spans[1:]] and \
            {s.parent.span_id for s in spans[1:]} <= set(ids)
        assert ids == [s.context.span_id for s in session_spans(reread)]
        assert all(s.end_time >= s.start_time > 0 for s in spans)
        root = spans[0]
        assert root.parent is None
        assert root.attributes["synth.split"] == facts.split
        assert root.attributes["synth.time.wall_s"] == facts.seed / 10 + 0.5
        chats = [s for s in spans if s.name.startswith("chat ")]
        assert sum(c.attributes.get("gen_ai.usage.input_tokens", 0) for c in chats) == \
            facts.input_tokens
        key = (facts.app, facts.model, facts.seed)
        assert (root.status.status_code.name == "ERROR") == (key == ERROR)
        if key == EPISODE:
            assert len(spans) == 1 + len(session.timesteps) + len(chats) > 4
        encode_spans(spans).SerializeToString()  # every attribute is one OTLP can carry


def test_content_is_only_on_the_spans_when_asked(tmp_path):
    known = build_known_store(tmp_path / "known.db")
    episode = next(k for k in known if (k.app, k.model, k.seed) == EPISODE)
    with open_trace_store(str(tmp_path / "known.db"), read_only=True) as store:
        session = store.get_session(episode.session_id)

    plain = [s for s in session_spans(session) if s.name.startswith("chat ")]
    shown = [s for s in session_spans(session, capture_content=True)
             if s.name.startswith("chat ")]
    assert not any("gen_ai.input.messages" in s.attributes for s in plain)
    assert any("gen_ai.input.messages" in s.attributes for s in shown)
    encode_spans(shown).SerializeToString()
