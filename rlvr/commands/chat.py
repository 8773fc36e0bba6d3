"""`rlvr chat`: a terminal chat with a model (history, streaming, <think> dimmed); `--once` for scripts."""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading

from rlvr.errors import UserError

EXAMPLES = """examples:
  rlvr chat --model runs/quickstart                 # interactive; /reset /system TEXT /temp 0.7 /exit
  rlvr chat --model runs/quickstart --once "What is 3 + 4?"
  rlvr chat --model runs/arithmetic_tool --tools calculator    # calls run, results fed back
"""

HELP = "commands: /reset (forget the conversation)  /system TEXT  /temp T (0 = greedy)  /exit"


def render_chat(tokenizer, template, messages: list[dict]) -> str:
    """Prompt text for a conversation (assistant turn opened) plus the template's assistant prefix.

    Uses the tokenizer's chat template as :func:`rlvr.data.templates.render` does (a template
    with ``chat=False``, or ``plain`` on a tokenizer without one, gives the turns as raw text).
    """
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    use_chat = has_chat if template.chat is None else template.chat
    if use_chat and not has_chat:
        raise UserError(
            f"--template {template.name} needs a chat template and this tokenizer has none; "
            "use --template plain or r1_base"
        )
    if use_chat:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(m["content"] + ("\n" if m["role"] != "user" else "") for m in messages)
    return text + template.assistant_prefix


def until_stop(pieces, stop: list[str]):
    """The streamed ``pieces`` cut as :func:`rlvr.rollout.base.cut_at_stop` cuts their joined text.

    The token that completes a stop string may carry text after it (BPE merges ``><`` after
    ``</answer``), and the streamer flushes that token whole when generation ends; what is shown
    must be what the answer keeps. The rest of ``pieces`` is still read, so the streamer drains.
    """
    from rlvr.rollout.base import cut_at_stop

    text, shown = "", 0
    for piece in pieces:
        text += piece
        # until a stop string is complete the cut text is all of `text`, so what was shown is its prefix
        visible = cut_at_stop(text, stop)
        if len(visible) > shown:
            yield visible[shown:]
            shown = len(visible)


