"""How prompts are laid out for the LM: DSPy's ChatAdapter and three variants that cost the
embedded model fewer computed and generated tokens (`LMConfig.adapter` names one)."""

from __future__ import annotations

import json
import re

import dspy
from dspy.adapters.chat_adapter import field_header_pattern

ITEM_BOUNDARY = re.compile(r'"\s*,\s*"')
BARE_QUOTE = re.compile(r'(?<!\\)"')


class TolerantChatAdapter(dspy.ChatAdapter):
    """DSPy's ChatAdapter that also reads a list of strings whose strings quote something without
    escaping it: `["What is the f"" prefix short for?"]`. Questions about code and titles quote
    often, and a JSON repair splits such a string at its quotes into fragments that are no longer
    questions; here a list that is not JSON is split only where one string ends and the next
    begins (`quoted_items`). Replies that are JSON parse exactly as in DSPy; with `quoted_lists`
    off (as runs recorded before it read their replies), so does every reply."""

    def __init__(self, *args, quoted_lists: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.quoted_lists = quoted_lists

    def parse(self, signature, completion: str) -> dict:
        fields = super().parse(signature, completion)
        if not self.quoted_lists:
            return fields
        for name, field in signature.output_fields.items():
            if field.annotation == list[str] and (items := quoted_items(section(completion, name))) is not None:
                fields[name] = items
        return fields


def section(completion: str, name: str) -> str:
    """The text under the reply's first `[[ ## name ## ]]` header, as ChatAdapter.parse cuts it."""
    lines, inside = [], None
    for line in completion.splitlines():
        if match := field_header_pattern.match(line.strip()):
            if inside:
                break
            inside = match.group(1) == name
            line = line.strip()[match.end():]
        if inside:
            lines.append(line)
    return "\n".join(lines).strip()


def quoted_items(text: str) -> list[str] | None:
    """The strings of a one-line list `["...", "..."]` that is not valid JSON because its strings
    hold bare double quotes; None for valid JSON or anything not shaped as such a list."""
    if "\n" in text or not (text.startswith('["') and text.endswith('"]')):
        return None
    try:
        json.loads(text)
        return None
    except ValueError:
        pass
    try:
        return [json.loads('"' + BARE_QUOTE.sub(r'\\"', item) + '"') for item in ITEM_BOUNDARY.split(text[2:-2])]
    except ValueError:  # a bad escape: left to DSPy's repair
        return None


class LeanChatAdapter(TolerantChatAdapter):
    """ChatAdapter with its output-format reminder moved from the end of every request into the
    system message. The system message and the demonstrations are the prefix the server's prompt
    cache reuses across calls; the request is what it computes anew each time (METHOD.md is silent
    on prompts; the small model keeps the format with it, experiments/FINDINGS.md)."""

    def format_task_description(self, signature) -> str:
        return f"{super().format_task_description(signature)}\n\n{super().user_message_output_requirements(signature)}"

    def user_message_output_requirements(self, signature) -> None:
        return None


class PrefilledChatAdapter(TolerantChatAdapter):
    """ChatAdapter whose reply is started for the model and stopped where its fields end.

    The request ends with an assistant message holding the first output field's header, which
    llama.cpp continues instead of writing it; generation stops at the "completed" marker, or,
    for one output field, where the next header would start. The model writes those tokens
    word for word anyway (same prompt, same greedy continuation), and on a CPU a generated token
    costs several times a computed prompt token (`experiments/bench/lm.py` measures both). A server that
    does not continue a started reply writes the header itself; either way the reply parses."""

    def format(self, signature, demos, inputs) -> list[dict]:
        return super().format(signature, demos, inputs) + [{"role": "assistant", "content": self.opening(signature)}]

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        given = lm_kwargs.get("stop") or []
        stop = ([given] if isinstance(given, str) else list(given)) + self.stops(signature)
        return super().__call__(lm, {**lm_kwargs, "stop": stop}, signature, demos, inputs)

    def parse(self, signature, completion: str) -> dict:
        opening = self.opening(signature)
        return super().parse(signature, completion if completion.lstrip().startswith(opening.strip()) else opening + completion)

    @staticmethod
    def stops(signature) -> list[str]:
        return ["\n\n[["] if len(signature.output_fields) == 1 else ["[[ ## completed"]

    @staticmethod
    def opening(signature) -> str:
        return f"[[ ## {next(iter(signature.output_fields))} ## ]]\n"


class LeanPrefilledChatAdapter(PrefilledChatAdapter, LeanChatAdapter):
    """Both savings at once: the format reminder in the cached system message (fewer prompt tokens
    computed per call) and the reply started and stopped for the model (fewer tokens generated);
    the cost per token of each kind, and the seconds a question it saves: experiments/FINDINGS.md."""


ADAPTER_CLASSES = {"chat": TolerantChatAdapter, "lean": LeanChatAdapter, "prefilled": PrefilledChatAdapter,
                   "lean-prefilled": LeanPrefilledChatAdapter}


def make_adapter(name: str, quoted_lists: bool = True) -> TolerantChatAdapter:
    return ADAPTER_CLASSES[name](quoted_lists=quoted_lists)
