"""What every parser family shares: the result types, the base class, argument handling.

Standard library only (this package is meant to be vendored by other projects).
"""

from __future__ import annotations

import json
import json.scanner
import re
from dataclasses import dataclass, field
from random import getrandbits
from typing import Any, ClassVar, Iterable, Mapping

__all__ = [
    "ParseIssue",
    "ParseResult",
    "ToolCallParser",
    "ToolCallStream",
    "make_call",
    "NAME_PATTERN",
    "JSON_DECODER",
]

_SNIPPET = 80


def _no_constants(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise json.JSONDecodeError(f"{text[:20]} does not fit a float", text, 0)
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        raise json.JSONDecodeError(f"integer with {len(text)} digits", text, 0) from None


# Python's json accepts NaN/Infinity and overflows 1e999 to inf; arguments must be JSON
# that any consumer can read back, so those are decoding errors here.
JSON_DECODER = json.JSONDecoder(parse_constant=_no_constants, parse_float=_finite, parse_int=_int)
# The same rules for the hot path, called without `raw_decode`'s Python frame and with the C
# scanner's own int conversion (no Python call per integer). The one difference, an integer
# too long to convert, raises a plain ValueError there: JSON_DECODER then says it in its words.
_SCAN = json.scanner.make_scanner(json.JSONDecoder(parse_constant=_no_constants, parse_float=_finite))  # type: ignore[arg-type]  # typeshed names the context type wrongly; json passes its decoder

# What a function name may look like in any family: OpenAI's `[A-Za-z0-9_-]` plus the
# dots, colons and slashes of namespaced (MCP-style) tools. Anything else (quotes,
# spaces, control characters) is a format error rather than a call to a tool that
# cannot exist.
NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.:/\-]{0,127}"
_NAME = re.compile(NAME_PATTERN)


# `valid_name` without its frame, for per-call paths: None when the name is not valid.
match_name = _NAME.fullmatch


# A call object as templates write it: `{"name": "<valid name>", "arguments"|"parameters": ` then
# one object, JSON whitespace anywhere between.
_USUAL_CALL = re.compile(
    r'[ \t\r\n]*\{[ \t\r\n]*"name"[ \t\r\n]*:[ \t\r\n]*"('
    + NAME_PATTERN
    + r')"[ \t\r\n]*,[ \t\r\n]*"(arguments|parameters)"[ \t\r\n]*:[ \t\r\n]*(?=\{)'
)
_OBJECT_END = re.compile(r"[ \t\r\n]*\}")


def usual_call_object(text: str, at: int, arg_keys: tuple[str, ...]) -> tuple[str, dict[str, Any], str, int] | None:
    """(name, arguments, their JSON text, where the object ends) for the call object at `at` as
    templates write it; only the arguments are decoded, and kept as written (no second encoding).
    None for any other text: the family's general path decides it, with the same outcome for this."""
    head = _USUAL_CALL.match(text, at)
    if head is None or head[2] not in arg_keys:
        return None
    start = head.end()
    try:
        arguments, stop = _SCAN(text, start)
    except (StopIteration, ValueError):
        return None  # the general path decodes it again and says what is wrong
    close = _OBJECT_END.match(text, stop)
    if close is None:
        return None
    return head[1], arguments, text[start:stop], close.end()


def valid_name(name: str) -> bool:
    return match_name(name) is not None


_KEY = re.compile(r"[^<>\n\r]+")


def valid_key(key: str) -> bool:
    """A parameter name written in markup: not empty, no tag characters or line breaks."""
    return _KEY.fullmatch(key) is not None


@dataclass(frozen=True)
class ParseIssue:
    """Why one block of markup did not become a tool call (a format error is data, not a crash)."""

    start: int  # offset of the block in the parsed text
    end: int
    reason: str
    snippet: str

    def __str__(self) -> str:
        return f"{self.reason} (at {self.start}..{self.end}: {self.snippet!r})"


@dataclass
class ParseResult:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[ParseIssue] = field(default_factory=list)
    # Only the harmony (gpt-oss) family separates reasoning from content in the raw text.
    reasoning: str | None = None


