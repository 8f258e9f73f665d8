"""How Phase 2 traces become a ScoredDataGroup (the base env's build_group with real traces)."""

from __future__ import annotations

import pytest
from atroposlib.envs.base import APIServerConfig

from environments.agent_loop import AgentResult
from environments.gsm8k.env import GSM8kAgentEnv, GSM8kAgentEnvConfig
from environments.hermes_base_env import HermesEnvError, Rollout
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
    return GSM8kAgentEnv(cfg, [server])


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
    assert group["group_overrides"] == {"sequence_rollouts": [0, 1], "rollouts": 2}  # no group_size: complete


def test_a_split_rollout_keeps_its_last_sequence_by_default_so_the_group_stays_complete(env, qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen3-0.6B"))
    split, m1 = traced(renderer, 6, reasoning=True, user_every=3)
    whole, m2 = traced(renderer, 2, reasoning=True)
    assert split.restarts == 1 and whole.restarts == 0
    assert env.config.split_sequences == "last"
    group = env.build_group([rollout(split, m1, 1.0), rollout(whole, m2, 0.0)])
    # run-api releases exactly group_size sequences: one per rollout, the split one's last
    assert group["tokens"] == [split.sequences[-1].tokens, whole.sequences[0].tokens]
    assert group["inference_logprobs"] == [
        split.sequences[-1].inference_logprobs,
        whole.sequences[0].inference_logprobs,
    ]
    assert group["scores"] == [1.0, 0.0] and env._skip_reason(group, True, serving=True) is None
    assert group["group_overrides"] == {"sequence_rollouts": [0, 1], "rollouts": 2}
    assert [i["token_sequences"] for i in group["rollout_info"]] == [2, 1]


def test_split_sequences_all_keeps_every_sequence_tagged_with_its_rollout(env, qwen_tokenizer):
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen3-0.6B"))
    split, m1 = traced(renderer, 6, reasoning=True, user_every=3)
    whole, m2 = traced(renderer, 2, reasoning=True)
    env.config.split_sequences = "all"
    try:
        group = env.build_group([rollout(split, m1, 1.0), rollout(whole, m2, 0.0)])
        with pytest.raises(HermesEnvError, match="run-api buffers"):
            env.check_config("serve")
    finally:
        env.config.split_sequences = "last"
    assert len(group["tokens"]) == len(group["masks"]) == len(group["inference_logprobs"]) == len(group["scores"]) == 3
    assert group["scores"] == [1.0, 1.0, 0.0]
    assert group["group_overrides"] == {"sequence_rollouts": [0, 0, 1], "rollouts": 2, "group_size": 3}
    # process writes it (atroposlib's own check passes); serve would never post it
    assert env._skip_reason(group, True, serving=False) is None
    assert env._skip_reason(group, True, serving=True) == "3 sequences where run-api expects group_size 2"


def test_template_tokens_after_the_last_generation_are_cut(qwen_tokenizer):
    # A turn that never ran (context full) leaves a suffix with nothing sampled after it.
    renderer = ChatRenderer(qwen_tokenizer, template_text("Qwen-Qwen2.5-7B-Instruct"))
    trace, _ = traced(renderer, 2, trailing=True)
    seq = trace.sequences[0]
    assert seq.spans[-1].kind == "template"
    ((tokens, masks, logprobs),) = trace_items(trace)
    assert tokens == seq.tokens[: seq.spans[-2].end] and masks[-1] != -100 and len(logprobs) == len(tokens)
