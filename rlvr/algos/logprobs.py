"""Per-token log-probabilities and entropies from logits, without a second [B, T, V] copy."""

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Log-probability of each given token under softmax(logits / temperature).

    Math: log p(y_t) = z_t[y_t] − logsumexp_v z_t[v] with z = logits / temperature
    (the log-softmax identity; same trick as TRL ``selective_log_softmax``).

    Must equal the naive
    ``torch.log_softmax(logits.float() / temperature, -1).gather(-1, tokens[..., None])[..., 0]``
    (tests check values and gradients against it). Computed by :func:`token_logprobs_entropy`,
    one sequence at a time in float32, with a hand-written backward: only the logits and a [B, T]
    logsumexp are kept for backward, and the gradient (onehot(y) − softmax(z)) / temperature is
    written straight into the logits' gradient, where autograd over the naive form keeps a scaled
    float32 copy of the logits and runs six passes over [T, V] per row (the vocabulary passes were
    a third of an update on the 49k-vocabulary built-in model). Temperature must match the one
    used for sampling, or the ratios and KL are computed against the wrong policy.

    Conventions: computed and returned in float32 whatever the logits dtype;
    temperature must be > 0 (no clamp).

    Args:
        logits: [B, T, V] already aligned so that ``logits[:, t]`` predicts
            ``tokens[:, t]`` (the caller does the causal shift).
        tokens: [B, T] int64 token ids.
        temperature: sampling temperature the logits are divided by.

    Returns:
        [B, T] float32 log p(token); differentiable w.r.t. ``logits``.
    """
    return token_logprobs_entropy(logits, tokens, temperature=temperature, entropy=False)[0]


def token_logprobs_entropy(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0, entropy: bool = True):
    """(log p(token) [B, T], entropy [B, T] or None) from one pass over the logits.

    The log-probs are :func:`token_logprobs`'s (differentiable w.r.t. ``logits``); the entropy,
    H_t = logsumexp(z_t) − Σ_v p_v z_t[v], reuses the pass's exp(z − max) and is returned
    detached: a metric. For an entropy bonus in the loss use :func:`entropy_from_logits`.
    """
    return _SampledLogProbs.apply(logits, tokens, float(temperature), bool(entropy))


class _SampledLogProbs(torch.autograd.Function):
    """Forward: per row, w = exp(z − max), lse = max + log Σw, logp = z[y] − lse, H = lse − Σ w·z / Σw.
    Backward: d logp_t / d logits_t = (onehot(y_t) − exp(z_t − lse_t)) / temperature."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float, entropy: bool):
        B, T, _ = logits.shape
        logp = logits.new_empty(B, T, dtype=torch.float32)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if entropy else None
        for b in range(B):
            z = _scaled(logits[b], temperature)  # [T, V] float32
            top = z.amax(-1, keepdim=True)
            w = torch.exp(z - top)  # [T, V]
            total = w.sum(-1)
            lse[b] = top[:, 0] + total.log()
            logp[b] = z.gather(-1, tokens[b, :, None])[:, 0] - lse[b]
            if entropy:
                ent[b] = lse[b] - w.mul_(z).sum(-1) / total
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(*(() if ent is None else (ent,)))
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_ent):
        logits, tokens, lse = ctx.saved_tensors
        tau = ctx.temperature
        grad = torch.empty_like(logits)
        in_place = logits.dtype == torch.float32
        for b in range(logits.shape[0]):
            g = grad_logp[b, :, None] / tau  # [T, 1]
            p = grad[b] if in_place else None
            p = torch.sub(_scaled(logits[b], tau), lse[b, :, None], out=p)
            p.exp_().mul_(-g).scatter_add_(-1, tokens[b, :, None], g)  # g·(onehot − softmax)
            if not in_place:
                grad[b] = p
        return grad, None, None, None


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature in float32 (no copy for float32 logits at temperature 1)."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Entropy of the next-token distribution softmax(logits / temperature).

    Math: H_t = −Σ_v p_v log p_v with log p = log_softmax(z), z = logits / temperature
    (Shannon entropy; logged as ``train/entropy``, e.g. DAPO §3.1).

    Must equal the naive ``-(p * logp).sum(-1)`` on the full [B, T, V] tensor;
    computed one sequence at a time in float32 like ``token_logprobs`` (only one [T, V]
    float32 copy alive besides the caller's logits). Logits
    must be finite (a −inf logit gives 0·−inf = NaN).

    Args:
        logits: [B, T, V] logits.
        temperature: sampling temperature the logits are divided by (> 0).

    Returns:
        [B, T] float32 entropy in nats.
    """
    rows = []
    for row_logits in logits:
        logp = torch.log_softmax(row_logits.float() / temperature, dim=-1)  # [T, V]
        rows.append(-(logp.exp() * logp).sum(-1))
    return torch.stack(rows)  # [B, T]


HEAD_CHUNK_TOKENS = 1024
"""Tokens per tile of :func:`lm_head_logprobs`. With :data:`HEAD_CHUNK_VOCAB` a tile's float32
logits are 1024 × 16384 × 4 B = 64 MiB whatever the vocabulary (a 151,936-word vocabulary takes 10
tiles per 1024 tokens): small next to the [N, V] logits it replaces (2.5 GB in float32 for 8 × 512
tokens of Qwen2.5), and a product of at least 1024 × hidden × 16384 per tile, large enough that the
LM head's matmuls are not bound by re-reading its weight (it is read once per 1024 tokens)."""

HEAD_CHUNK_VOCAB = 16384
"""Vocabulary entries per tile of :func:`lm_head_logprobs` (see :data:`HEAD_CHUNK_TOKENS`)."""

HEAD_KEEP_LOGITS_BYTES = 256 * 2**20
"""Below this many bytes of kept [N, V] logits, :func:`lm_head_logprobs` keeps its tiles for the
backward instead of recomputing them: float32 logits, or, where the product runs in bf16/fp16, that
product itself (half the bytes; the float32 tile is rebuilt from it exactly). The recompute is one
more [N, H] × [H, V] product, which on a CPU costs more than the little memory it saves there (the
quickstart's micro-batch of 8 × 48 tokens of a 49,152-word vocabulary: 75 MB in float32;
``benchmarks/NOTES.md``). 256 MiB keeps the memory of a pass bounded by it plus one tile's
temporaries, far below the full path's logits, their copy and their gradient at the sizes where
memory matters."""


def lm_head_logprobs(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    entropy: bool = False,
    chunk_tokens: int | None = None,
    chunk_vocab: int | None = None,
    accumulate_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(log p(token) [N], entropy [N] or None) of the LM head ``hidden @ weight.T + bias``, tile by tile.

    Math: z = (h Wᵀ + b) / temperature; log p(y) = z[y] − logsumexp_v z[v];
    H = logsumexp(z) − Σ_v p_v z[v] (as :func:`token_logprobs_entropy`), with the log-sum-exp
    accumulated online over vocabulary tiles (running max m, Σ exp(z − m) rescaled by
    exp(m_old − m_new); Milakov & Gimelshein 2018, "Online normalizer calculation for softmax").

    Must equal ``token_logprobs_entropy(F.linear(hidden, weight, bias), tokens)`` (the [N, V]
    logits in full, then one pass over them) to float32 rounding, in values and in gradients
    w.r.t. ``hidden``, ``weight`` and ``bias`` (tests check all three, and the entropy's gradient).
    The logits exist only as [chunk_tokens, chunk_vocab] tiles: nothing of size [N, V] is kept for
    backward, which recomputes each tile from ``hidden`` and ``weight`` and turns it into the logits'
    gradient g·(onehot(y) − p)/T − g_H·p·(log p + H)/T in place (one more matmul per tile than a
    plain LM head, in exchange for the [N, V] logits, their float32 copy and their gradient; the
    same trade TRL's ``trl/kernels/chunked_logprob.py`` makes). Where the float32 logits would
    take at most :data:`HEAD_KEEP_LOGITS_BYTES`, the tiles are kept for the backward instead (the
    same values: a recomputed tile equals the kept one bit for bit). The ``hidden @ weight.T`` product
    runs in the autocast dtype when autocast is on (as ``nn.Linear`` would), otherwise in
    ``weight``'s dtype; the log-sum-exp, the entropy and the gradients' sums run in float32.

    Conventions: temperature > 0 (no clamp); returned in float32; the entropy is differentiable
    (an entropy bonus in the loss gets its gradient; a metric should be detached by the caller).

    Args:
        hidden: [N, H] final hidden states of the N positions that predict ``tokens``.
        weight: [V, H] LM-head weight (the embedding matrix when tied).
        tokens: [N] int64 token ids.
        bias: [V] LM-head bias or None.
        temperature: sampling temperature the logits are divided by.
        entropy: also return the entropy of each position's distribution.
        chunk_tokens, chunk_vocab: the tile shape; None: :data:`HEAD_CHUNK_TOKENS` × :data:`HEAD_CHUNK_VOCAB`.
        accumulate_grad: the backward adds the weight's gradient straight into ``weight.grad`` (a float32
            leaf; the tiles' products write it directly, allocating it when it is None) and returns none
            to autograd, as Megatron-LM's gradient-accumulation fusion does for its weight gradients. It
            saves the [V, H] temporary every micro-batch would otherwise allocate, fill and add into
            ``.grad`` (on a CPU, fresh pages of that size fault in slowly). Only for a plain
            ``loss.backward()``: hooks on the weight do not see this gradient, and
            ``torch.autograd.grad`` does not return it (:func:`rlvr.models.forward.pass_logprobs` turns
            it on only where neither can happen).

    Returns:
        ([N] float32 log-probs, [N] float32 entropies or None).
    """
    chunk_tokens = HEAD_CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    chunk_vocab = HEAD_CHUNK_VOCAB if chunk_vocab is None else chunk_vocab
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    kept_bytes = 2 if _compute_dtype(weight) in LOW_DTYPES else 4  # a kept tile's element
    keep = grad and hidden.shape[0] * weight.shape[0] * kept_bytes <= HEAD_KEEP_LOGITS_BYTES
    direct = accumulate_grad and grad and weight.requires_grad and weight.is_leaf and weight.dtype == torch.float32
    logp, ent = _ChunkedHeadLogProbs.apply(
        hidden,
        weight,
        bias,
        tokens,
        float(temperature),
        bool(entropy),
        int(chunk_tokens),
        int(chunk_vocab),
        keep,
        weight if direct else None,
    )
    return logp, ent


LOW_DTYPES = (torch.bfloat16, torch.float16)
"""Product dtypes whose logit tiles are kept as the product (:data:`HEAD_KEEP_LOGITS_BYTES`)."""


def _compute_dtype(weight: Tensor) -> torch.dtype:
    """The matmul dtype ``nn.Linear`` would use here: autocast's when it is on, else the weight's."""
    device = weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


class _Tiles:
    """The tile buffers of one call, allocated once and reused by every tile (a fresh 64 MiB tensor
    per tile costs page faults on every tile); ``tile(name, n, v)`` is a contiguous [n, v] view."""

    def __init__(self, names: dict[str, torch.dtype], rows: int, cols: int, device) -> None:
        self.bufs = {k: torch.empty(rows * cols, dtype=d, device=device) for k, d in names.items()}

    def tile(self, name: str, n: int, v: int) -> Tensor:
        return self.bufs[name][: n * v].view(n, v)


def _tile_logits(tiles: _Tiles, h: Tensor, w: Tensor, b: Tensor | None, temperature: float) -> Tensor:
    """z = (h wᵀ + b) / temperature of one [n, Vt] tile into the float32 buffer ``z``; the product
    runs in h's dtype (the buffer ``low`` holds it when that is not float32), as ``F.linear`` would."""
    n, v = h.shape[0], w.shape[0]
    z = tiles.tile("z", n, v)
    out = z if h.dtype == torch.float32 else tiles.tile("low", n, v)
    if b is None:
        torch.mm(h, w.t(), out=out)
    else:
        torch.addmm(b, h, w.t(), out=out)
    if out is not z:
        z.copy_(out)
    return z if temperature == 1.0 else z.div_(temperature)


class _ChunkedHeadLogProbs(torch.autograd.Function):
    """See :func:`lm_head_logprobs`. Saved for backward: ``hidden``, ``weight``, ``bias`` (the
    caller's tensors, no copies), the tokens, two float32 [N] vectors (log-sum-exp, entropy) and,
    below :data:`HEAD_KEEP_LOGITS_BYTES` each, the logit tiles (float32, or their bf16/fp16 product)
    and the weight's autocast-dtype copy."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, entropy, chunk_tokens, chunk_vocab, keep, direct):
        ctx.set_materialize_grads(False)  # an entropy logged as a metric brings no gradient: skip its term
        ctx.direct = direct  # the weight whose .grad the backward adds into, or None
        N, V = hidden.shape[0], weight.shape[0]
        dtype = _compute_dtype(weight)
        lse = torch.empty(N, dtype=torch.float32, device=hidden.device)
        target = torch.zeros(N, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(N, dtype=torch.float32, device=hidden.device) if entropy else None
        names = {"z": torch.float32, "e": torch.float32, **({"low": dtype} if dtype != torch.float32 else {})}
        tiles = _Tiles(names, min(N, chunk_tokens), min(V, chunk_vocab), hidden.device)
        kept = []  # the float32 tiles, in loop order, when kept for the backward
        with torch.autocast(hidden.device.type, enabled=False):  # the casts are explicit
            w_all, b_all = weight.to(dtype), None if bias is None else bias.to(dtype)
            for t0 in range(0, N, chunk_tokens):
                h, y = hidden[t0 : t0 + chunk_tokens].to(dtype), tokens[t0 : t0 + chunk_tokens]
                n = h.shape[0]
                top = torch.full((n,), float("-inf"), dtype=torch.float32, device=hidden.device)  # running max of z
                total = torch.zeros(n, dtype=torch.float32, device=hidden.device)  # running Σ exp(z − top)
                weighted = (
                    torch.zeros(n, dtype=torch.float32, device=hidden.device) if entropy else None
                )  # running Σ exp(z − top)·z
                for v0 in range(0, V, chunk_vocab):
                    b = None if b_all is None else b_all[v0 : v0 + chunk_vocab]
                    z = _tile_logits(tiles, h, w_all[v0 : v0 + chunk_vocab], b, temperature)  # [n, Vt] float32
                    if keep:  # the low-precision product it came from, where there is one
                        kept.append((tiles.tile("low", *z.shape) if dtype in LOW_DTYPES else z).clone())
                    local = y - v0
                    inside = (local >= 0) & (local < z.shape[1])
                    picked = z.gather(1, local.clamp(0, z.shape[1] - 1)[:, None])[:, 0]
                    target[t0 : t0 + n] = torch.where(inside, picked, target[t0 : t0 + n])
                    new_top = torch.maximum(top, z.amax(1))
                    rescale = torch.exp(top - new_top)  # 0 at the first tile (top = −inf)
                    e = torch.sub(z, new_top[:, None], out=tiles.tile("e", *z.shape)).exp_()
                    total = total * rescale + e.sum(1)
                    if entropy:
                        weighted = weighted * rescale + e.mul_(z).sum(1)
                    top = new_top
                lse[t0 : t0 + n] = top + total.log()
                if entropy:
                    ent[t0 : t0 + n] = lse[t0 : t0 + n] - weighted / total
        logp = target - lse
        # the weight's low-precision copy too when small (as an autocast linear saves its cast weight),
        # so the backward does not cast it again
        small = w_all.nbytes <= HEAD_KEEP_LOGITS_BYTES
        low = w_all if w_all is not weight and small and any(ctx.needs_input_grad[:3]) else None
        ctx.save_for_backward(hidden, weight, bias, tokens, lse, ent, low, *kept)
        ctx.config = (temperature, chunk_tokens, chunk_vocab, dtype)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        hidden, weight, bias, tokens, lse, ent, low, *kept = ctx.saved_tensors
        temperature, chunk_tokens, chunk_vocab, dtype = ctx.config
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_logp is None and grad_ent is None:
            return (None,) * 10
        N, V = hidden.shape[0], weight.shape[0]
        # each tile's product writes its block the first time (no zero fill of the [V, H] gradient)
        grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        direct, fresh = ctx.direct if need_w else None, True  # fresh: grad_w's first products write it
        have = None if direct is None else direct.grad
        if have is not None and not (have.dtype == torch.float32 and have.layout == torch.strided):
            direct = have = None  # an unusual .grad: the gradient goes back through autograd
        if have is not None and have.is_contiguous():
            grad_w, fresh = have, False
        elif need_w:
            grad_w = torch.empty(weight.shape, dtype=torch.float32, device=hidden.device)
        else:
            grad_w = None
        grad_b = torch.zeros(V, dtype=torch.float32, device=hidden.device) if need_b else None
        # 1/temperature folded into the upstream gradients: dz/dlogits = 1/T
        g_logp = None if grad_logp is None else grad_logp.float() / temperature
        g_ent = None if grad_ent is None else grad_ent.float() / temperature
        names = {"z": torch.float32, "g": torch.float32, **({"low": dtype} if dtype != torch.float32 else {})}
        tiles = _Tiles(names, min(N, chunk_tokens), min(V, chunk_vocab), hidden.device)
        kept = iter(kept)
        with torch.autocast(hidden.device.type, enabled=False):
            w_all = weight.to(dtype) if low is None else low
            b_all = None if bias is None else bias.to(dtype)
            for t0 in range(0, N, chunk_tokens):
                h, y = hidden[t0 : t0 + chunk_tokens].to(dtype), tokens[t0 : t0 + chunk_tokens]
                rows = slice(t0, t0 + h.shape[0])
                for v0 in range(0, V, chunk_vocab):
                    w = w_all[v0 : v0 + chunk_vocab]
                    b = None if b_all is None else b_all[v0 : v0 + chunk_vocab]
                    z = next(kept, None)
                    if z is None:  # recompute the tile
                        log_p = _tile_logits(tiles, h, w, b, temperature).sub_(lse[rows, None])  # [n, Vt] log p
                    elif z.dtype == torch.float32 or temperature == 1.0:  # out of place: the kept tile stays
                        log_p = torch.sub(z, lse[rows, None], out=tiles.tile("z", *z.shape))  # intact (retain_graph)
                    else:  # the kept product, as _tile_logits turns it into logits
                        log_p = tiles.tile("z", *z.shape).copy_(z).div_(temperature).sub_(lse[rows, None])
                    grad = torch.exp(log_p, out=tiles.tile("g", *log_p.shape))  # p, then the logits' gradient
                    if g_ent is not None:  # d H / d z = −p·(log p + H)
                        coef = log_p.add_(ent[rows, None]).mul_(-g_ent[rows, None])
                        if g_logp is not None:
                            coef.sub_(g_logp[rows, None])
                        grad.mul_(coef)
                    else:
                        grad.mul_(-g_logp[rows, None])
                    if g_logp is not None:  # + g at the taken token, where it lies in this tile
                        local = y - v0
                        inside = (local >= 0) & (local < grad.shape[1])
                        at = local.clamp(0, grad.shape[1] - 1)[:, None]
                        grad.scatter_add_(1, at, (g_logp[rows] * inside)[:, None])
                    if need_b:
                        grad_b[v0 : v0 + chunk_vocab] += grad.sum(0)
                    if dtype != torch.float32:
                        grad = tiles.tile("low", *grad.shape).copy_(grad)
                    if need_h:
                        _add_product(grad_h[rows], grad, w, first=v0 == 0)
                    if need_w:
                        _add_product(grad_w[v0 : v0 + chunk_vocab], grad.t(), h, first=fresh and t0 == 0)
        if direct is not None and grad_w is not None:
            if fresh and have is None:
                direct.grad = grad_w
            elif fresh:  # a non-contiguous .grad: added once at the end
                have += grad_w
            grad_w = None  # in the weight's .grad already
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            *(None,) * 7,
        )


def _add_product(out: Tensor, a: Tensor, b: Tensor, *, first: bool) -> None:
    """out += a @ b in place, or out = a @ b for the ``first`` product into ``out`` (one ``mm`` /
    ``addmm_`` when the dtypes agree; a low-precision product is copied or summed into the float32
    ``out``)."""
    if out.dtype == a.dtype:
        torch.mm(a, b, out=out) if first else out.addmm_(a, b)
    elif first:
        out.copy_(a @ b)
    else:
        out += a @ b
