"""Multi-turn rollouts: each sampled sequence is an episode of an :class:`~rlvr.environments.Environment`
(the tool loop, code with execution feedback, a plugin). Generation pauses where a turn ends, the
environment answers, its answer's tokens are appended, and generation goes on.

How (:func:`run_episodes`, which :meth:`HFRolloutEngine.generate <rlvr.rollout.hf.HFRolloutEngine.generate>`
runs when the engine has an environment): a loop of *segments* around the engine's own
:meth:`~rlvr.rollout.hf.HFRolloutEngine.generate_ids`, so every decoder (the dynamic decode, the lean
CPU decode, the static decode) and every process that holds an engine (Ray workers included) runs it
unchanged:

1. Generate with each episode's stop strings (:meth:`Environment.stop`: a tool call's closing text)
   besides the run's. Rows with different stop strings generate in separate segments.
2. Hand every finished turn to its environment (:func:`~rlvr.environments.step_all`: each class's
   episodes at once, e.g. the tool calls as one batch in the scoring pool, the code runs side by side
   in the sandbox). A turn cut by the budget, or ending where the budget is spent, ends its episode
   (truncated if it ended on one of the environment's stop strings: a call with no room for its result).
3. Append each observation: text (a tool result) inside the assistant's turn, tokenized on its own;
   messages (a failing test's report) as new turns in the chat template, closing the assistant's turn
   and opening the next with ``data.assistant_prefix``. Observation tokens are attended to, masked out of
   the loss, KL and entropy, and have log-prob 0 (:class:`~rlvr.rollout.base.RolloutBatch`).
4. Continue those rows from their token ids (nothing generated is ever re-tokenized), each
   prefilled again, up to the environment's ``max_turns`` turns.

One budget, ``max_new_tokens``, counts the model's and the observations' tokens together: a segment
runs to the largest of its rows' budgets and each row is cut at its own (the same tokens as a per-row
limit: a row's draws depend on its own seed and position alone); an observation that does not fit is
cut and ends the row as truncated.

Determinism: segment 0 draws with the row's seed, as a single-turn rollout does (identical tokens when
the environment ends the episode at once); the k-th continuation with ``sample_seed(row seed, k)``. So an
episode is a function of its seed, the weights and the environment's answers, whatever batch it shares
and whichever decoder runs it, and a resumed run samples what the first one sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlvr.environments import Environment, Turn, step_all
from rlvr.rollout.base import RolloutBatch
from rlvr.rollout.sampling import sample_seed

LEAD_TOKENS = 32
"""Prompt tokens decoded with an episode's first turn (:attr:`Turn.lead <rlvr.environments.Turn.lead>`)."""


@dataclass
class _Piece:
    """A run of one row's response: the model's tokens, or an observation's."""

    tokens: Tensor  # [n] long
    model: bool
    text: str
    logprobs: Tensor | None = None  # [n] float32, the model's pieces with TIS


@dataclass
class _Row:
    pieces: list[_Piece] = field(default_factory=list)
    used: int = 0  # response tokens so far, the model's and the observations'
    turns: int = 0  # model turns so far
    truncated: bool = False
    reward: float | None = None  # the environment's last reward


def take_turn(row: _Row, seg: RolloutBatch, i: int, n: int, budget: int, tok) -> tuple[_Piece, bool]:
    """Appends row ``i`` of segment ``seg`` (``n`` new tokens) to ``row``, cut at what its own budget
    has left, as a per-row limit would have cut it; returns the piece and whether it was cut (the row
    is then truncated and its budget spent)."""
    room = budget - row.used
    tokens = seg.response_ids[i, : min(n, room)]
    logp = None if seg.logprobs is None else seg.logprobs[i, : tokens.shape[0]]
    cut = n > room
    piece = _Piece(tokens, True, tok.decode(tokens, skip_special_tokens=True) if cut else seg.texts[i], logp)
    row.pieces.append(piece)
    row.turns += 1
    if cut:
        row.used, row.truncated = budget, True
    else:
        row.used += n
    return piece, cut


def chat_turns(
    tokenizer, messages: list[dict], *, ended_on_eos: bool = False, prefix: str = "", opening: bool = False
) -> str:
    """The text that closes the assistant's turn (unless its end-of-sequence token already did), holds
    ``messages`` and opens the assistant's next turn (then ``prefix``), in the tokenizer's chat template;
    without one, the messages on lines of their own. ``opening``: the messages begin the conversation
    (an environment's first messages): the whole prompt."""
    if opening:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prefix
        return "\n\n".join(str(m.get("content", "")) for m in messages) + "\n\n" + prefix
    if getattr(tokenizer, "chat_template", None):
        marker = "\x00MARK\x00"
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
        both = tokenizer.apply_chat_template([*base, *messages], tokenize=False, add_generation_prompt=True)
        tail = both[both.index(marker) + len(marker) :]
        eos = tokenizer.eos_token or ""
        if ended_on_eos and eos and tail.startswith(eos):
            tail = tail[len(eos) :]
        return tail + prefix
    said = "".join(f"\n\n{m.get('role', 'user').capitalize()}: {m.get('content', '')}" for m in messages)
    return said + "\n\n" + prefix


