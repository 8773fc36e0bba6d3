"""Rollouts with tools: generation pauses at each tool call, the environment appends the result,
and generation goes on, up to ``rollout.max_tool_calls`` calls per response.

How (:func:`generate_with_tools`, which :meth:`HFRolloutEngine.generate
<rlvr.rollout.hf.HFRolloutEngine.generate>` runs when the engine has tools): a loop of *segments*
around the engine's own :meth:`~rlvr.rollout.hf.HFRolloutEngine.generate_ids`, so every decoder
(the dynamic decode, the lean CPU decode, the static decode) and every process that holds an engine
(Ray workers included) runs it unchanged:

1. Generate with the call syntax's closing text (``</tool>``) as one more stop string.
2. Rows that stopped there end with a call: parse it, run all of them as one batch in the scoring
   pool (:class:`~rlvr.tools.Toolbox`: a time limit per call, output capped, errors as results), and
   append each result's tokens (``<result>…</result>``, tokenized on its own).
3. Continue those rows from their token ids (prompt + everything so far; nothing generated is ever
   re-tokenized), each prefilled again. A row that has made ``max_tool_calls`` calls continues
   without the extra stop string: a call past the limit is plain text.

One budget, ``max_new_tokens``, counts the model's and the results' tokens together: a row's
segment may take what its budget has left (a segment runs to the largest of its rows' budgets, and
each row is then cut at its own: the same tokens as a per-row limit, since a row's draws depend on
its own seed and position alone), a result that does not fit is cut and ends the row as truncated.

Determinism: segment 0 draws with the row's seed, as a single-turn rollout does (identical tokens
when no call is made); segment k with ``sample_seed(row seed, k)``. So a row's response is a
function of its seed, the weights and the tools' results, whatever batch it shares and whichever
decoder runs it, and a resumed run samples what the first one sampled.

The batch this returns is one :class:`~rlvr.rollout.base.RolloutBatch`: each response holds the
model's tokens and the results' interleaved; ``response_mask`` is 0 on the results (the loss, KL,
entropy and every statistic skip them), ``attention_mask`` 1 (the model attends to them, as it did
while sampling), the engine's log-probs 0 there; ``texts`` show the calls and the results, and
``tool_calls`` / ``tool_errors`` count them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlvr.rollout.base import RolloutBatch
from rlvr.rollout.sampling import sample_seed

LEAD_TOKENS = 32
"""Prompt tokens searched for a call's opening when the response so far holds none."""


@dataclass
class _Piece:
    """A run of one row's response: the model's tokens, or a tool result's."""

    tokens: Tensor  # [n] long
    model: bool
    text: str
    logprobs: Tensor | None = None  # [n] float32, the model's pieces with TIS


@dataclass
class _Row:
    pieces: list[_Piece]
    used: int = 0  # response tokens so far, the model's and the results'
    calls: int = 0
    errors: int = 0
    truncated: bool = False


def take_turn(row: _Row, seg: RolloutBatch, i: int, n: int, budget: int, tok) -> tuple[_Piece, bool]:
    """Appends row ``i`` of segment ``seg`` (``n`` new tokens) to ``row``, cut at what its own budget
    has left, as a per-row limit would have cut it; returns the piece and whether it was cut (the row
    is then truncated and its budget spent). Shared by the tool loop and the feedback episodes."""
    room = budget - row.used
    tokens = seg.response_ids[i, : min(n, room)]
    logp = None if seg.logprobs is None else seg.logprobs[i, : tokens.shape[0]]
    cut = n > room
    piece = _Piece(tokens, True, tok.decode(tokens, skip_special_tokens=True) if cut else seg.texts[i], logp)
    row.pieces.append(piece)
    if cut:
        row.used, row.truncated = budget, True
    else:
        row.used += n
    return piece, cut


