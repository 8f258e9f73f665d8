"""How Phase 2 traces become a ScoredDataGroup (the base env's build_group with real traces)."""

from __future__ import annotations

import pytest
from atroposlib.envs.base import APIServerConfig

from environments.agent_loop import AgentResult
from environments.gsm8k.env import GSM8kAgentEnv, GSM8kAgentEnvConfig
from environments.hermes_base_env import Rollout
from environments.models.token_mode import ChatRenderer, TokenSession
from environments.models.token_mode.wiring import trace_items
from environments.models.token_mode.testing import TOOLS, template_completion, tool_conversation

from .conftest import QWEN_TOKENIZER, template_text


def traced(renderer, turns, *, reasoning=False, user_every=0, trailing=False):
    opening, script = tool_conversation(turns, reasoning=reasoning, user_every=user_every)
    session = TokenSession(renderer, TOOLS)
    session.start(opening)
    history = list(opening)
    for i, turn in enumerate(script):
        ids = template_completion(renderer, history, turn.assistant, TOOLS)
        session.add_generation(ids, [-0.5] * len(ids), turn.assistant)
        history += [turn.assistant, *turn.then]
        if i < len(script) - 1 or trailing:
            session.extend(turn.then)
    return session.trace(), history


@pytest.fixture(scope="module")
def env():
    cfg = GSM8kAgentEnvConfig(tokenizer_name=str(QWEN_TOKENIZER), group_size=2, use_wandb=False)
    server = APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m", api_key="x", health_check=False)
    return GSM8kAgentEnv(cfg, [server], testing=True)


def rollout(trace, messages, score):
    result = AgentResult(
        messages=messages, turns_used=3, finished_naturally=True, stop_reason="finished", turns=[], tool_errors=[]
    )
    r = Rollout(item={"question": "q", "answer": "#### 1"}, result=result, score=score)
    r.extras["token_trace"] = trace
    return r


def test_group_carries_exact_tokens_masks_and_inference_logprobs(env, qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    (t1, m1), (t2, m2) = traced(renderer, 3), traced(renderer, 5)
    group = env.build_group([rollout(t1, m1, 1.0), rollout(t2, m2, 0.0)])
    assert group["tokens"] == [t1.sequences[0].tokens, t2.sequences[0].tokens]
    assert group["masks"] == [t1.sequences[0].masks, t2.sequences[0].masks]
    assert group["inference_logprobs"] == [t1.sequences[0].inference_logprobs, t2.sequences[0].inference_logprobs]
    assert group["scores"] == [1.0, 0.0] and group["messages"] == [m1, m2]
    assert group.get("group_overrides") is None


def test_non_append_only_rollout_becomes_several_items_and_the_group_says_its_size(env, qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen3-0.6B"))
    split, m1 = traced(renderer, 6, reasoning=True, user_every=3)
    whole, m2 = traced(renderer, 2, reasoning=True)
    assert split.restarts == 1 and whole.restarts == 0
    group = env.build_group([rollout(split, m1, 1.0), rollout(whole, m2, 0.0)])
    assert len(group["tokens"]) == len(group["masks"]) == len(group["inference_logprobs"]) == len(group["scores"]) == 3
    assert group["scores"] == [1.0, 1.0, 0.0]
    assert group["group_overrides"] == {"group_size": 3}
    assert [i["token_sequences"] for i in group["rollout_info"]] == [2, 2, 1]


def test_template_tokens_after_the_last_generation_are_cut(qwen_tokenizer):
    # A turn that never ran (context full) leaves a suffix with nothing sampled after it.
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    trace, _ = traced(renderer, 2, trailing=True)
    seq = trace.sequences[0]
    assert seq.spans[-1].kind == "template"
    ((tokens, masks, logprobs),) = trace_items(trace)
    assert tokens == seq.tokens[: seq.spans[-2].end] and masks[-1] != -100 and len(logprobs) == len(tokens)