class Finder:
    """`text.find(token, i)` for a scan that moves forward: each occurrence is searched once.

    A tag that occurs late or never, searched again from every position of a long text,
    would make a scan quadratic.
    """

    def __init__(self, text: str, token: str) -> None:
        self._text = text
        self._token = token
        self._from: int | None = None
        self._hit = -1

    def find(self, i: int) -> int:
        # The last answer (first hit at or after `_from`) still holds for any i in [_from, hit].
        if self._from is not None and self._from <= i and (self._hit == -1 or self._hit >= i):
            return self._hit
        self._from, self._hit = i, self._text.find(self._token, i)
        return self._hit


class TagBlocks:
    """The blocks between one family's opening and closing tags in one text, found front to back.

    A block ends at its closing tag; without one (a truncated or sloppy completion) it runs to
    the next opening tag or the end of the text, so one missing tag costs one call, not the rest.
    """

    __slots__ = ("opens", "closes", "_close_len", "_size")

    def __init__(self, text: str, open_tag: str, close_tag: str) -> None:
        self.opens = Finder(text, open_tag)
        self.closes = Finder(text, close_tag)
        self._close_len = len(close_tag)
        self._size = len(text)

    def extent(self, body_start: int) -> tuple[int, int]:
        """(body end, block end) of the block whose body starts at `body_start`."""
        return block_extent(self.closes.find(body_start), self.opens.find(body_start), self._close_len, self._size)


def block_extent(close: int, nxt: int, close_len: int, limit: int) -> tuple[int, int]:
    """(body end, block end), given where the block's closing tag and the next opening tag are
    (-1: none): the closing tag when it comes first, else the next opening tag or `limit`."""
    if close != -1 and (nxt == -1 or close < nxt):
        return close, close + close_len
    stop = limit if nxt == -1 else nxt
    return stop, stop


class DecodeBudget:
    """How many failed JSON decodes one parse may still spend on the whole text.

    json builds each error message by counting lines from the start of the document, so a
    failed `raw_decode(text, i)` costs O(i); thousands of broken blocks in one long text
    would be quadratic. Past the budget, parsers stop trying and leave the rest as text.
    """

    LIMIT = 64

    def __init__(self) -> None:
        self.failures = 0

    @property
    def exhausted(self) -> bool:
        return self.failures >= self.LIMIT

    def decode(self, text: str, at: int) -> tuple[Any, int]:
        """`JSON_DECODER.raw_decode(text, at)`, counting failures (raises the same errors)."""
        try:
            return _SCAN(text, at)  # the same rules in C, without raw_decode's frame
        except (StopIteration, ValueError):
            pass
        try:
            return JSON_DECODER.raw_decode(text, at)  # fails too, with json's message
        except ValueError:
            self.failures += 1
            raise


