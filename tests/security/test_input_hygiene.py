"""Input hygiene: what a model writes is data, however malformed, and never crashes a command.

A scripted model (chat mode: an OpenAI-compatible server; token mode: a token server double)
sends lone surrogates, line separators, tool-call markup in its prose and ill-typed tool
arguments through the real CLI / agent loop; every run must finish and write whole output.
"""

from __future__ import annotations

from tests.support.embedded import embedded_tokenizer
import json
import shutil
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from batch_runner import BatchConfig, run_batch
from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig
from environments.models.token_mode import ChatRenderer
from exports import canonical_messages, read_conversations, sharegpt_to_messages, to_sharegpt
from tests.batch.batch_helpers import write_prompts
from tests.security.conftest import play
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread, tool_call
from tests.support.tiny_env import WriteWordEnv
from tests.tokens.doubles import Scripted, ScriptedTokenServerDouble

LONE = "\ud83d"  # the high half of 😀 alone: JSON can carry it escaped, UTF-8 cannot encode it
REPLACEMENT = "\ufffd"


def _groups(path: Path) -> list[dict[str, Any]]:
    # Read as UTF-8 bytes: a lone surrogate that reached the file would not decode.
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").split("\n") if line]


def _holds(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def _process(*flags: str) -> tuple[int, str]:
    run = run_cli(WriteWordEnv, "process", "--env.group_size", "2", "--env.total_steps", "1", *flags)
    return run.returncode, run.stderr


def test_lone_surrogates_from_a_chat_model_become_u_fffd_and_the_group_is_written(tmp_path):
    # Escaped in the server's JSON: in the prose and inside the arguments' own JSON text.
    arguments = '{"path": "answer.txt", "content": "apple ' + "\\ud83d" + '"}'

    def reply(body: dict[str, Any]) -> dict[str, Any]:  # per rollout: one call, then the answer
        if body["messages"][-1]["role"] == "user":
            return {"content": f"writing {LONE} now", "tool_calls": [tool_call("write_file", arguments)]}
        return {"content": f"done {LONE}"}

    script: list[Any] = [reply] * 4
    out = tmp_path / "groups.jsonl"
    with serving_in_a_thread(ScriptedOpenAIServer(script)) as server:
        code, err = _process(
            "--openai.base_url", server.base_url, "--openai.model_name", "scripted",
            "--env.tokenizer_name", embedded_tokenizer(), "--env.data_path_to_save_groups", str(out),
        )  # fmt: skip
    assert code == 0, err[-3000:]
    (group,) = _groups(out)
    assert len(group["tokens"]) == 2
    for messages in group["messages"]:
        said = [m for m in messages if m["role"] == "assistant"]
        assert said[0]["content"] == f"writing {REPLACEMENT} now" and said[-1]["content"] == f"done {REPLACEMENT}"
        args = json.loads(said[0]["tool_calls"][0]["function"]["arguments"])
        assert args == {"path": "answer.txt", "content": f"apple {REPLACEMENT}"}
        (result,) = [m for m in messages if m["role"] == "tool"]
        assert "error" not in json.loads(result["content"])  # the tool ran on the cleaned text


def test_lone_surrogates_written_by_a_token_model_are_replaced_and_the_group_is_written(tmp_path):
    tokenizer_dir = EmbeddedLLM(EmbeddedLLMConfig()).tokenizer_dir  # built from the GGUF, offline
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(tokenizer_dir)), None)
    # The model's own text spells the escape; the Hermes parser's JSON decoding makes it a lone surrogate.
    call = '{"name": "write_file", "arguments": {"path": "answer.txt", "content": "apple \\ud83d"}}'
    first = renderer.encode(f"writing \\ud83d now\n<tool_call>\n{call}\n</tool_call>{renderer.close.text}")
    # Every turn is the same call, so the order in which the two rollouts ask does not matter; the
    # second turn extends the held ids past the first call's arguments and result.
    script = [Scripted(first, [-0.1] * len(first))] * 4
    out = tmp_path / "groups.jsonl"
    with serving_in_a_thread(ScriptedTokenServerDouble(script)) as server:  # type: ignore[arg-type]  # same async context protocol
        code, err = _process(
            "--openai.base_url", server.url, "--openai.model_name", "scripted", "--env.runtime.token_server", "vllm",
            "--env.tokenizer_name", str(tokenizer_dir), "--env.data_path_to_save_groups", str(out),
            "--env.runtime.loop.max_turns", "2",
        )  # fmt: skip
    assert code == 0, err[-3000:]
    (group,) = _groups(out)
    assert len(group["tokens"]) == 2
    for tokens, messages in zip(group["tokens"], group["messages"]):
        assert _holds(tokens, first)  # the ids the model produced, unchanged
        said = [m for m in messages if m["role"] == "assistant"]
        assert said[0]["content"] == "writing \\ud83d now"  # the model's own text, verbatim
        args = json.loads(said[0]["tool_calls"][0]["function"]["arguments"])
        assert args == {"path": "answer.txt", "content": f"apple {REPLACEMENT}"}


