"""Tool schemas whose every call is bounded (an enum, integers with a range): under a grammar a
call then always ends within the token cap, so `required` must always yield a parsed call."""

from __future__ import annotations

from typing import Any

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}},
            "required": ["city"],
        },
    },
}
TIMER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "set_timer",
        "description": "Start a timer.",
        "parameters": {
            "type": "object",
            "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 60}},
            "required": ["minutes"],
        },
    },
}
TOOLS = [WEATHER, TIMER]
PROMPTS = [
    "What is the weather in Paris?",
    "Set a timer for 5 minutes.",
    "Hello! How are you today?",
    "Write a haiku about the sea.",
    "Is it raining in Tokyo? Use get_weather.",
    "What is 2 + 2?",
]
