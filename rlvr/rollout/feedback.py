"""Multi-turn code episodes with execution feedback: the model writes code, the sandbox runs it against
the row's tests, and where a test fails the first failing test (its input, what was expected, what
the code gave) comes back as a user turn; the model tries again, up to ``rollout.max_turns`` turns.

How (:func:`generate_with_feedback`, which :meth:`HFRolloutEngine.generate
<rlvr.rollout.hf.HFRolloutEngine.generate>` runs when it gets the rows' tests and ``max_turns`` > 1):
the segment loop of :mod:`rlvr.rollout.tool_loop`, with the end of a turn (the end-of-sequence token
or a stop string) in place of a tool call's closing text:

1. Generate a turn; a row cut at its budget ends there.
2. Run each finished turn's code (its last fenced block, as the ``code_tests`` reward reads it) in
   the sandbox. A row whose code passes, or that has had ``max_turns`` turns, ends.
3. Append the feedback as the chat template's user turn and the assistant's next opening (tokenized
   on their own, masked out of the loss, KL and entropy as tool results are) and continue the row
   from its token ids, seeded with ``sample_seed(row seed, turn)``.

The reward is the final attempt's: ``code_tests`` reads the response's last fenced block. A row's
episode is a function of its seed, the weights and its tests' outcomes, whatever batch it shares, so
a resumed run samples what the first one sampled. The batch's texts show every turn.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from rlvr.rollout.sampling import sample_seed
from rlvr.rollout.tool_loop import _assemble, _left_pad, _Piece, _Row, take_turn

FEEDBACK_CHARS = 300
"""Characters of a test's input, expected and actual output quoted back to the model."""


def _clip(text: str) -> str:
    text = str(text)
    return text if len(text) <= FEEDBACK_CHARS else text[:FEEDBACK_CHARS] + "..."


def feedback_text(tests: dict, passed: list[bool], why: list[str], code: str | None) -> str:
    """The user turn after a failing attempt: the first failing test, or that no code was found."""
    if code is None:
        return "I found no code in your answer. Give the whole program in one ```python fenced block."
    i = passed.index(False)
    case = tests["cases"][i]
    if tests["kind"] == "call":
        args = ", ".join(repr(a) for a in case["args"])
        want = case.get("expected", (case.get("expected_any") or [None])[0])
        test = f"{tests['fn_name']}({_clip(args)}) should return {_clip(repr(want))}"
    else:
        test = f"for the input {_clip(repr(case['input']))} the output should be {_clip(repr(case['output']))}"
    return (
        f"Your code failed a test: {test}, but it {_clip(why[i]) or 'failed'}. "
        "Fix it and give the whole program again in one ```python fenced block."
    )


