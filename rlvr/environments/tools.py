"""The tool loop as an environment: a turn that ends with a call's closing text (``</tool>``) gets the
call run in the scoring pool and its result appended inside the assistant's turn (``<result>…</result>``),
up to ``rollout.max_tool_calls`` calls; a turn that ends otherwise ends the episode."""

from __future__ import annotations

from rlvr.environments.base import Environment, Step, Turn


class ToolCalls(Environment):
    """One episode of tool use with a :class:`~rlvr.tools.Toolbox` (shared by every episode)."""

    def __init__(self, box) -> None:
        self.box = box
        self.max_turns = box.max_calls + 1
        self.calls = 0
        self.errors = 0

    def stop(self) -> tuple[str, ...]:
        return (self.box.syntax.close,) if self.calls < self.box.max_calls else ()

    def _call(self, turn: Turn) -> tuple[bool, tuple | None]:
        """(whether the turn ends with a call's closing text, with room and calls left; the call parsed,
        None where malformed: it runs as an error result). The first call is read from the prompt's last
        tokens and the turn together: it may open in the prompt (``<think><tool>calculator:``)."""
        close = self.box.syntax.close
        if turn.ended_on_eos or turn.room <= 0 or self.calls >= self.box.max_calls or not turn.text.endswith(close):
            return False, None
        text = turn.text
        if self.calls == 0 and turn.lead:
            text = turn.lead[: turn.lead.rfind(close) + len(close)]
        return True, self.box.syntax.parse(text)

    def step(self, turn: Turn) -> Step:
        return self.step_all([(self, turn)])[0]

    @classmethod
    def step_all(cls, pairs: list[tuple[Environment, Turn]]) -> list[Step]:
        """Every pending call of the batch as one batch in the scoring pool (time limit per call)."""
        out: list[Step] = [Step(done=True)] * len(pairs)
        calls = [(i, env, *env._call(turn)) for i, (env, turn) in enumerate(pairs)]  # type: ignore[attr-defined]
        calls = [(i, env, call) for i, env, is_call, call in calls if is_call]
        if not calls:
            return out
        results = calls[0][1].box.run([call for _, _, call in calls])
        for (i, env, _), res in zip(calls, results):
            env.calls, env.errors = env.calls + 1, env.errors + res.error
            out[i] = Step(observation=env.box.syntax.format_result(res.output), done=False)
        return out

    def info(self) -> dict:
        return {"tool_calls": self.calls, "tool_errors": self.errors}