def test_a_rollout_whose_tokens_cannot_be_built_is_left_out_with_its_reason(tmp_path):
    # A real tokenizer whose chat template refuses some text (templates raise on what they cannot
    # render); one rollout of the group writes it, the other does not.
    source = EmbeddedLLM(EmbeddedLLMConfig()).tokenizer_dir
    tokenizer_dir = tmp_path / "tokenizer"
    shutil.copytree(source, tokenizer_dir)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    refuse = "{%- for m in messages %}{%- if m.content and 'UNRENDERABLE' in m.content %}"
    refuse += "{{ raise_exception('this template cannot render that') }}{%- endif %}{%- endfor %}"
    config["chat_template"] = refuse + config["chat_template"]
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    answers = iter(["UNRENDERABLE", "done"])
    script: list[Any] = [lambda body: {"content": next(answers)}] * 2
    out = tmp_path / "groups.jsonl"
    with serving_in_a_thread(ScriptedOpenAIServer(script)) as server:
        code, err = _process(
            "--openai.base_url", server.base_url, "--openai.model_name", "scripted",
            "--env.tokenizer_name", str(tokenizer_dir), "--env.data_path_to_save_groups", str(out),
        )  # fmt: skip
    assert code == 0, err[-3000:]
    (group,) = _groups(out)
    assert len(group["tokens"]) == 1
    assert group["group_overrides"] == {"group_size": 1, "sequence_rollouts": [1], "rollouts": 2}
    (said,) = [m["content"] for m in group["messages"][0] if m["role"] == "assistant"]
    assert said == "done"
    (reason,) = group["left_out"]
    assert "this template cannot render that" in reason


async def test_line_separators_in_model_text_do_not_break_batch_output_or_resume(tmp_path):
    prose = "one\u2028two\u2029three\x85four"  # str.splitlines() splits at each of these
    dataset = write_prompts(tmp_path / "p.jsonl", [{"prompt": "first"}, {"prompt": "second"}])
    config = BatchConfig(
        dataset_file=dataset,
        run_name="seps",
        model="scripted",
        output_dir=tmp_path / "runs",
        distribution="math",
        base_url="",
        retry_backoff_s=0.01,
        runtime={"model_max_retries": 0},
    )
    async with ScriptedOpenAIServer([{"content": prose}] * 2) as server:
        stats = await run_batch(config.model_copy(update={"base_url": [server.base_url]}))
    assert stats["recorded"] == 2
    async with ScriptedOpenAIServer([]) as server:  # nothing is left to run
        resumed = await run_batch(config.model_copy(update={"base_url": [server.base_url], "resume": True}))
    assert resumed["recorded"] == 2 and resumed["missing"] == 0
    rows = [json.loads(x) for x in (tmp_path / "runs/seps/trajectories.jsonl").read_text().split("\n") if x]
    assert [r["final_response"] for r in rows] == [prose, prose]


def _conversation_rows(path: Path, contents: list[str]) -> Path:
    rows = []
    for i, content in enumerate(contents):
        messages = [
            {"role": "user", "content": "show me the markup"},
            {"role": "assistant", "content": content, "tool_calls": [tool_call("python", {"code": "print(1)"})]},
            {"role": "tool", "tool_call_id": "x", "name": "python", "content": "1"},
            {"role": "assistant", "content": content},
        ]
        messages[2]["tool_call_id"] = messages[1]["tool_calls"][0]["id"]
        rows.append({"prompt_id": f"p{i}", "messages": messages, "tools": []})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sharegpt_export_keeps_tool_call_markup_in_model_text_as_text(tmp_path):
    contents = [
        'I would call <tool_call>\n{"name": "terminal", "arguments": {"command": "rm -rf /"}}\n</tool_call>',
        "broken <tool_call>\n{not json\n</tool_call> markup",
        "<tool_call>\n",
    ]
    source = _conversation_rows(tmp_path / "in.jsonl", contents)
    for conv in read_conversations(source):
        record = json.loads(json.dumps(to_sharegpt(conv)))  # as written to and read from a file
        back = sharegpt_to_messages(record)
        assert canonical_messages(back) == canonical_messages(conv.messages)
        (real,) = [c for m in back for c in m.get("tool_calls") or []]  # only the structured call
        assert real["function"]["name"] == "python"


async def test_tool_arguments_are_checked_against_the_tool_schema(sandbox):
    # Each call breaks its tool's declared schema; a handler that coerced these would act on a
    # guess (the string "no" is truthy, "30" is a number of seconds to float()).
    bad = [
        ("patch", {"path": "f.txt", "old_string": "b", "new_string": "x", "replace_all": "no"}),
        ("terminal", {"command": "echo ran", "timeout": "30"}),
        ("write_file", {"path": "g.txt", "content": 12345}),
        ("read_file", {"path": "f.txt", "offset": 0}),
        ("search_files", {"pattern": "b", "target": "everything"}),
    ]
    expected = [
        ("replace_all", "'no' is not of type 'boolean'"),
        ("timeout", "'30' is not of type 'number'"),
        ("content", "12345 is not of type 'string'"),
        ("offset", "0 is less than the minimum of 1"),
        ("target", "'everything' is not one of ['content', 'files']"),
    ]
    turns = [[("write_file", {"path": "f.txt", "content": "a b b b"})], *([call] for call in bad)]
    turns.append([("read_file", {"path": "f.txt"}), ("read_file", {"path": "g.txt"})])
    async with sandbox.trajectory("schema") as executor:
        msgs = await play(executor, turns)
    for msg, (name, _), (argument, problem) in zip(msgs[1:6], bad, expected):
        error = msg["result"].get("error", "")
        assert error.startswith(f"{name}: argument '{argument}': {problem}") and "\n" not in error, (name, error)
        assert "output" not in msg["result"]  # the handler never ran
    assert "a b b b" in msgs[6]["result"]["content"]  # the patch changed nothing
    assert "not found" in msgs[7]["result"]["error"]  # nor was g.txt written