def generate_with_tools(
    engine,
    input_ids: Tensor,
    attention_mask: Tensor,
    samples_per_prompt: int,
    *,
    greedy: bool = False,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    seeds: list[int] | None = None,
) -> RolloutBatch:
    """``samples_per_prompt`` responses per prompt, pausing at each tool call (module docstring).

    Args:
        engine: an :class:`~rlvr.rollout.hf.HFRolloutEngine` with ``tools``.
        input_ids, attention_mask: [P, L] left-padded prompts on the engine's device.
        The rest: as :meth:`~rlvr.rollout.hf.HFRolloutEngine.generate`.
    """
    box, tok = engine.tools, engine.tokenizer
    syntax = box.syntax
    budget = engine.sampling.max_new_tokens if max_new_tokens is None else max_new_tokens
    G = samples_per_prompt
    P, B = input_ids.shape[0], input_ids.shape[0] * samples_per_prompt
    seeded = seeds is not None and not greedy
    plain_stop = list(engine.stop)
    call_stop = plain_stop + ([syntax.close] if syntax.close not in plain_stop else [])
    eos = set(engine.eos_ids)
    rows = [_Row([]) for _ in range(B)]
    stats = {"rows": B, "decode_steps": 0, "row_steps": 0}
    kw = dict(greedy=greedy, temperature=temperature)

    prompts = [input_ids[p][attention_mask[p].bool()] for p in range(P)]  # unpadded

    def first_call(r: int, tokens: Tensor) -> str:
        """The text a row's first call is read from: the prompt's last tokens and the segment's, decoded
        together (a call may open in the prompt: an assistant prefix such as ``<think><tool>calculator:``),
        up to the segment's closing text."""
        text = tok.decode(torch.cat([prompts[r // G][-LEAD_TOKENS:], tokens]), skip_special_tokens=True)
        return text[: text.rfind(syntax.close) + len(syntax.close)]

    def absorb(seg: RolloutBatch, which: list[int], may_call: bool) -> list[tuple[int, tuple | None]]:
        """Appends each row's new tokens (cut at its own budget); returns the rows that end with a call."""
        for k in ("decode_steps", "row_steps"):
            stats[k] += engine.last_stats[k]
        lengths = seg.response_lengths.tolist()
        calls = []
        for i, r in enumerate(which):
            row = rows[r]
            piece, cut = take_turn(row, seg, i, lengths[i], budget, tok)
            if cut:  # past this row's own budget
                continue
            tokens, text = piece.tokens, piece.text
            ended_on_call = (
                may_call and not bool(seg.truncated[i]) and text.endswith(syntax.close) and int(tokens[-1]) not in eos
            )
            if bool(seg.truncated[i]) or (ended_on_call and row.used >= budget):
                row.truncated = True  # no room left for a result: the response is cut here
            elif ended_on_call:  # the call opened in this segment, or (before any call) in the prompt
                calls.append((r, syntax.parse(first_call(r, tokens) if row.calls == 0 else text)))
        return calls

    seg = engine.generate_ids(
        input_ids, attention_mask, G, max_new_tokens=budget, seeds=seeds, stop=call_stop, **kw
    )  # segment 0: a single-turn rollout's tokens until the first call
    pending = absorb(seg, list(range(B)), True)
    while pending:
        results = box.run([call for _, call in pending])
        going = []
        for (r, _), res in zip(pending, results):
            row = rows[r]
            row.calls, row.errors = row.calls + 1, row.errors + res.error
            text = syntax.format_result(res.output)
            ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[0].to(input_ids.device)
            room = budget - row.used
            if ids.shape[0] >= room:  # the result fills what is left: the response ends inside it
                ids = ids[:room]
                text = tok.decode(ids, skip_special_tokens=True)
                row.truncated = True
            row.pieces.append(_Piece(ids, False, text))
            row.used += ids.shape[0]
            if not row.truncated:
                going.append(r)
        pending = []
        can = [r for r in going if rows[r].calls < box.max_calls]
        cannot = [r for r in going if rows[r].calls >= box.max_calls]
        for which, stop, may_call in ((can, call_stop, True), (cannot, plain_stop, False)):
            if not which:
                continue
            ids, mask = _left_pad(
                [torch.cat([prompts[r // G], *(p.tokens for p in rows[r].pieces)]) for r in which],
                tok.pad_token_id,
            )
            row_seeds = [sample_seed(seeds[r], rows[r].calls) for r in which] if seeded else None
            room = max(budget - rows[r].used for r in which)
            seg = engine.generate_ids(ids, mask, 1, max_new_tokens=room, seeds=row_seeds, stop=stop, **kw)
            pending += absorb(seg, which, may_call)
    batch = _assemble(rows, input_ids, attention_mask, G, tok.pad_token_id, record=engine.logprobs and not greedy)
    engine.last_stats = {**stats, "tokens": int(batch.response_mask.sum())}
    return batch


def _left_pad(seqs: list[Tensor], pad_id: int) -> tuple[Tensor, Tensor]:
    """([n, L] ids, [n, L] mask) of 1-D sequences, left-padded to the longest."""
    L = max(s.shape[0] for s in seqs)
    ids = seqs[0].new_full((len(seqs), L), pad_id)
    mask = torch.zeros(len(seqs), L, dtype=torch.long, device=seqs[0].device)
    for i, s in enumerate(seqs):
        ids[i, L - s.shape[0] :] = s
        mask[i, L - s.shape[0] :] = 1
    return ids, mask


def _assemble(
    rows: list[_Row], input_ids: Tensor, attention_mask: Tensor, G: int, pad_id: int, *, record: bool
) -> RolloutBatch:
    """One RolloutBatch of the rows' pieces: the prompts as given, the responses right-padded."""
    B, device = len(rows), input_ids.device
    T = max(1, max(row.used for row in rows))
    response = torch.full((B, T), pad_id, dtype=torch.long, device=device)
    trained = torch.zeros(B, T, dtype=torch.long, device=device)
    attended = torch.zeros(B, T, dtype=torch.long, device=device)
    logprobs = torch.zeros(B, T, device=device) if record else None
    for r, row in enumerate(rows):
        at = 0
        for piece in row.pieces:
            span = slice(at, at + piece.tokens.shape[0])
            response[r, span] = piece.tokens
            attended[r, span] = 1
            if piece.model:
                trained[r, span] = 1
                if logprobs is not None and piece.logprobs is not None:
                    logprobs[r, span] = piece.logprobs
            at = span.stop
    return RolloutBatch(
        input_ids=torch.cat([input_ids.repeat_interleave(G, dim=0), response], dim=1),
        attention_mask=torch.cat([attention_mask.repeat_interleave(G, dim=0), attended], dim=1),
        response_mask=trained,
        prompt_len=input_ids.shape[1],
        texts=["".join(p.text for p in row.pieces) for row in rows],
        truncated=torch.tensor([row.truncated for row in rows], device=device),
        group_size=G,
        logprobs=logprobs,
        tool_calls=[row.calls for row in rows],
        tool_errors=[row.errors for row in rows],
    )