def issue(text: str, start: int, end: int, reason: str) -> ParseIssue:
    snippet = text[start:end]
    if len(snippet) > _SNIPPET:
        snippet = snippet[: _SNIPPET // 2] + "…" + snippet[-_SNIPPET // 2 :]
    return ParseIssue(start, end, reason, snippet)


def new_call_id() -> str:
    # Ids only have to differ within one conversation; a syscall per id (os.urandom) is wasted.
    return "call_" + getrandbits(96).to_bytes(12, "big").hex()  # 24 hex digits; a third cheaper than f"{:024x}"


# One encoder for every call: `json.dumps(..., ensure_ascii=False)` builds a new one each time.
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def make_call(
    name: str, arguments: Mapping[str, Any], call_id: str | None = None, *, encoded: str | None = None
) -> dict[str, Any]:
    """An OpenAI-shaped tool call; `arguments` is always a JSON object encoded as a string.

    `encoded`: the JSON text the model wrote for exactly this object, already decoded and checked
    by the caller; it is kept as written (as vLLM does) instead of being encoded again.
    """
    if encoded is None:
        encoded = _ENCODE(arguments if type(arguments) is dict else dict(arguments))
    if not call_id:
        call_id = "call_" + getrandbits(96).to_bytes(12, "big").hex()  # new_call_id(), without its frame per call
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": encoded}}


def arguments_object(raw: Any) -> dict[str, Any] | str:
    """Normalise the arguments a model wrote; returns the dict, or the reason it is not one.

    Models write an object (usual), a JSON string holding an object (double-encoded,
    common with small models) or nothing (a call without arguments).
    """
    if raw is None:
        return {}
    if isinstance(raw, str):
        stripped = raw.strip()
        if not stripped:
            return {}
        try:
            raw = JSON_DECODER.decode(stripped)
        except ValueError:
            return "arguments are a string that is not JSON"
    if not isinstance(raw, dict):
        return f"arguments must be a JSON object, got {type(raw).__name__}"
    return raw


def strip_code_fence(body: str) -> str:
    """`` ```json\\n{...}\\n``` `` -> `{...}` (closing fence optional); else `body` stripped."""
    s = body.strip()
    if not s.startswith("```"):
        return s
    if s.startswith("```json\n") and s.endswith("\n```"):  # as templates write it: the rule below, fewer steps
        return s[8:-4].strip()
    newline = s.find("\n")
    if newline == -1:
        return s
    lang = s[3:newline].strip()
    if lang and not lang.isalnum():
        return s
    # s ends in a non-space, so its tail needs no rstrip; one slice instead of three copies.
    end = len(s) - 3 if s.endswith("```", newline + 1) else len(s)
    return s[newline + 1 : end].strip()


def decode_json_exact(body: str) -> tuple[Any, str | None]:
    """Decode `body` as exactly one JSON value (code fences allowed); (value, error)."""
    value, _, reason = decode_json_text(body)
    return value, reason


def decode_json_text(body: str) -> tuple[Any, str, str | None]:
    """`decode_json_exact`, also returning the JSON text itself (fences and outer space removed)."""
    return decode_json_stripped(strip_code_fence(body))


def decode_json_stripped(s: str) -> tuple[Any, str, str | None]:
    """`decode_json_text` of a text already stripped of its fence and outer space."""
    if not s:
        return None, s, "empty tool call body"
    try:
        value, end = _SCAN(s, 0)
    except StopIteration as exc:  # raw_decode's "Expecting value"
        return None, s, f"invalid JSON: Expecting value at position {exc.value}"
    except json.JSONDecodeError as exc:
        return None, s, f"invalid JSON: {exc.msg} at position {exc.pos}"
    except ValueError:
        try:
            JSON_DECODER.raw_decode(s)
        except json.JSONDecodeError as exc:
            return None, s, f"invalid JSON: {exc.msg} at position {exc.pos}"
        raise  # not reached: both decoders stop at the same integer
    if end != len(s):  # s is stripped: anything after the value is more than space
        return None, s, f"unexpected text after the JSON value: {s[end : end + 20]!r}"
    return value, s, None


def call_from_object(obj: Any, name_keys: Iterable[str], arg_keys: Iterable[str]) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) from `{"name": ..., "arguments"|"parameters": ...}`, or the reason not."""
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object, got {type(obj).__name__}"
    if not any(k in obj for k in name_keys) and isinstance(obj.get("function"), dict):
        obj = obj["function"]  # the OpenAI wire shape written out by the model
    name = next((obj[k] for k in name_keys if k in obj), None)
    if not isinstance(name, str) or not name.strip():
        return "tool call has no function name"
    if not valid_name(name.strip()):
        return f"invalid function name {name.strip()[:40]!r}"
    raw_args = next((obj[k] for k in arg_keys if k in obj), None)
    args = arguments_object(raw_args)
    if isinstance(args, str):
        return args
    return name.strip(), args


def tool_schemas(tools: Iterable[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """name -> the `properties` of its JSON schema, from OpenAI-shaped tool definitions."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        out[fn["name"]] = props if isinstance(props, Mapping) else {}
    return out


def join_content(pieces: Iterable[str]) -> str | None:
    text = "".join(pieces).strip()
    return text or None