class Chat:
    """A conversation with one model: history, system prompt, temperature."""

    def __init__(
        self,
        model,
        tokenizer,
        style,
        *,
        max_new_tokens: int,
        temperature: float,
        stop: list[str] = (),
        tools=None,
        environment=None,
    ) -> None:
        from rlvr.cpu import PackedLinears, packable
        from rlvr.rollout import HFRolloutEngine
        from rlvr.rollout.hf import eos_token_ids

        self.model, self.tokenizer = model, tokenizer
        self.engine = None
        """With tools or an environment: the rollout engine that runs training's episodes (each reply shown
        whole, not streamed)."""
        self.template = style.resolve()
        if tools is not None or environment is not None:
            self.engine = HFRolloutEngine(
                model, tokenizer, max_new_tokens=max_new_tokens, batch_seqs=1, stop=list(stop), tools=tools,
                environment=environment,
            )  # fmt: skip
            self.engine.turn_prefix = self.template.assistant_prefix
        # on a CPU each token multiplies by oneDNN-packed weights (rlvr.cpu): faster products at one row
        self.packed = PackedLinears(model, rows_hint=1) if packable(model) and self.engine is None else None
        self.system = self.template.system or ""
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.stop = list(stop)
        self.history: list[dict] = []

    def messages(self, question: str) -> list[dict]:
        user = {"role": "user", "content": self.template.user_text(question)}
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.history + [user]

    def reply(self, question: str, on_text=None) -> str:
        """Generate the assistant's answer (``assistant_prefix`` included), streaming pieces to ``on_text``."""
        import torch
        from transformers import StoppingCriteriaList, TextIteratorStreamer

        from rlvr.rollout.hf import StopStrings

        messages = self.messages(question)
        prompt = render_chat(self.tokenizer, self.template, messages)
        if self.engine is not None:
            return self._reply_with_tools(messages, prompt, on_text)
        device = next(self.model.parameters()).device
        enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(device)
        sample = self.temperature > 0
        stop = StopStrings(self.tokenizer, self.stop, enc.input_ids.shape[1], 1, device) if self.stop else None
        kwargs = dict(
            stopping_criteria=StoppingCriteriaList([stop]) if stop else None,
            input_ids=enc.input_ids,
            attention_mask=enc.attention_mask,
            max_new_tokens=self.max_new_tokens,
            do_sample=sample,
            eos_token_id=self.eos_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            **(
                {"temperature": self.temperature, "top_p": 1.0, "top_k": 0}
                if sample
                else {"temperature": None, "top_p": None, "top_k": None}
            ),
        )
        if on_text is not None:
            on_text(self.template.assistant_prefix)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        worker = threading.Thread(target=lambda: self._generate(torch, kwargs, streamer), daemon=True)
        worker.start()
        pieces = []
        for piece in until_stop(streamer, self.stop):
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)
        worker.join()
        if self._error is not None:
            raise self._error
        answer = self.template.assistant_prefix + "".join(pieces)
        self.history += [messages[-1], {"role": "assistant", "content": answer}]
        return answer

    def _reply_with_tools(self, messages: list[dict], prompt: str, on_text) -> str:
        """One reply through the rollout engine's episode: calls paused, run, their results appended (or
        a plugin environment's answers, reset with the question as the row)."""
        greedy = self.temperature == 0
        how = dict(greedy=greedy, temperature=None if greedy else self.temperature, max_new_tokens=self.max_new_tokens)
        batch = self.engine.generate([prompt], 1, rows=[{"question": messages[-1]["content"]}], **how)
        answer = self.template.assistant_prefix + batch.texts[0]
        if on_text is not None:
            on_text(answer)
        self.history += [messages[-1], {"role": "assistant", "content": answer}]
        return answer

    _error: BaseException | None = None

    def _generate(self, torch, kwargs, streamer) -> None:
        self._error = None
        try:
            from rlvr.rollout.hf import own_generation_settings

            packed = self.packed.active() if self.packed is not None else contextlib.nullcontext()
            with torch.no_grad(), own_generation_settings(self.model), packed:
                self.model.generate(**kwargs, streamer=streamer)
        except BaseException as e:  # noqa: BLE001 - re-raised on the main thread
            self._error = e
            streamer.end()


class ThinkPrinter:
    """Prints streamed text, dimming everything up to ``</think>``."""

    def __init__(self, console) -> None:
        self.console = console
        self.text = ""
        self.shown = 0

    def __call__(self, piece: str) -> None:
        self.text += piece
        end = self.text.find("</think>")
        in_think = "<think>" in self.text
        boundary = end + len("</think>") if end >= 0 else (len(self.text) if in_think else 0)
        new = self.text[self.shown :]
        cut = max(0, min(len(new), boundary - self.shown))
        if cut:
            self.console.print(new[:cut], style="dim", end="", markup=False, highlight=False)
        if new[cut:]:
            self.console.print(new[cut:], end="", markup=False, highlight=False)
        self.shown = len(self.text)


def _command(chat: Chat, line: str, console) -> bool:
    """Handle a /command; returns False on /exit."""
    name, _, arg = line.partition(" ")
    if name in ("/exit", "/quit"):
        return False
    if name == "/reset":
        chat.history.clear()
        console.print("[dim](conversation cleared)[/dim]")
    elif name == "/system":
        chat.system = arg.strip()
        chat.history.clear()
        console.print("[dim](system prompt set; conversation cleared)[/dim]")
    elif name == "/temp":
        try:
            value = float(arg)
            if value < 0:
                raise ValueError
        except ValueError:
            console.print("[red]/temp needs a number >= 0, e.g. /temp 0.7[/red]")
        else:
            chat.temperature = value
            console.print(f"[dim](temperature {value})[/dim]")
    else:
        console.print(f"[red]unknown command {name}[/red]; {HELP}", highlight=False)
    return True