def run_episodes(
    engine,
    input_ids: Tensor,
    attention_mask: Tensor,
    samples_per_prompt: int,
    envs: list[Environment],
    *,
    greedy: bool = False,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    seeds: list[int] | None = None,
) -> RolloutBatch:
    """``samples_per_prompt`` episodes per prompt (module docstring), ``envs[r]`` sequence r's environment,
    already reset. Returns the batch, with each row's model ``turns``, ``env_rewards`` where an
    environment gave one, and ``tool_calls`` / ``tool_errors`` where the environments count them.

    Args:
        engine: an :class:`~rlvr.rollout.hf.HFRolloutEngine`.
        input_ids, attention_mask: [P, L] left-padded prompts on the engine's device.
        The rest: as :meth:`~rlvr.rollout.hf.HFRolloutEngine.generate`.
    """
    tok = engine.tokenizer
    budget = engine.sampling.max_new_tokens if max_new_tokens is None else max_new_tokens
    G, P = samples_per_prompt, input_ids.shape[0]
    B = P * G
    if len(envs) != B:
        raise ValueError(f"{len(envs)} environments for {P} prompts x {G} samples")
    seeded = seeds is not None and not greedy
    eos = set(engine.eos_ids)
    base_stop = list(engine.stop)
    rows = [_Row() for _ in range(B)]
    stats = {"rows": B, "decode_steps": 0, "row_steps": 0}
    kw = dict(greedy=greedy, temperature=temperature)
    prompts = [input_ids[p][attention_mask[p].bool()] for p in range(P)]  # unpadded
    prefix = getattr(engine, "turn_prefix", "")
    on_stop = [False] * B  # the row's last turn ended on one of its environment's stop strings

    def stops(r: int) -> list[str]:
        return base_stop + [s for s in envs[r].stop() if s not in base_stop]

    def absorb(seg: RolloutBatch, which: list[int]) -> list[tuple[int, Turn]]:
        """Appends each row's turn (cut at its own budget); returns the turns for the environments."""
        for k in ("decode_steps", "row_steps"):
            stats[k] += engine.last_stats[k]
        lengths = seg.response_lengths.tolist()
        finished = []
        for i, r in enumerate(which):
            row = rows[r]
            piece, cut = take_turn(row, seg, i, lengths[i], budget, tok)
            if cut or bool(seg.truncated[i]):
                row.truncated = True
                continue
            on_eos = piece.tokens.numel() > 0 and int(piece.tokens[-1]) in eos
            lead = ""
            if row.turns == 1:
                lead = tok.decode(torch.cat([prompts[r // G][-LEAD_TOKENS:], piece.tokens]), skip_special_tokens=True)
            on_stop[r] = not on_eos and any(piece.text.endswith(x) for x in envs[r].stop())
            finished.append((r, Turn(piece.text, row.turns - 1, on_eos, lead, budget - row.used)))
        return finished

    def generate(which: list[int], first: bool) -> list[tuple[int, Turn]]:
        """One segment for each set of rows that share stop strings."""
        groups: dict[tuple, list[int]] = {}
        for r in which:
            groups.setdefault(tuple(stops(r)), []).append(r)
        out = []
        if first and len(groups) == 1:  # the usual first segment: each prompt once, G samples of it
            seg = engine.generate_ids(
                input_ids, attention_mask, G, max_new_tokens=budget, seeds=seeds, stop=list(next(iter(groups))), **kw
            )
            return absorb(seg, list(range(B)))
        for stop, rs in groups.items():
            ids, mask = _left_pad(
                [torch.cat([prompts[r // G], *(p.tokens for p in rows[r].pieces)]) for r in rs], tok.pad_token_id
            )
            if seeded:
                row_seeds = [seeds[r] if first else sample_seed(seeds[r], rows[r].turns) for r in rs]
            else:
                row_seeds = None
            room = max(budget - rows[r].used for r in rs)
            seg = engine.generate_ids(ids, mask, 1, max_new_tokens=room, seeds=row_seeds, stop=list(stop), **kw)
            out += absorb(seg, rs)
        return out

    pending = generate(list(range(B)), True)
    while pending:
        going = []
        for (r, turn), answer in zip(pending, step_all([(envs[r], turn) for r, turn in pending])):
            row = rows[r]
            if answer.reward is not None:
                row.reward = float(answer.reward)
            if answer.done or row.turns >= envs[r].max_turns:
                # a turn that spent the budget on a stop string of the environment's (a call) is cut there
                row.truncated = turn.room <= 0 and on_stop[r]
                continue
            if turn.room <= 0:  # an answer with no room for it: the episode is cut here
                row.truncated = True
                continue
            if isinstance(answer.observation, str):
                text, special = answer.observation, False
            else:
                text, special = chat_turns(tok, answer.observation, ended_on_eos=turn.ended_on_eos, prefix=prefix), True
            ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[0].to(input_ids.device)
            if ids.shape[0] >= turn.room:  # the observation fills what is left: the episode ends inside it
                ids = ids[: turn.room]
                text = tok.decode(ids, skip_special_tokens=not special)
                row.truncated = True
            row.pieces.append(_Piece(ids, False, text))
            row.used += ids.shape[0]
            if not row.truncated:
                going.append(r)
        pending = generate(going, False) if going else []
    batch = _assemble(rows, input_ids, attention_mask, G, tok.pad_token_id, record=engine.logprobs and not greedy)
    infos = [getattr(env, "info", dict)() for env in envs]
    if all("tool_calls" in i for i in infos):
        batch.tool_calls = [i["tool_calls"] for i in infos]
        batch.tool_errors = [i.get("tool_errors", 0) for i in infos]
    if any(row.reward is not None for row in rows):
        batch.env_rewards = [row.reward for row in rows]
    batch.turns = [row.turns for row in rows]
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
    )
