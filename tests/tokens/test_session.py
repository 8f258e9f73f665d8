"""The append-only token session against real chat templates and the real Qwen3 tokenizer.

For each template a 50-turn tool conversation is played by a model that emits exactly what
its template renders; the session's held ids are compared with an independent from-scratch
construction (full renders of the whole conversation, differenced), with the full render
itself, and checked for duplicated end-of-turn markers.
"""

from __future__ import annotations

import pytest

from environments.models.token_mode import NOT_SAMPLED, ChatRenderer, TemplateError, TokenSession
from environments.models.token_mode.session import suffix_between
from environments.models.token_mode.testing import TOOLS, template_completion, tool_conversation

from .conftest import template_text

# name -> ChatRenderer options (Llama's template needs its own BOS and end-of-turn names,
# which the Qwen vocabulary does not have as special tokens).
APPEND_ONLY = {
    "Qwen-Qwen2.5-7B-Instruct": {},
    "Qwen-Qwen3-Coder-30B-A3B-Instruct": {},  # XML tool calls, arguments as a mapping
    "NousResearch-Hermes-3-Llama-3.1-8B": {},
    "HuggingFaceTB-SmolLM3-3B": {},
    "deepseek-ai-DeepSeek-V3.1": {},  # end-of-turn inside a tool-calls block
    "moonshotai-Kimi-K2-Instruct": {},
    "meta-llama-Llama-3.1-8B-Instruct": {
        "template_kwargs": {"bos_token": "<|begin_of_text|>"},
        "end_of_turn": "<|eot_id|>",
    },
}


def play(renderer: ChatRenderer, turns: int, **conv):
    """Run the session and, beside it, the from-scratch construction; return both."""
    opening, script = tool_conversation(turns, **conv)
    session = TokenSession(renderer, TOOLS)
    session.start(opening)
    history = list(opening)
    expected = renderer.encode(renderer.render(opening, TOOLS, add_generation_prompt=True))
    generated: list[list[int]] = []
    for i, turn in enumerate(script):
        ids = template_completion(renderer, history, turn.assistant, TOOLS)
        logprobs = [-0.01 * (k + 1) for k in range(len(ids))]
        session.add_generation(ids, logprobs, turn.assistant)
        generated.append(ids)
        expected += ids
        history.append(turn.assistant)
        before = renderer.render(history, TOOLS, add_generation_prompt=False)
        history += turn.then
        after = renderer.render(history, TOOLS, add_generation_prompt=True)
        suffix, why = suffix_between(
            before, after, renderer.decode(ids).endswith(renderer.close.text), renderer.close.text
        )
        sequences_before = len(session.sequences)
        session.extend(turn.then)
        if suffix is None:
            assert len(session.sequences) == sequences_before + 1, f"turn {i}: {why} but no new sequence"
            expected = renderer.encode(after)
        else:
            assert len(session.sequences) == sequences_before, f"turn {i}: spurious restart {session.restart_reasons}"
            # The stand-in suffix equals the difference of full renders.
            assert session.current.pieces[-1] == renderer.encode(suffix), f"turn {i}"
            expected += renderer.encode(suffix)
        assert session.current.tokens == expected, f"turn {i}: held ids drifted"
    return session, history, generated


@pytest.mark.parametrize("name", sorted(APPEND_ONLY))
def test_fifty_tool_turns_stay_exact(qwen_tokenizer, name):
    renderer = ChatRenderer(qwen_tokenizer, template_text(name), **APPEND_ONLY[name])
    session, history, generated = play(renderer, 50, user_every=9, parallel="Llama-3.1" not in name)
    trace = session.trace()
    assert trace.restarts == 0 and trace.full_renders == 0 and len(trace.sequences) == 1
    seq = trace.sequences[0]

    # The held ids spell exactly what the template renders for the whole conversation ...
    full = renderer.render(history, TOOLS, add_generation_prompt=True)
    held_text = renderer.decode(seq.tokens)
    assert held_text == full
    # ... so no end-of-turn marker is duplicated (the ManagedServer failure mode).
    assert held_text.count(renderer.close.text) == full.count(renderer.close.text)
    assert held_text.count(renderer.close.text + renderer.close.text) == 0

    # Masks and logprobs: the model's own tokens, in order, and nothing else.
    model_spans = [s for s in seq.spans if s.kind == "model"]
    assert [seq.tokens[s.start : s.end] for s in model_spans] == generated
    trained = [t for t, m in zip(seq.tokens, seq.masks) if m != -100]
    assert trained == [t for g in generated for t in g]
    assert all((m == -100) == (lp is None) for m, lp in zip(seq.masks, seq.logprobs))
    for s in model_spans:
        assert seq.logprobs[s.start : s.end] == [-0.01 * (k + 1) for k in range(s.end - s.start)]
    assert seq.inference_logprobs.count(NOT_SAMPLED) == sum(1 for m in seq.masks if m == -100)
    assert seq.logprob_gaps == 0