class ToolCallParser:
    """Base of every family: `parse` never raises; `parse_detailed` also says what failed.

    Subclasses implement `_parse(text, schemas) -> ParseResult`. `tools` (OpenAI tool
    definitions) given to the constructor or to a call let the XML families convert
    parameter values to the declared types.
    """

    # Strings at which this family's markup can begin. A stream shows content up to the
    # first of them and holds the rest until the end; None holds everything (the content
    # is not known before the whole text is).
    stream_markers: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None = None) -> None:
        self._tools = list(tools) if tools is not None else None
        self._schemas = tool_schemas(self._tools)

    def stream(self, tools: Iterable[Mapping[str, Any]] | None = None) -> ToolCallStream:
        """A fresh per-request stream: `feed(delta) -> content to show now`, then `finish()`."""
        return ToolCallStream(self, tools if tools is not None else self._tools)

    def parse(
        self, text: str | None, tools: Iterable[Mapping[str, Any]] | None = None
    ) -> tuple[str | None, list[dict[str, Any]]]:
        result = self.parse_detailed(text, tools)
        return result.content, result.tool_calls

    def parse_detailed(self, text: str | None, tools: Iterable[Mapping[str, Any]] | None = None) -> ParseResult:
        if not text:
            return ParseResult(content=None)
        if not isinstance(text, str):
            return ParseResult(
                content=None, errors=[ParseIssue(0, 0, f"expected the completion text, got {type(text).__name__}", "")]
            )
        schemas = tool_schemas(tools) if tools is not None else self._schemas
        try:
            result = self._parse(text, schemas)
            if len(result.tool_calls) > 1:
                self._unique_ids(result.tool_calls)
            return result
        except Exception as exc:  # the never-raise contract; the fuzz tests keep this path empty
            return ParseResult(
                content=text.strip() or None,
                errors=[issue(text, 0, len(text), f"internal parser error {type(exc).__name__}: {exc}")],
            )

    def _parse(self, text: str, schemas: Mapping[str, Mapping[str, Any]]) -> ParseResult:
        raise NotImplementedError

    def new_call_id(self) -> str:
        return new_call_id()

    def _unique_ids(self, calls: list[dict[str, Any]]) -> None:
        # Ids the model wrote may repeat; tool results are matched by id, so they must not.
        if len(calls) < 2:
            return
        seen: set[str] = set()
        for call in calls:
            while call["id"] in seen:
                call["id"] = self.new_call_id()
            seen.add(call["id"])


class ToolCallStream:
    """Incremental parsing of one completion; all state lives here, not on the parser.

    `feed(delta)` returns the content that is safe to show now (text before any markup;
    never text that could still turn out to be part of a call). `finish()` returns the
    full `ParseResult` of everything fed, exactly what `parse_detailed` gives for it; the
    content still to show is `result.content[len(stream.shown):]`.
    """

    def __init__(self, parser: ToolCallParser, tools: Iterable[Mapping[str, Any]] | None) -> None:
        self._parser = parser
        self._tools = tools
        self._chunks: list[str] = []
        # Text after what was shown: held-back whitespace and a possible partial marker.
        # Only this short tail is searched again, so feeding stays linear in the text.
        self._pending = ""
        self._held = parser.stream_markers is None
        self._markers = parser.stream_markers or ()
        self._firsts = {m[0] for m in self._markers}
        self._longest = max((len(m) for m in self._markers), default=1)
        self._shown: list[str] = []

    @property
    def shown(self) -> str:
        """All content returned by `feed` so far."""
        if len(self._shown) > 1:
            self._shown[:] = ["".join(self._shown)]
        return self._shown[0] if self._shown else ""

    def feed(self, delta: str) -> str:
        self._chunks.append(delta)
        if self._held or not delta:
            return ""
        markers = self._markers
        buf = self._pending + delta
        cut = len(buf)
        for m in markers:
            p = buf.find(m)
            if p != -1 and p < cut:
                cut, self._held = p, True
        if not self._held:
            # A marker may be arriving split across deltas: keep a possible prefix back.
            cut = self._partial_marker_start(buf, max(0, len(buf) - self._longest + 1))
        head = buf[:cut]
        if not self._shown:  # the full parse strips leading whitespace from content
            stripped = head.lstrip()
            buf, head = buf[len(head) - len(stripped) :], stripped
        release = head.rstrip()  # trailing whitespace waits: it may end the content
        self._pending = buf[len(release) :]
        if release:
            self._shown.append(release)
        return release

    def _partial_marker_start(self, buf: str, lo: int) -> int:
        """Where the longest suffix of buf (starting at or after lo) that begins a marker starts."""
        markers = self._markers
        best = len(buf)
        for first in self._firsts:
            i = buf.find(first, lo)
            while i != -1 and i < best:
                if any(m.startswith(buf[i:]) for m in markers):
                    best = i
                    break
                i = buf.find(first, i + 1)
        return best

    def finish(self) -> ParseResult:
        return self._parser.parse_detailed("".join(self._chunks), self._tools)
