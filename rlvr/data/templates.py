"""Prompt templates: what the model sees for one problem.

A template is a user-turn format with ``{problem}``, a default system text and a default
assistant prefix. Chat templates (``chat=True``) are rendered through the tokenizer's own
chat template; a tokenizer without one is an error (use ``r1_base``, written for base
models, or a template file with ``chat: false``). ``plain`` uses the chat template when the
tokenizer has one and the bare problem text otherwise.

Built-in templates (:data:`TEMPLATES`):

- ``r1`` (``qwen_r1`` is MindSpeed-RL's name for it): system "You are a helpful assistant.",
  user turn = :data:`R1_INSTRUCTION` + problem; exactly MindSpeed-RL's ``qwen_r1`` text.
- ``r1_base``: the same instruction as plain text for base models, ending in
  ``"User: {problem}\\nAssistant: <think>"`` (``<think>`` is the assistant prefix).
- ``r1_tool``: ``r1`` with a sentence that shows the calculator's call syntax and a worked answer
  (:data:`TOOL_INSTRUCTION`), for ``rollout.tools=[calculator]`` with the default syntax.
- ``cot``: problem + "Please reason step by step, and put your final answer within \\boxed{}."
- ``plain``: the problem alone.

User templates: ``data.template=FILE.yaml`` (or ``.json``) holding ``user`` (with ``{problem}``),
optional ``system``, ``assistant_prefix`` and ``chat`` (default true); or a mapping of names to
such templates, chosen with ``data.template=FILE.yaml:NAME``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from rlvr.choices import TEMPLATE_FILE_SUFFIXES, is_template_file
from rlvr.errors import UserError

# The DeepSeek-R1-Zero instruction, worded as in MindSpeed-RL's `qwen_r1` template.
R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>. "
    "Put your final answer within \\boxed{}.\n"
)
TOOL_INSTRUCTION = (
    "While thinking, the Assistant can use a calculator: it writes <tool>calculator: 123*45</tool> and the "
    "exact result follows as <result>5535</result>. For example: <think><tool>calculator: 123*45</tool>"
    "<result>5535</result></think><answer>\\boxed{5535}</answer>\n"
)
"""The R1 instruction's tool sentence (template ``r1_tool``): the default call syntax
(``rollout.tool_call``, ``rollout.tool_result``) and a whole worked answer, for a model that has
never seen a tool call."""
COT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks for a program, and the Assistant writes it. "
    "The assistant first thinks about the problem in the mind, inside <think> </think> tags, and then gives "
    "the whole program in one fenced block: ```python ... ```.\n"
)
"""The R1 instruction for code (template ``r1_code``): think, then one fenced Python block, which the
``code_tests`` reward runs."""
PLACEHOLDER = "{problem}"


@dataclass(frozen=True)
class PromptTemplate:
    """One prompt template.

    Attributes:
        name: built-in name or ``FILE[:NAME]``.
        user: user-turn text with one ``{problem}`` placeholder (other braces are literal).
        system: default system text; None = no system turn of our own (a chat template may add its default).
        assistant_prefix: text after the assistant turn opens; part of the prompt and of what rewards read.
        chat: True = through the tokenizer's chat template (required); False = raw text;
            None = chat template if the tokenizer has one, else raw text.
    """

    name: str
    user: str
    system: str | None = None
    assistant_prefix: str = ""
    chat: bool | None = True

    def user_text(self, problem: str) -> str:
        head, _, tail = self.user.partition(PLACEHOLDER)
        return head + problem + tail


TEMPLATES: dict[str, PromptTemplate] = {
    "r1": PromptTemplate("r1", R1_INSTRUCTION + PLACEHOLDER, system="You are a helpful assistant."),
    "qwen_r1": PromptTemplate("qwen_r1", R1_INSTRUCTION + PLACEHOLDER, system="You are a helpful assistant."),
    "r1_base": PromptTemplate(
        "r1_base", R1_INSTRUCTION + "User: " + PLACEHOLDER + "\nAssistant: ", assistant_prefix="<think>", chat=False
    ),
    "r1_tool": PromptTemplate(
        "r1_tool", R1_INSTRUCTION + TOOL_INSTRUCTION + PLACEHOLDER, system="You are a helpful assistant."
    ),
    "r1_code": PromptTemplate("r1_code", CODE_INSTRUCTION + PLACEHOLDER, system="You are a helpful assistant."),
    "cot": PromptTemplate("cot", PLACEHOLDER + "\n" + COT_INSTRUCTION),
    "plain": PromptTemplate("plain", PLACEHOLDER, chat=None),
}


def _from_mapping(obj, where: str) -> PromptTemplate:
    if not isinstance(obj, dict) or "user" not in obj:
        raise UserError(f"{where}: a template needs a 'user' text with {PLACEHOLDER}, e.g. user: \"{PLACEHOLDER}\"")
    unknown = sorted(set(obj) - {"user", "system", "assistant_prefix", "chat"})
    if unknown:
        raise UserError(
            f"{where}: unknown template key(s) {', '.join(unknown)}; use user, system, assistant_prefix, chat"
        )
    user = obj["user"]
    if not isinstance(user, str) or user.count(PLACEHOLDER) != 1:
        raise UserError(f"{where}: 'user' must be a string with exactly one {PLACEHOLDER}")
    for key in ("system", "assistant_prefix"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise UserError(f"{where}: '{key}' must be a string")
    chat = obj.get("chat", True)
    if chat is not None and not isinstance(chat, bool):
        raise UserError(f"{where}: 'chat' must be true, false or null")
    return PromptTemplate(where, user, obj.get("system"), obj.get("assistant_prefix") or "", chat)


def load_template_file(spec: str) -> PromptTemplate:
    """A template from ``FILE`` or ``FILE:NAME`` (YAML or JSON)."""
    path_text, name = spec, None
    if not spec.endswith(TEMPLATE_FILE_SUFFIXES):
        path_text, name = spec.rsplit(":", 1)
    path = Path(path_text)
    if not path.is_file():
        raise UserError(f"template file {path} not found (data.template={spec})")
    try:
        text = path.read_text(encoding="utf-8")
        obj = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise UserError(f"template file {path} is not UTF-8 text") from None
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise UserError(
            f"template file {path} is not valid {path.suffix[1:].upper()}: {str(e).splitlines()[0]}"
        ) from None
    if isinstance(obj, dict) and "user" not in obj:  # a mapping of named templates
        names = ", ".join(sorted(map(str, obj))) or "none"
        if name is None:
            raise UserError(
                f"template file {path} holds several templates ({names}); choose one with data.template={path}:NAME"
            )
        if name not in obj:
            raise UserError(f"template file {path} has no template '{name}' (it has: {names})")
        return replace(_from_mapping(obj[name], f"{path}:{name}"), name=spec)
    if name is not None:
        raise UserError(f"template file {path} holds one template; use data.template={path}")
    return replace(_from_mapping(obj, str(path)), name=spec)


def get_template(
    spec: str = "r1", *, system_prompt: str | None = None, assistant_prefix: str | None = None
) -> PromptTemplate:
    """The template ``spec`` (a built-in name or a file), with the config's overrides applied.

    Args:
        spec: ``data.template``.
        system_prompt: ``data.system_prompt``; None keeps the template's, ``""`` means no system turn.
        assistant_prefix: ``data.assistant_prefix``; None keeps the template's.

    Raises:
        UserError: unknown name, or a template file that is missing or malformed.
    """
    if spec in TEMPLATES:
        template = TEMPLATES[spec]
    elif is_template_file(spec):
        template = load_template_file(spec)
    else:
        raise UserError(
            f"data.template={spec}: use {', '.join(TEMPLATES)} or a template file (.yaml/.json, optionally FILE:NAME)"
        )
    if system_prompt is not None:
        template = replace(template, system=system_prompt or None)
    if assistant_prefix is not None:
        template = replace(template, assistant_prefix=assistant_prefix)
    return template


def template_for(data) -> PromptTemplate:
    """The resolved template of a :class:`rlvr.config.DataConfig`."""
    return get_template(data.template, system_prompt=data.system_prompt, assistant_prefix=data.assistant_prefix)


def build_messages(
    question: str, *, template: str | PromptTemplate = "r1", system_prompt: str | None = None
) -> list[dict]:
    """Chat messages for one question: the system turn (if any), then the templated user turn."""
    t = template if isinstance(template, PromptTemplate) else get_template(template)
    system = t.system if system_prompt is None else (system_prompt or None)
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": t.user_text(question)}]


def render(tokenizer, template: PromptTemplate, question: str, *, system: str | None = None) -> str:
    """The full prompt text for ``question``: through the chat template (assistant turn opened)
    or as raw text, then the assistant prefix.

    Args:
        system: this row's own system text (a dataset's system column); None = the template's.

    Raises:
        UserError: a chat template is required and the tokenizer has none.
    """
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    use_chat = has_chat if template.chat is None else template.chat
    if use_chat and not has_chat:
        name = getattr(tokenizer, "name_or_path", "") or "the model"
        raise UserError(
            f"data.template={template.name} needs a chat template, and the tokenizer of {name} has none; "
            "use data.template=r1_base (plain text for base models), data.template=plain, "
            "or a template file with chat: false"
        )
    messages = build_messages(question, template=template, system_prompt=system)
    if use_chat:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(m["content"] + ("\n" if m["role"] == "system" else "") for m in messages)
    return text + template.assistant_prefix


def render_prompt(
    tokenizer,
    question: str,
    *,
    template: str | PromptTemplate = "r1",
    system_prompt: str | None = None,
    assistant_prefix: str | None = None,
) -> str:
    """The full prompt text of one question (see :func:`render`); None keeps the template's value.

    Example: the quickstart prompt is
    ``render_prompt(tok, "What is 2 + 3?", template="r1", assistant_prefix="<think>")``.
    """
    if isinstance(template, PromptTemplate):
        if system_prompt is not None:
            template = replace(template, system=system_prompt or None)
        if assistant_prefix is not None:
            template = replace(template, assistant_prefix=assistant_prefix)
    else:
        template = get_template(template, system_prompt=system_prompt, assistant_prefix=assistant_prefix)
    return render(tokenizer, template, question)


def _jinja_str(text: str) -> str:
    """``text`` as a Jinja string literal (Jinja reads Python's escapes, which JSON's are a subset of)."""
    return json.dumps(text, ensure_ascii=False)


def chat_template(template: PromptTemplate, base: str | None) -> str:
    """A Jinja chat template that renders as :func:`render` does, for a tokenizer whose own chat
    template is ``base`` (None: it has none).

    ``apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)``
    then gives ``render(tokenizer, template, question)``: every user message is wrapped in the
    template's user text, the template's system turn is added unless the messages open with one,
    and the assistant prefix follows the opened assistant turn. With ``chat=False`` (or ``plain`` and
    no ``base``) the turns are raw text, as ``rlvr chat`` joins them.

    Raises:
        UserError: the template needs a chat template and ``base`` is None.
    """
    use_chat = bool(base) if template.chat is None else template.chat
    if use_chat and not base:
        raise UserError(
            f"data.template={template.name} needs a chat template, and this tokenizer has none; "
            "there is no chat template to build on"
        )
    head, _, tail = template.user.partition(PLACEHOLDER)
    user = " + ".join(
        [*([_jinja_str(head)] if head else []), "message['content']", *([_jinja_str(tail)] if tail else [])]
    )
    name = template.name if template.name in TEMPLATES else Path(template.name).name  # no local paths
    # trim_blocks (as transformers renders) drops the newline after each block tag, so each tag has its line
    lines = [
        f"{{#- rlvr data.template={name.replace('#}', '')}: a user message holds the bare question -#}}",
        "{%- set ns = namespace(messages=[]) %}",
    ]
    if template.system:
        lines += [
            "{%- if not messages or messages[0]['role'] != 'system' %}",
            f"{{%- set ns.messages = [{{'role': 'system', 'content': {_jinja_str(template.system)}}}] %}}",
            "{%- endif %}",
        ]
    lines += [
        "{%- for message in messages %}",
        "{%- if message['role'] == 'user' %}",
        f"{{%- set ns.messages = ns.messages + [{{'role': 'user', 'content': {user}}}] %}}",
        "{%- else %}",
        "{%- set ns.messages = ns.messages + [message] %}",
        "{%- endif %}",
        "{%- endfor %}",
    ]
    if use_chat:
        # Jinja drops one trailing newline of a template's source; inside this one it would be output
        lines += ["{%- set messages = ns.messages %}", base.removesuffix("\n")]
    else:
        lines += [
            "{%- for message in ns.messages %}",
            "{{- message['content'] }}{% if message['role'] != 'user' %}{{ '\\n' }}{% endif %}",
            "{%- endfor %}",
        ]
    body = "\n".join(lines)
    if template.assistant_prefix:
        body += f"{{% if add_generation_prompt %}}{{{{ {_jinja_str(template.assistant_prefix)} }}}}{{% endif %}}"
    return body + "\n"
