"""Exports of agent conversations for SFT: ShareGPT, OpenAI messages+tools, unified trajectories.

    python -m exports sharegpt   runs/NAME/trajectories.jsonl out.jsonl
    python -m exports openai     out/gaia_agent.jsonl out.jsonl
    python -m exports trajectory runs/NAME/trajectories.jsonl out.jsonl
    python -m exports sft        runs/NAME/trajectories.jsonl sft_dir/ [--val_fraction 0.1]

Input is either batch_runner output (one conversation per line) or an env's `process`
JSONL (one scored group per line, conversations under `messages`). Every format has an
inverse back to OpenAI messages, so each export round-trips (tool-call ids are renumbered).

ShareGPT turns are `{"from": system|human|gpt|tool, "value": ...}`; a gpt turn carries its
calls as `<tool_call>{"name", "arguments"}</tool_call>` blocks after its text, and how many
(`n_tool_calls`: the text is the model's, verbatim, markup included), and a tool turn its result
as `<tool_response>{"name", "content"}</tool_response>`. The unified trajectory is
`{task_id, domain, question, actions: [{step, turn, tool, arguments, result, error, thought}],
final_answer, metadata}`; a conversation with several user turns (a simulated user, τ²-bench)
also keeps its later user turns and the agent's replies to them in `metadata.dialogue`
(`[{turn, role, content}]`, `turn`: how many tool-call turns came before). `build_tool_sft`
cuts trajectories into per-tool SFT sets, split into train/val by task so no task lands in both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.models.chat_tokens import json_or_raw

__all__ = [
    "Conversation",
    "read_conversations",
    "to_sharegpt",
    "sharegpt_to_messages",
    "to_openai",
    "to_trajectory",
    "trajectory_to_messages",
    "NothingToExport",
    "build_tool_sft",
    "task_key",
    "canonical_messages",
]

_OPENAI_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


@dataclass
class Conversation:
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""  # "batch_runner" | "process"
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def read_conversations(path: Path) -> Iterator[Conversation]:
    """Conversations of a batch_runner output or of an env's `process` JSONL."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                row = {}
            if "prompt_id" in row and isinstance(row.get("messages"), list):
                meta = {
                    k: row[k]
                    for k in ("stop_reason", "completed", "toolsets", "model", "turns", "usage", "tool_calls")
                    if k in row
                }
                meta.update(row.get("metadata") or {})
                yield Conversation(
                    str(row["prompt_id"]), row["messages"], row.get("tools") or [], "batch_runner", None, meta
                )
            elif isinstance(row.get("scores"), list) and isinstance(row.get("messages"), list):
                infos = row.get("rollout_info") or [{} for _ in row["messages"]]
                for i, (messages, score) in enumerate(zip(row["messages"], row["scores"])):
                    if not isinstance(messages, list):
                        raise ValueError(f"{path}:{n}: messages[{i}] is not a list of chat messages")
                    info = dict(infos[i]) if i < len(infos) else {}
                    task = info.get("task_id", "item")
                    yield Conversation(
                        f"{task}#{n}.{i}", messages, row.get("tools") or [], "process", float(score), info
                    )
            else:
                raise ValueError(
                    f"{path}:{n} is neither a batch_runner result (prompt_id, messages) "
                    "nor a process group (messages, scores)"
                )