def test_qwen3_dropping_reasoning_is_detected_not_corrupted(qwen_tokenizer):
    # Qwen3 drops earlier turns' <think> blocks once a new user message arrives: at those
    # turns the held ids would disagree with the template, so a new sequence starts.
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen3-0.6B"))
    session, history, _ = play(renderer, 50, reasoning=True, user_every=10)
    trace = session.trace()
    assert trace.restarts == 5 and len(trace.sequences) == 6
    assert all("not append-only" in r and "<think>" in r for r in trace.restart_reasons)
    # Within a tool chain the template is append-only: the last sequence is exact.
    assert renderer.decode(trace.sequences[-1].tokens) == renderer.render(history, TOOLS, add_generation_prompt=True)


def test_qwen3_without_user_replies_keeps_one_sequence(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen3-0.6B"))
    session, history, _ = play(renderer, 50, reasoning=True)
    assert session.restarts == 0
    assert renderer.decode(session.current.tokens) == renderer.render(history, TOOLS, add_generation_prompt=True)


def test_cut_off_generation_gets_the_templates_end_of_turn_untrained(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    opening, script = tool_conversation(1)
    session = TokenSession(renderer, TOOLS)
    session.start(opening)
    full_ids = template_completion(renderer, opening, script[0].assistant, TOOLS)
    cut = full_ids[:-1]  # stopped by max_tokens right before <|im_end|>
    assert renderer.decode(full_ids[-1:]) == "<|im_end|>"
    session.add_generation(cut, [None] * len(cut), script[0].assistant)
    session.extend(script[0].then)
    seq = session.current
    suffix = seq.tokens[seq.spans[-1].start :]
    assert renderer.decode(suffix).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")
    assert all(m == -100 for m in seq.masks[seq.spans[-1].start :])
    assert seq.logprob_gaps == len(cut)  # no logprobs reported: explicit gaps, not shifted


def test_logprobs_must_align_one_to_one(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    session = TokenSession(renderer, TOOLS)
    session.start([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="align"):
        session.add_generation([1, 2, 3], [-0.1, -0.2], {"role": "assistant", "content": "x"})


def test_session_refuses_out_of_order_use(qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    session = TokenSession(renderer, TOOLS)
    session.start([{"role": "user", "content": "hi"}])
    with pytest.raises(RuntimeError, match="before the model answered"):
        session.extend([{"role": "user", "content": "again"}])


def test_template_without_end_of_turn_is_refused(qwen_tokenizer):
    with pytest.raises(TemplateError, match="end-of-turn"):
        ChatRenderer(qwen_tokenizer, "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}")


def test_stand_in_cost_does_not_grow_with_history(qwen_tokenizer):
    # Not a timing: the text rendered per turn stays bounded while the conversation grows.
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    rendered: list[int] = []

    class Counting(ChatRenderer):
        def render(self, messages, tools, *, add_generation_prompt):
            text = super().render(messages, tools, add_generation_prompt=add_generation_prompt)
            rendered.append(len(messages))
            return text

    counting = Counting(qwen_tokenizer, renderer.template)
    opening, script = tool_conversation(50)
    session = TokenSession(counting, TOOLS)
    session.start(opening)
    history = list(opening)
    for turn in script:
        ids = template_completion(renderer, history, turn.assistant, TOOLS)
        history += [turn.assistant, *turn.then]
        session.add_generation(ids, [None] * len(ids), turn.assistant)
        rendered.clear()
        session.extend(turn.then)
        assert max(rendered) <= 2 + 2 * 3 + 1  # system, user, two turns of at most 2 calls each
