"""GaiaScriptedSolver: a deterministic `ChatModel` that solves the bundled offline GAIA tasks.

It is the reference agent of the offline set: for each task it issues the tool calls a
careful researcher would (read the attachment with python/read_file/terminal, search
the offline web and read the page), derives the answer from what the tools return,
and ends with `FINAL ANSWER: ...`. Nothing is looked up from the task's ground truth,
so a broken tool, a missing attachment or a corpus that lost a fact makes it fail.

    solver = GaiaScriptedSolver(task)          # one per trajectory
    await env.rollout(task, model=solver)
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Generator
from typing import Any

from environments.models.base import ModelError, ModelTurn, TurnOptions

__all__ = ["GaiaScriptedSolver", "SOLVED_TASKS"]

# A recipe yields (tool name, arguments) and receives the tool's answer; it returns the answer.
Recipe = Generator[tuple[str, dict[str, Any]], str, str]


def _find(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(f"the bundled file no longer says {pattern!r}")
    return match.group(1)


def _py(code: str) -> tuple[str, dict[str, Any]]:
    return "python", {"code": code}


def _output(result: str) -> str:
    """The stdout of a python/terminal tool answer (JSON with `output`, or plain text)."""
    try:
        payload = json.loads(result)
    except json.JSONDecodeError:
        return result.strip()
    if isinstance(payload, dict):
        if payload.get("error") or payload.get("exit_code") not in (0, None):
            raise RuntimeError(f"tool failed: {result[:500]}")
        for key in ("output", "stdout"):
            if isinstance(payload.get(key), str):
                return payload[key].strip()
    return result.strip()


def _search_and_read(query: str) -> Generator[tuple[str, dict[str, Any]], str, str]:
    found = json.loads((yield "web_search", {"query": query, "max_results": 3}))
    url = found["results"][0]["url"]
    page = json.loads((yield "web_extract", {"urls": [url]}))
    return page["results"][0]["content"]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def csv_sales(file: str) -> Recipe:
    out = yield _py(
        "import csv\n"
        f"rows = list(csv.DictReader(open({file!r})))\n"
        "print(sum(int(r['revenue_usd']) for r in rows if r['region'] == 'North' and r['quarter'] == 'Q3'))"
    )
    return _output(out)


def xlsx_stock(file: str) -> Recipe:
    out = yield _py(
        "import zipfile, re, collections\n"
        f"xml = zipfile.ZipFile({file!r}).read('xl/worksheets/sheet1.xml').decode()\n"
        "rows = [re.findall(r'<t>(.*?)</t>|<v>(.*?)</v>', r) for r in re.findall(r'<row[^>]*>(.*?)</row>', xml)]\n"
        "rows = [[t or v for t, v in r] for r in rows][1:]\n"
        "totals = collections.Counter()\n"
        "for item, _, units in rows: totals[item] += int(units)\n"
        "print(min(totals, key=totals.get))"
    )
    return _output(out)


def json_staff(file: str) -> Recipe:
    out = yield _py(
        "import json\n"
        f"staff = json.load(open({file!r}))['employees']\n"
        "print(sum(1 for s in staff if s['department'] == 'Engineering' and s['hired'] < '2020-01-01'))"
    )
    return _output(out)


def txt_log(file: str) -> Recipe:
    # The file toolset: read the log with read_file and count here.
    answer = json.loads((yield "read_file", {"path": file}))
    lines = [line.split("|", 1)[1] for line in answer["content"].splitlines()]
    count = sum(1 for line in lines if line.split()[2] == "ERROR" and "10:00:00" <= line.split()[1] <= "11:59:59")
    # ... and check the count with the terminal toolset.
    check = _output(
        (yield "terminal", {"command": f'awk \'$3=="ERROR" && $2>="10:00:00" && $2<="11:59:59"\' {file} | wc -l'})
    )
    if check.split()[-1] != str(count):
        raise RuntimeError(f"read_file count {count} and awk count {check!r} disagree")
    return str(count)


def docx_minutes(file: str) -> Recipe:
    text = _output(
        (
            yield _py(
                "import zipfile, re\n"
                f"xml = zipfile.ZipFile({file!r}).read('word/document.xml').decode()\n"
                "print('\\n'.join(re.findall(r'<w:t[^>]*>(.*?)</w:t>', xml)))"
            )
        )
    )
    return _find(r"([A-Z]\w+ [A-Z]\w+) was elected treasurer", text)


def pdf_invoice(file: str) -> Recipe:
    text = _output(
        (
            yield _py(
                "import re\n"
                f"data = open({file!r}, 'rb').read().decode('latin-1')\n"
                "print('\\n'.join(re.findall(r'\\((.*?)\\) \\'', data)))"
            )
        )
    )
    amount = _find(r"Total due: \$([\d,]+\.\d\d)", text)
    return _fmt(float(amount.replace(",", "")))


def png_grid(file: str) -> Recipe:
    out = yield _py(
        "import struct, zlib\n"
        f"data = open({file!r}, 'rb').read()\n"
        "pos, idat, width, height = 8, b'', 0, 0\n"
        "while pos < len(data):\n"
        "    n, kind = struct.unpack('>I4s', data[pos:pos + 8]); body = data[pos + 8:pos + 8 + n]; pos += 12 + n\n"
        "    if kind == b'IHDR': width, height, depth, ctype = struct.unpack('>IIBB', body[:10]); assert (depth, ctype) == (8, 2)\n"
        "    if kind == b'IDAT': idat += body\n"
        "raw = zlib.decompress(idat); stride = 1 + 3 * width\n"
        "def pixel(x, y):\n"
        "    row = raw[y * stride:(y + 1) * stride]; assert row[0] == 0, 'filtered rows not handled'\n"
        "    return tuple(row[1 + 3 * x:4 + 3 * x])\n"
        "cell = width // 8\n"
        "print(sum(1 for r in range(8) for c in range(8) if pixel(c * cell + cell // 2, r * cell + cell // 2) == (220, 30, 30)))"
    )
    return _output(out)


def web_lighthouse_year(_: str) -> Recipe:
    text = yield from _search_and_read("Halvorsen Point Lighthouse first lit")
    return _find(r"first lit in (\d{4})", text)


def web_architect_town(_: str) -> Recipe:
    text = yield from _search_and_read("Halvorsen Point Lighthouse architect")
    architect = _find(r"designed by the architect ([A-Z]\w+ [A-Z]\w+)", text)
    bio = yield from _search_and_read(f"{architect} architect born")
    return _find(r"born in [^.]*?([A-Z]\w+)\b", bio)


def web_orvane_moons(_: str) -> Recipe:
    text = yield from _search_and_read("moons of the planet Orvane")
    rows = text.split("Moon | Discovered", 1)[1].splitlines()
    moons = [r.split(" | ")[0] for r in rows if r.count(" | ") == 2]
    return ", ".join(sorted(moons))


def json_web_paddling(file: str) -> Recipe:
    trip = json.loads(_output((yield _py(f"print(open({file!r}).read())"))))
    text = yield from _search_and_read(f"{trip['river']} River length")
    km = float(_find(r"([\d,.]+) kilometres", text).replace(",", ""))
    return _fmt(km / trip["paddling_speed_kmh"])


def csv_web_visitors(file: str) -> Recipe:
    town, total = _output(
        (
            yield _py(
                "import csv\n"
                f"rows = list(csv.DictReader(open({file!r})))\n"
                "print(rows[0]['town'], sum(int(r['visitors']) for r in rows))"
            )
        )
    ).split()
    text = yield from _search_and_read(f"{town} population 2021 census")
    population = int(_find(r"population of\s*([\d,]+)", text).replace(",", ""))
    return f"{int(total) / population:.2f}"


SOLVED_TASKS: dict[str, Callable[[str], Recipe]] = {
    "offline-csv-sales": csv_sales,
    "offline-xlsx-stock": xlsx_stock,
    "offline-json-staff": json_staff,
    "offline-txt-log": txt_log,
    "offline-docx-minutes": docx_minutes,
    "offline-pdf-invoice": pdf_invoice,
    "offline-png-grid": png_grid,
    "offline-web-lighthouse-year": web_lighthouse_year,
    "offline-web-architect-town": web_architect_town,
    "offline-web-orvane-moons": web_orvane_moons,
    "offline-json-web-paddling": json_web_paddling,
    "offline-csv-web-visitors": csv_web_visitors,
}


class GaiaScriptedSolver:
    """One trajectory's scripted agent: one tool call per turn, then the final answer."""

    def __init__(self, task: dict[str, Any]) -> None:
        recipe = SOLVED_TASKS.get(task["task_id"])
        if recipe is None:
            raise KeyError(f"no scripted solution for task {task['task_id']!r}; known: {sorted(SOLVED_TASKS)}")
        self._recipe = recipe(task.get("file_name") or "")
        self._started = False
        self.calls: list[str] = []

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], options: TurnOptions
    ) -> ModelTurn:
        try:
            if not self._started:
                self._started = True
                name, args = next(self._recipe)
            else:
                last = messages[-1]
                if last.get("role") != "tool":
                    raise ModelError(f"scripted solver expected a tool result, got a {last.get('role')!r} message")
                name, args = self._recipe.send(last["content"])
        except StopIteration as stop:
            return ModelTurn(content=f"I checked the sources.\nFINAL ANSWER: {stop.value}", finish_reason="stop")
        offered = {t["function"]["name"] for t in tools}
        if name not in offered:
            raise ModelError(
                f"scripted solver needs tool {name!r}, which is not offered ({sorted(offered)})", retryable=False
            )
        self.calls.append(name)
        call = {
            "id": f"call_{uuid.uuid4().hex[:10]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        return ModelTurn(content=None, tool_calls=[call], finish_reason="tool_calls")