def undescribed_tools(style, names: list[str]) -> str | None:
    """One line where the prompt (``style``'s template, system text and prefix) names none of the tools:
    a model not trained with them is then told nothing of them and rarely calls one; else None."""
    template = style.resolve()
    said = " ".join(filter(None, (template.system, template.user, template.assistant_prefix)))
    missing = [n for n in names if n not in said]
    if len(missing) < len(names):
        return None
    return (
        f"note: --tools {','.join(names)}, but the prompt (template {style.template}) does not describe "
        f"{'it' if len(names) == 1 else 'them'}, so a model not trained with tools rarely calls one; "
        "--template r1_tool describes the calculator and its call syntax"
    )


def cmd_chat(args) -> int:
    from rlvr.commands.common import (
        BUILTIN_DEFAULT,
        environment_settings,
        model_settings,
        quiet_libraries,
        tool_settings,
    )
    from rlvr.evaluation import loading as eval_models
    from rlvr.tracking.console import make_console

    if args.temperature < 0:
        raise UserError(f"--temperature {args.temperature}: must be >= 0 (0 = greedy)")
    if args.once is not None and not args.once.strip():
        raise UserError("--once needs a non-empty question")
    if args.model is None:  # notes go to stderr: --once's stdout is the answer alone
        args.model = BUILTIN_DEFAULT
        print(f"no --model: chatting with the built-in {BUILTIN_DEFAULT} (--model RUN_DIR for a trained run)",
              file=sys.stderr, flush=True)  # fmt: skip
    resolved = eval_models.resolve(args.model)
    (style, max_new, stop), (dtype, dtype_line) = model_settings(args, [resolved], template="r1")
    tools = tool_settings(args, [resolved])
    if args.max_turns is not None and args.max_turns > 1 and not args.environment:
        raise UserError(
            f"--max-turns {args.max_turns}: code feedback runs a row's tests, and a chat has none; "
            "use rlvr eval --max-turns or rlvr generate --max-turns with rows that carry tests"
        )
    if args.max_turns is None and args.environment is None:  # a code run's feedback needs tests a chat lacks
        args.max_turns = 1
    environment, env_line = environment_settings(args, [resolved], tools)
    if tools is not None and (why := undescribed_tools(style, tools.names)):
        print(why, file=sys.stderr, flush=True)
    quiet_libraries()
    import torch

    torch.manual_seed(args.seed)
    model, tokenizer = eval_models.load(resolved, dtype=dtype, device=args.device)
    chat = Chat(
        model, tokenizer, style, max_new_tokens=max_new, temperature=args.temperature, stop=stop, tools=tools,
        environment=None if tools is not None else environment,
    )  # fmt: skip
    if args.once is not None:
        print(chat.reply(args.once), flush=True)
        return 0
    console = make_console(highlight=False)
    console.print(f"[bold]rlvr chat[/bold] with {resolved.label}  [dim]{HELP}[/dim]")
    console.print(dtype_line, style="dim", markup=False)  # --once stays quiet: its stdout is the answer
    if tools is not None:
        console.print(tools.describe() + " (replies shown whole)", style="dim", markup=False)
    elif env_line:
        console.print(env_line + " (replies shown whole)", style="dim", markup=False)
    while True:
        try:
            line = console.input("[bold green]you[/bold green] > ").strip()
        except EOFError:
            break
        if not line:
            continue
        if line.startswith("/"):
            if not _command(chat, line, console):
                break
            continue
        console.print("[bold blue]model[/bold blue] > ", end="")
        chat.reply(line, on_text=ThinkPrinter(console))
        console.print()
    return 0


def register(sub) -> None:
    from rlvr.commands.common import add_model_args

    p = sub.add_parser(
        "chat",
        help="chat with a model in the terminal (or answer one question with --once)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p, optional=True)
    p.add_argument("--once", default=None, metavar="QUESTION", help="answer one question on stdout and exit")
    p.add_argument(
        "--temperature", type=float, default=0.7, help="sampling temperature (0 = greedy; default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.set_defaults(func=cmd_chat)
