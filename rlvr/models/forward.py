"""The one forward pass the trainer runs on sampled sequences."""

from __future__ import annotations

from torch import Tensor


def response_logits(model, input_ids: Tensor, attention_mask: Tensor, num_response_tokens: int) -> Tensor:
    """Logits that predict the last ``num_response_tokens`` tokens of each row.

    Position ids come from the attention mask, as in ``generate`` with left padding, so the
    log-probs match the distribution the tokens were sampled from. Only the response positions
    go through the LM head (``logits_to_keep``), which saves the vocab projection of the prompt.

    Args:
        input_ids: [B, L] left-padded prompt + response.
        attention_mask: [B, L].
        num_response_tokens: T.

    Returns:
        [B, T, V] logits; ``[:, t]`` predicts ``input_ids[:, L - T + t]``.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=num_response_tokens + 1,
        use_cache=False,
    )
    return out.logits[:, :-1]  # [B, T, V] after the causal shift