def user_turn(tokenizer, text: str, *, ended_on_eos: bool, prefix: str = "") -> str:
    """The text that closes the assistant's turn (unless its end-of-sequence token already did), opens a
    user turn with ``text`` and the assistant's next one (then ``prefix``), in the tokenizer's chat
    template; without one, the feedback on lines of its own."""
    if getattr(tokenizer, "chat_template", None):
        marker = "\x00MARK\x00"
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
        both = tokenizer.apply_chat_template(
            [*base, {"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        tail = both[both.index(marker) + len(marker) :]
        eos = tokenizer.eos_token or ""
        if ended_on_eos and eos and tail.startswith(eos):
            tail = tail[len(eos) :]
        return tail + prefix
    return f"\n\nFeedback: {text}\n\n" + prefix


def generate_with_feedback(
    engine,
    input_ids: Tensor,
    attention_mask: Tensor,
    samples_per_prompt: int,
    episodes: list[dict | None],
    *,
    greedy: bool = False,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    seeds: list[int] | None = None,
) -> tuple:
    """``samples_per_prompt`` episodes per prompt (module docstring); ``episodes[p]`` is prompt p's tests
    (None: that prompt's rows are single-turn). Returns the batch and each row's turns."""
    from rlvr.rewards.code import SANDBOX_ENV, extract_code
    from rlvr.sandbox import Limits, run_tests

    tok = engine.tokenizer
    budget = engine.sampling.max_new_tokens if max_new_tokens is None else max_new_tokens
    G, P = samples_per_prompt, input_ids.shape[0]
    B = P * G
    seeded = seeds is not None and not greedy
    eos = set(engine.eos_ids)
    rows = [_Row([]) for _ in range(B)]
    turns = [1] * B
    turn_text = [""] * B
    stats = {"rows": B, "decode_steps": 0, "row_steps": 0}
    kw = dict(greedy=greedy, temperature=temperature)
    isolation = os.environ.get(SANDBOX_ENV, "bwrap")
    prompts = [input_ids[p][attention_mask[p].bool()] for p in range(P)]
    prefix = getattr(engine, "turn_prefix", "")

    def absorb(seg, which: list[int]) -> list[int]:
        """Appends each row's turn (cut at its own budget); returns the rows whose turn ended."""
        for k in ("decode_steps", "row_steps"):
            stats[k] += engine.last_stats[k]
        lengths = seg.response_lengths.tolist()
        ended = []
        for i, r in enumerate(which):
            row = rows[r]
            piece, cut = take_turn(row, seg, i, lengths[i], budget, tok)
            turn_text[r] = piece.text
            if cut or bool(seg.truncated[i]) or row.used >= budget:
                row.truncated = True
            else:
                ended.append(r)
        return ended

    seg = engine.generate_ids(input_ids, attention_mask, G, max_new_tokens=budget, seeds=seeds, stop=engine.stop, **kw)
    ended = absorb(seg, list(range(B)))
    while ended:
        going = []
        for r in ended:
            tests = episodes[r // G]
            if not tests or not tests.get("cases") or turns[r] >= engine.max_turns:
                continue
            code = extract_code(turn_text[r])
            outcome = None
            if code is not None:
                outcome = run_tests(
                    code, tests["kind"], tests["cases"], fn_name=tests.get("fn_name", ""),
                    setup=tests.get("setup", ""), limits=Limits(), stop_on_fail=True, isolation=isolation,
                )  # fmt: skip
                if all(outcome.passed):
                    continue
            row = rows[r]
            last = row.pieces[-1].tokens
            on_eos = last.numel() > 0 and int(last[-1]) in eos
            text = user_turn(
                tok,
                feedback_text(tests, outcome.passed if outcome else [], outcome.why if outcome else [], code),
                ended_on_eos=on_eos,
                prefix=prefix,
            )
            ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[0].to(input_ids.device)
            room = budget - row.used
            if ids.shape[0] >= room:  # no room for another attempt: the episode ends inside the feedback
                ids = ids[:room]
                text = tok.decode(ids, skip_special_tokens=False)
                row.truncated = True
            row.pieces.append(_Piece(ids, False, text))
            row.used += ids.shape[0]
            row.calls += 1
            if not row.truncated:
                turns[r] += 1
                going.append(r)
        ended = []
        if going:
            ids, mask = _left_pad(
                [torch.cat([prompts[r // G], *(p.tokens for p in rows[r].pieces)]) for r in going], tok.pad_token_id
            )
            row_seeds = [sample_seed(seeds[r], turns[r] - 1) for r in going] if seeded else None
            room = max(budget - rows[r].used for r in going)
            seg = engine.generate_ids(ids, mask, 1, max_new_tokens=room, seeds=row_seeds, stop=engine.stop, **kw)
            ended = absorb(seg, going)
    batch = _assemble(rows, input_ids, attention_mask, G, tok.pad_token_id, record=engine.logprobs and not greedy)
    batch.tool_calls = batch.tool_errors = None  # feedback turns are not tool calls
    engine.last_stats = {**stats, "tokens": int(batch.response_mask.sum())}
    return batch, turns
