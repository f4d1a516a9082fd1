#!/usr/bin/env python3
"""Goldens for ferry's chat templates (tests/text/chat_template_test.cpp).

Renders every fixture template in tests/data/chat_templates/ with every
conversation in conversations.json, using transformers' own renderer:
transformers.utils.chat_template_utils.render_jinja_template, the function
PreTrainedTokenizerBase.apply_chat_template(..., tokenize=False) calls. No
tokenizer object is needed. apply_chat_template passes
{**tokenizer.special_tokens_map, **kwargs} as template variables; this script
passes the bos/eos tokens of each family in the same way, leaving out tokens
the family does not have (Qwen has no BOS token). Like apply_chat_template,
it drops message keys whose value is None.

strftime_now() is pinned to 2024-09-07 12:34:56 local time by patching the
datetime class that chat_template_utils imports. The C++ test injects the
same time through ChatTemplate's clock.

If a template raises (raise_exception, e.g. the Mistral templates on roles
that do not alternate), the golden records the error message, and the C++
test expects ChatTemplate to throw.

Usage: python3 tools/goldens/chat_template_goldens.py  (pins: requirements.txt)
"""

import datetime as _dt
import json
import pathlib

import jinja2
import transformers
from transformers.utils import chat_template_utils

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "chat_templates"
FIXED_NOW = _dt.datetime(2024, 9, 7, 12, 34, 56)

# Fixture -> the special tokens its tokenizer defines (None: not defined).
FAMILIES = {
    "smollm2-135m-instruct.jinja": ("<|im_start|>", "<|im_end|>"),
    "llama-3-8b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.1-8b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2-3b-instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2-7b-instruct.jinja": (None, "<|im_end|>"),
    "qwen2.5-7b-instruct.jinja": (None, "<|im_end|>"),
    "mistral-7b-instruct-v0.2.jinja": ("<s>", "</s>"),
    "mixtral-8x7b-instruct-v0.1.jinja": ("<s>", "</s>"),
    "openhermes-2.5-mistral-7b-chatml.jinja": ("<s>", "<|im_end|>"),
}

# Conversations also rendered with add_generation_prompt=False.
WITHOUT_GENERATION_PROMPT = {"system_user", "multi_turn", "ends_with_assistant", "tools_call"}


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW if tz is None else FIXED_NOW.replace(tzinfo=tz)


def render(template, conversation, add_generation_prompt, bos, eos):
    messages = [{k: v for k, v in m.items() if v is not None} for m in conversation["messages"]]
    kwargs = dict(conversation.get("extra", {}))
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages],
        tools=conversation.get("tools"),
        documents=None,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]


def main():
    assert jinja2.__version__ == "3.1.6", jinja2.__version__
    assert transformers.__version__ == "5.23.0", transformers.__version__
    chat_template_utils.datetime = _FixedDatetime

    conversations = json.loads((DATA / "conversations.json").read_text(encoding="utf-8"))["conversations"]
    cases = []
    for name, (bos, eos) in FAMILIES.items():
        template = (DATA / name).read_text(encoding="utf-8")
        for conv in conversations:
            for agp in (True, False) if conv["id"] in WITHOUT_GENERATION_PROMPT else (True,):
                case = {
                    "template": name,
                    "conversation": conv["id"],
                    "add_generation_prompt": agp,
                    "bos_token": bos,
                    "eos_token": eos,
                }
                try:
                    case["expected"] = render(template, conv, agp, bos, eos)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)

    out = {
        "generator": "tools/goldens/chat_template_goldens.py",
        "jinja2": jinja2.__version__,
        "transformers": transformers.__version__,
        "strftime_now": FIXED_NOW.isoformat(),
        "cases": cases,
    }
    path = DATA / "goldens.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in c for c in cases)
    print(f"wrote {path.relative_to(ROOT)}: {len(cases)} cases, {errors} expected errors")


if __name__ == "__main__":
    main()
