"""The sampling record (`generation_params`) is what the server applied: per token protocol, a
recording double shows that the sampler values a group records are those in the request, read where
that protocol's server reads them (vLLM SamplingParams and llama.cpp /completion: the top level;
SGLang: `sampling_params`, seed as `sampling_seed`; tinker-atropos /generate: `sampling_params`'
max_new_tokens, temperature, n and stop only)."""

from __future__ import annotations

from typing import Any

import pytest
from atroposlib.envs.base import APIServerConfig

from environments.hermes_base_env import HermesAgentEnvConfig, HermesEnvError
from tests.support.tiny_env import WriteWordEnv

from .conftest import QWEN_TOKENIZER, TEMPLATES
from .doubles import Scripted, ScriptedTokenServerDouble

SAMPLER = ("top_k", "top_p", "min_p", "seed")


def _top_level(body: dict[str, Any], max_key: str) -> dict[str, Any]:
    return {
        "temperature": body["temperature"],
        "max_tokens": body[max_key],
        **{k: body.get(k) for k in SAMPLER},
    }


def _sglang(body: dict[str, Any]) -> dict[str, Any]:
    params = body["sampling_params"]
    read = {k: params.get(k) for k in ("top_k", "top_p", "min_p")}
    return {
        "temperature": params["temperature"],
        "max_tokens": params["max_new_tokens"],
        **read,
        "seed": params.get("sampling_seed"),
    }


def _tinker(body: dict[str, Any]) -> dict[str, Any]:
    params = body["sampling_params"]  # tinker-atropos builds Tinker's SamplingParams from these alone
    return {"temperature": params["temperature"], "max_tokens": params["max_new_tokens"], **dict.fromkeys(SAMPLER)}


READ_AS_THE_SERVER_DOES = {
    "vllm": lambda body: _top_level(body, "max_tokens"),
    "vllm_openai": lambda body: _top_level(body, "max_tokens"),
    "llamacpp": lambda body: _top_level(body, "n_predict"),
    "sglang": _sglang,
    "tinker": _tinker,
}
SENT = {"top_k": 20, "top_p": 0.9, "min_p": 0.05, "seed": 7}


def _env(kind: str, url: str, tmp_path, extra_body: dict[str, Any]) -> WriteWordEnv:
    config = HermesAgentEnvConfig(
        tokenizer_name=str(QWEN_TOKENIZER),
        runtime={
            "chat_template_path": str(TEMPLATES / "Qwen-Qwen3-0.6B.jinja"),
            "token_server": kind,
            "extra_body": extra_body,
            "loop": {"temperature": 0.6, "max_tokens": 48},
        },
        group_size=1,
        use_wandb=False,
        data_path_to_save_groups=None,
    )
    return WriteWordEnv(config, [APIServerConfig(base_url=url, model_name="m", api_key="x", health_check=False)])


async def _record_and_request(kind: str, tmp_path, extra_body: dict[str, Any]) -> tuple[dict, dict]:
    async with ScriptedTokenServerDouble([]) as double:
        env = _env(kind, double.url, tmp_path, extra_body)
        done = env.tokenizer.encode("<think>\n\n</think>\n\nDone.<|im_end|>")
        double.script.append(Scripted(done, [-0.1] * len(done)))
        async with env.runtime():
            await env.setup()
            rollout = await env.rollout(await env.get_next_item())
        group = env.build_group([rollout])
    ((_, body),) = double.requests
    return group["generation_params"], body


def _recorded(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "temperature": params["temperature"],
        "max_tokens": params["max_tokens"],
        **{k: params.get(k) for k in SAMPLER},
    }


@pytest.mark.parametrize("kind", ["vllm", "vllm_openai", "sglang", "llamacpp", "tinker"])
async def test_recorded_sampler_values_are_the_ones_the_server_reads(kind, tmp_path):
    # tinker-atropos carries no sampler setting (refused at start, below): its record says none was applied.
    sent = {} if kind == "tinker" else SENT
    params, body = await _record_and_request(kind, tmp_path, sent)
    read = READ_AS_THE_SERVER_DOES[kind](body)
    assert read == {"temperature": 0.6, "max_tokens": 48, **dict.fromkeys(SAMPLER), **sent}
    assert _recorded(params) == read
    assert ("server_defaults" in params) == (kind == "tinker")
    if kind == "sglang":  # merged into sampling_params: the request's own settings are still there
        assert body["sampling_params"]["stop_token_ids"] and not any(k in body for k in SAMPLER)
    if kind == "tinker":  # nothing it would ignore is sent, anywhere
        assert body["sampling_params"]["stop"] and not any(k in body or k in body["sampling_params"] for k in SAMPLER)


async def test_sglang_sampling_params_in_extra_body_are_merged_not_replacing(tmp_path):
    params, body = await _record_and_request("sglang", tmp_path, {"sampling_params": {"top_p": 0.8}})
    assert body["sampling_params"]["top_p"] == 0.8 and body["sampling_params"]["max_new_tokens"] == 48
    assert body["sampling_params"]["stop_token_ids"] and "sampling_params" not in {
        k for k in body if k != "sampling_params"
    }
    assert _recorded(params) == _sglang(body)


async def test_values_the_server_fills_itself_are_recorded_as_unknown(tmp_path):
    # vLLM's /v1/completions fills unset top_p/top_k from the model's generation_config.
    params, body = await _record_and_request("vllm_openai", tmp_path, {})
    assert not any(k in body for k in ("top_k", "top_p", "min_p"))
    assert params["top_k"] is params["top_p"] is params["min_p"] is None
    assert "generation_config" in params["server_defaults"]


@pytest.mark.parametrize("extra", [{"top_p": 0.9}, {"sampling_params": {"top_k": 5}}, {"seed": 1}])
def test_a_sampler_setting_tinker_cannot_carry_is_refused_at_start(extra, tmp_path):
    with pytest.raises(HermesEnvError, match="the tinker token protocol cannot carry it") as info:
        _env("tinker", "http://127.0.0.1:9", tmp_path, extra)
    assert "\n" not in str(info.value) and "reads temperature, max_tokens)" in str(info.value)


def test_a_setting_llamacpp_names_differently_is_refused(tmp_path):
    with pytest.raises(HermesEnvError, match="repeat_penalty"):
        _env("llamacpp", "http://127.0.0.1:9", tmp_path, {"repetition_penalty": 1.1})