def _arguments_str(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def canonical_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI keys only, call ids renumbered in order, arguments parsed: what a round trip must keep."""
    ids: dict[str, str] = {}
    out = []
    for m in messages:
        c: dict[str, Any] = {k: m[k] for k in _OPENAI_KEYS if k in m and m[k] is not None}
        if m.get("role") == "assistant":
            c.setdefault("content", None)
            c["content"] = c["content"] or None
        if c.get("tool_calls"):
            calls = []
            for call in c["tool_calls"]:
                ids[call.get("id", "")] = f"call_{len(ids)}"
                calls.append(
                    {
                        "id": ids[call.get("id", "")],
                        "type": "function",
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": json_or_raw(call["function"].get("arguments")),
                        },
                    }
                )
            c["tool_calls"] = calls
        elif "tool_calls" in c:
            del c["tool_calls"]
        if c.get("role") == "tool":
            c["tool_call_id"] = ids.get(m.get("tool_call_id", ""), m.get("tool_call_id"))
        out.append(c)
    return out


# ---- ShareGPT -----------------------------------------------------------------------------

_ROLE_TO_FROM = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
_OPEN, _CLOSE = "<tool_call>\n", "\n</tool_call>"
_RESPONSE = re.compile(r"^<tool_response>\n(.*)\n</tool_response>$", re.DOTALL)


def to_sharegpt(conv: Conversation) -> dict[str, Any]:
    turns = []
    for m in conv.messages:
        role = m.get("role")
        if role not in _ROLE_TO_FROM:
            raise ValueError(f"conversation {conv.id}: role {role!r} has no ShareGPT equivalent")
        if role == "assistant":
            parts = [m["content"]] if m.get("content") else []
            calls = m.get("tool_calls") or []
            for call in calls:
                body = {"name": call["function"]["name"], "arguments": json_or_raw(call["function"].get("arguments"))}
                parts.append(f"{_OPEN}{json.dumps(body, ensure_ascii=False)}{_CLOSE}")
            value = "\n".join(parts)
        elif role == "tool":
            body = {"name": m.get("name"), "content": m.get("content")}
            value = f"<tool_response>\n{json.dumps(body, ensure_ascii=False)}\n</tool_response>"
        else:
            value = m.get("content") or ""
        turn: dict[str, Any] = {"from": _ROLE_TO_FROM[role], "value": value}
        if role == "assistant":
            # How many trailing blocks are the calls: the text before them may hold markup of its own.
            turn["n_tool_calls"] = len(m.get("tool_calls") or [])
        turns.append(turn)
    return {"id": conv.id, "conversations": turns, "tools": json.dumps(conv.tools, ensure_ascii=False)}


def _split_calls(value: str, count: int | None) -> tuple[str, list[dict[str, Any]]]:
    """(content, call bodies) of a gpt turn: the last `count` `<tool_call>` blocks are its calls,
    everything before them is the model's text, markup included, as it wrote it. Without a count
    (ShareGPT from elsewhere), every well-formed trailing block is a call."""
    bodies: list[dict[str, Any]] = []
    while (count is None or len(bodies) < count) and value.endswith(_CLOSE):
        # The JSON of a block holds no raw newline, so its opening tag is the last one.
        start = value.rfind(_OPEN)
        try:
            body = json.loads(value[start + len(_OPEN) : -len(_CLOSE)]) if start >= 0 else None
        except json.JSONDecodeError:
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("name"), str) and "arguments" in body):
            if count is None:
                break  # not a call this export wrote: it stays in the text
            raise ValueError(f"gpt turn should end with {count} <tool_call> blocks: {value[-80:]!r}")
        bodies.append(body)
        # to_sharegpt joins the text and the blocks with one newline
        value = value[: start - 1 if start > 0 and value[start - 1] == "\n" else start]
    if count is not None and len(bodies) < count:
        raise ValueError(f"gpt turn should end with {count} <tool_call> blocks: {value[-80:]!r}")
    return value, bodies[::-1]


def sharegpt_to_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    pending: list[str] = []  # call ids waiting for their tool turn
    count = 0
    for turn in record["conversations"]:
        kind, value = turn["from"], turn["value"]
        if kind == "gpt":
            content, bodies = _split_calls(value, turn.get("n_tool_calls"))
            calls = []
            for body in bodies:
                call_id = f"call_{count}"
                count += 1
                pending.append(call_id)
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": body["name"], "arguments": _arguments_str(body["arguments"])},
                    }
                )
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
        elif kind == "tool":
            match = _RESPONSE.match(value)
            if match is None:
                raise ValueError(f"tool turn is not a <tool_response> block: {value[:80]!r}")
            body = json.loads(match.group(1))
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": pending.pop(0) if pending else None,
                    "name": body["name"],
                    "content": body["content"],
                }
            )
        else:
            messages.append({"role": {"system": "system", "human": "user"}[kind], "content": value})
    return messages


# ---- OpenAI messages + tools --------------------------------------------------------------


def to_openai(conv: Conversation) -> dict[str, Any]:
    messages = [{k: m[k] for k in _OPENAI_KEYS if k in m} for m in conv.messages]
    calls = [c for m in messages for c in m.get("tool_calls") or []]
    if not all(isinstance(c.get("function"), dict) and "name" in c["function"] for c in calls):
        raise ValueError(f"conversation {conv.id}: a tool call has no function name")
    return {"messages": messages, "tools": conv.tools}


# ---- unified trajectory -------------------------------------------------------------------


def to_trajectory(conv: Conversation, domain: str | None = None) -> dict[str, Any]:
    msgs = conv.messages
    system = next((m["content"] for m in msgs if m.get("role") == "system"), None)
    users = [m for m in msgs if m.get("role") == "user"]
    if not users:
        raise ValueError(f"conversation {conv.id}: a trajectory needs a user question, found none")
    results = {m.get("tool_call_id"): m for m in msgs if m.get("role") == "tool"}
    actions: list[dict[str, Any]] = []
    # Several user turns: the turns after the question, and the agent's words between them, in order.
    dialogue: list[dict[str, Any]] | None = [] if len(users) > 1 else None
    # What the prompt put in the agent's mouth before the question (τ²'s fixed greeting): kept apart.
    first = next(i for i, m in enumerate(msgs) if m is users[0])
    opening = [{"role": m["role"], "content": m.get("content")} for m in msgs[:first] if m.get("role") == "assistant"]
    final_answer = None
    turn = 0
    for m in msgs[first:]:
        if m.get("role") == "user" and m is not users[0] and dialogue is not None:
            dialogue.append({"turn": turn, "role": "user", "content": m.get("content")})
        if m.get("role") != "assistant":
            continue
        calls = m.get("tool_calls") or []
        if not calls:
            final_answer = m.get("content")
            if dialogue is not None:
                dialogue.append({"turn": turn, "role": "assistant", "content": final_answer})
            continue
        for call in calls:
            result = results.get(call.get("id"), {})
            content = result.get("content")
            error = None
            if isinstance(content, str) and content.startswith('{"error"'):
                error = json_or_raw(content).get("error") if isinstance(json_or_raw(content), dict) else None
            actions.append(
                {
                    "step": len(actions) + 1,
                    "turn": turn,
                    "tool": call["function"]["name"],
                    "arguments": json_or_raw(call["function"].get("arguments")),
                    "result": content,
                    "error": error,
                    "thought": m.get("content"),
                }
            )
        turn += 1
    metadata = {**conv.metadata, "system": system, "tools": conv.tools, "source": conv.source, "score": conv.score}
    if opening:
        metadata["opening"] = opening
    if dialogue is not None:
        metadata["dialogue"] = dialogue
    return {
        "task_id": conv.id,
        "domain": domain or conv.metadata.get("domain") or conv.source or "general",
        "question": users[0]["content"],
        "actions": actions,
        "final_answer": final_answer,
        "metadata": metadata,
    }


def trajectory_to_messages(traj: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if traj["metadata"].get("system") is not None:
        messages.append({"role": "system", "content": traj["metadata"]["system"]})
    messages.extend(traj["metadata"].get("opening") or [])
    messages.append({"role": "user", "content": traj["question"]})
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for action in traj["actions"]:
        by_turn.setdefault(action["turn"], []).append(action)
    dialogue = traj["metadata"].get("dialogue")
    said = list(dialogue or [])
    for turn in sorted(by_turn):
        while said and said[0]["turn"] <= turn:  # what was said before this tool-call turn
            messages.append({"role": said[0]["role"], "content": said.pop(0)["content"]})
        actions = by_turn[turn]
        calls = [
            {
                "id": f"call_{a['step'] - 1}",
                "type": "function",
                "function": {"name": a["tool"], "arguments": _arguments_str(a["arguments"])},
            }
            for a in actions
        ]
        messages.append({"role": "assistant", "content": actions[0]["thought"], "tool_calls": calls})
        for a, call in zip(actions, calls):
            if a["result"] is not None:
                messages.append({"role": "tool", "tool_call_id": call["id"], "name": a["tool"], "content": a["result"]})
    messages.extend({"role": d["role"], "content": d["content"]} for d in said)
    if dialogue is None and traj["final_answer"] is not None:  # a dialogue holds its final answer
        messages.append({"role": "assistant", "content": traj["final_answer"]})
    return messages


def task_key(traj: dict[str, Any]) -> str:
    """What makes two trajectories the same task: the question asked. Rollouts of one question
    (`item#2.0`, `item#2.1`, or the same prompt in two groups) share it, whatever their ids."""
    return f"{traj['metadata'].get('system') or ''}\x00{traj['question']}"


def _split_of(key: str, val_fraction: float, seed: int) -> str:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return "val" if int.from_bytes(digest[:8], "big") / 2**64 < val_fraction else "train"


def _safe_dir_name(name: Any) -> bool:
    """A tool name that is one plain path component (the SFT sets are `<dir>/<tool>/<split>.jsonl`)."""
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}", name) is not None


def build_tool_sft(
    trajectories: Iterable[dict[str, Any]],
    out_dir: Path,
    *,
    val_fraction: float = 0.1,
    seed: int = 0,
    min_score: float | None = None,
    skip_failed_calls: bool = True,
) -> dict[str, dict[str, int]]:
    """Per tool: examples whose last message is an assistant turn calling that tool.

    Each example is the conversation up to and including that turn, with the tools
    offered. A task (`task_key`: the question) goes wholly to train or to val by a hash,
    so val never sees a question train saw. A call whose tool name is not one plain path component
    (`../x`, `a/b`: never a registered tool, only what a model wrote) makes no set. Returns (and writes
    to manifest.json) the counts.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    sets: dict[str, dict[str, list[dict[str, Any]]]] = {}
    seen = kept = with_calls = 0  # for the reason when nothing is exported
    for traj in trajectories:
        seen += 1
        score = traj["metadata"].get("score")
        if min_score is not None and (score is None or score < min_score):
            continue
        kept += 1
        with_calls += bool(traj["actions"])
        messages = trajectory_to_messages(traj)
        split = _split_of(task_key(traj), val_fraction, seed)
        # index of each turn's assistant message in `messages`
        turn_at = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls")]
        for turn_index, position in enumerate(turn_at):
            actions = [a for a in traj["actions"] if a["turn"] == turn_index]
            for tool in dict.fromkeys(a["tool"] for a in actions):
                if not _safe_dir_name(tool):  # a name the model made up; no registered tool is named so
                    continue
                if skip_failed_calls and any(a["error"] for a in actions if a["tool"] == tool):
                    continue
                example = {
                    "task_id": traj["task_id"],
                    "tool": tool,
                    "messages": messages[: position + 1],
                    "tools": traj["metadata"].get("tools") or [],
                }
                sets.setdefault(tool, {"train": [], "val": []})[split].append(example)
    if not sets:  # said before anything is written: an empty set would look like a result
        raise NothingToExport(_why_nothing(seen, kept, with_calls, min_score))
    manifest = {tool: {s: len(rows) for s, rows in parts.items()} for tool, parts in sorted(sets.items())}
    out_dir.mkdir(parents=True, exist_ok=True)
    for tool, parts in sets.items():
        (out_dir / tool).mkdir(exist_ok=True)
        for split, rows in parts.items():
            (out_dir / tool / f"{split}.jsonl").write_text(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            )
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


class NothingToExport(ValueError):
    """The input holds no example of the requested kind (exit 1, one line saying why)."""


def _why_nothing(seen: int, kept: int, with_calls: int, min_score: float | None) -> str:
    if seen == 0:
        return "the input holds no trajectory"
    if kept == 0:
        return f"none of the {seen} trajectories scores at least --min_score {min_score}"
    if with_calls == 0:
        return (
            f"none of the {kept} trajectories calls a tool (SFT examples are tool-calling turns); on a small model "
            "require a first call with --env.runtime.loop.first_turn_tool_choice required"
        )
    return f"every tool call in the {with_calls} trajectories that make one failed (failed calls are not examples)"


def _records(args: argparse.Namespace) -> list[dict[str, Any]]:
    convert = {"sharegpt": to_sharegpt, "openai": to_openai, "trajectory": lambda c: to_trajectory(c, args.domain)}[
        args.format
    ]
    return [convert(c) for c in read_conversations(args.input)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exports", description=__doc__.split("\n\n")[0])
    parser.add_argument("format", choices=["sharegpt", "openai", "trajectory", "sft"])
    parser.add_argument("input", type=Path, help="batch_runner trajectories.jsonl or a process JSONL")
    parser.add_argument("output", type=Path, help="output JSONL (a directory for sft)")
    parser.add_argument("--val_fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min_score", type=float, default=None, help="sft: only trajectories scoring at least this")
    parser.add_argument(
        "--domain", default=None, help="trajectory/sft: domain of every record (default: from metadata)"
    )
    args = parser.parse_args(argv)
    # Everything is read and converted before anything is written: bad input leaves no output behind.
    try:
        if not 0.0 <= args.val_fraction < 1.0:
            raise ValueError(f"--val_fraction must be in [0, 1), got {args.val_fraction}")
        if not args.input.is_file():
            raise ValueError(f"{args.input} is not a file; give a batch_runner trajectories.jsonl or a process JSONL")
        if args.format == "sft":
            trajectories = [to_trajectory(c, args.domain) for c in read_conversations(args.input)]
            if args.output.exists() and any(args.output.iterdir()):
                raise ValueError(f"{args.output} exists and is not empty; give a new directory for the SFT sets")
            manifest = build_tool_sft(
                trajectories, args.output, val_fraction=args.val_fraction, seed=args.seed, min_score=args.min_score
            )
            print(json.dumps(manifest))
            return 0
        records = _records(args)
    except NothingToExport as exc:
        print(f"nothing to export: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = f"{args.input}: a record lacks the key {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"error: {detail}".splitlines()[0], file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    print(f"wrote {len(records)} {args.format} records to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
