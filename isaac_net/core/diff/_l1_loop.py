r"""The K-slot loop of L1D (tau > 0) as one autograd node with a hand-written backward.

Autograd over ~50 tiny ops per slot spends most of its time in bookkeeping. This node
runs the forward without a graph and keeps only ``served`` at the start of each slot
(``[K, E, R]``, activation checkpointing per slot); its backward walks the slots in
reverse, recomputes each slot's values from that checkpoint (or, with ``keep_tape``,
reads the values the forward kept) and applies the adjoint equations written below.
It is checked against autograd of the same recursion (``model._l1_slot``) in float64 by
the tests.

Per slot ``k`` (``c`` is ``[E, R, A]``, cell quantities ``[E, 1]``, the rest ``[E, R]``):

.. math::
    u = \sum_a w_a (1 - c_a),\ b = \mathrm{smin}(u, 1),\ n = \sum_r b,\
    sh = S / \mathrm{smax}(n, 1),\ q = \log_2(1 + \mathrm{snr} / \mathrm{smax}(sh, 1)),\
    se = \mathrm{smin}(q, se_{max}),\ served \mathrel{+}= \kappa\, sh\, se,\ csum \mathrel{+}= c,\
    c \leftarrow \sigma(\log(served) / \tau - \log(cum) / \tau).
"""

from __future__ import annotations

import math

import torch

from isaac_net.core._kernels import Kernel, compile_in_background, own_storage
from isaac_net.core.diff.relax import _log_pos, _tiny, smax1_vjp, smin1_vjp

LN2 = math.log(2.0)


def _flip_dims(t: torch.Tensor) -> torch.Tensor:
    """``[E, R, A]`` <-> ``[A, R, E]`` and ``[E, R]`` <-> ``[R, E]`` (contiguous): the loop's layout."""
    return t.permute(tuple(range(t.dim()))[::-1]).contiguous()


def _completion(served, log_cum, tau):
    """``c = sigmoid(log(served) / tau - log(cum) / tau)`` ``[A, R, E]`` from ``served`` ``[R, E]``."""
    return torch.sigmoid(_log_pos(served) / tau - log_cum)


TAPE = ("b", "db", "N", "dN", "sh", "H", "dH", "dsv", "se")
TENSORS_PER_SLOT = len(TAPE) + 1  # with the tape: its values and ``served`` before the slot


def _slot(w, c, served, snr_lin, tau, num_subbands, se_max, kappa, deriv: bool = True, gate=None):
    """One slot from ``(c, served)`` before it: the values of ``TAPE`` (derivatives None
    without ``deriv``) and ``served`` after it. A robot counts among the backlogged with weight ``b``,
    or with ``gate`` ``[R, E]`` (the slots of a latency floor) ``gate * b`` (the tape keeps ``b``)."""
    unfinished = (w * (1.0 - c)).sum(0)  # the robot's mass not yet served, [R, E]
    b, db = smin1_vjp(unfinished, tau, deriv=deriv)
    bg = b if gate is None else b * gate
    N, dN = smax1_vjp(bg.sum(0, keepdim=True), tau, deriv=deriv)
    sh = num_subbands / N
    H, dH = smax1_vjp(sh, tau, deriv=deriv)
    q = torch.log2(1.0 + snr_lin / H)
    sv, dsv = smin1_vjp(q / se_max, tau, deriv=deriv)
    se = se_max * sv
    return (b, db, N, dN, sh, H, dH, dsv, se), served + kappa * sh * se


def _slot_forward(w, c, served, csum, snr_lin, log_cum, tau, num_subbands, se_max, kappa, deriv=False,
                  gate=None):
    """One slot forward: ``(served, csum, c)`` after it from the same before it, and the slot's
    ``TAPE`` values (derivatives with ``deriv``). The body of both loops (a
    :class:`~isaac_net.core._kernels.Kernel` in the compiled one, through :func:`_consts_slot_forward`)."""
    values, served = _slot(w, c, served, snr_lin, tau, num_subbands, se_max, kappa, deriv=deriv, gate=gate)
    return (served, csum + c, _completion(served, log_cum, tau)), values


def _forward(w, log_cum, snr_lin, c0, tau, K: int, num_subbands, se_max, kappa, keep_tape: bool = False,
             gate=None, served0=None):
    """The K slots without a graph: ``(served, csum, served_before, tape)``, from ``served0``
    (None: 0) and the completion ``c0``; ``gate`` as in :func:`_slot` (None: 1).

    ``served_before`` ``[K, E, R]`` holds ``served`` at the start of each slot. With
    ``keep_tape`` ``tape`` lists each slot's ``TAPE`` values (~12 ``[E, R]`` per slot) for the
    backward; otherwise it is empty and the backward recomputes them from ``served_before``.
    """
    served = torch.zeros_like(snr_lin) if served0 is None else served0
    csum = torch.zeros_like(c0)
    c = c0
    history, tape = [], []
    for _ in range(K):
        history.append(served)
        (served, csum, c), values = _slot_forward(w, c, served, csum, snr_lin, log_cum, tau, num_subbands,
                                                  se_max, kappa, deriv=keep_tape, gate=gate)
        if keep_tape:
            tape.append(values)
    # One [K, ...] tensor per TAPE value: 9 saved tensors instead of 9 K (each saved tensor costs
    # the autograd node, or a compiled graph's runtime wrapper, a pack and an unpack)
    return served, csum, torch.stack(history), [torch.stack(v) for v in zip(*tape, strict=True)]


def _slot_adjoint_step(w, log_cum, snr_lin, c_prev, c, served_prev, served, served_prev2, c_bar, s_bar,
                       cs_bar, gw, glc, gsnr, tau, num_subbands, se_max, kappa, values=None, gate=None,
                       ggate=None):
    """The adjoint of one slot, a step of the reverse walk: the gradients after the slot
    (``c_bar``, ``s_bar``; ``cs_bar`` is the same in every slot; the sums ``gw``,
    ``glc``, ``gsnr``) to ``(c_bar, s_bar, gw, glc, gsnr)`` before it, and the completion before
    the slot before it (the next step's ``c_prev``, from ``served_prev2``). ``c_prev``,
    ``served_prev``: before the slot; ``c``, ``served``: after it; ``values``: the slot's
    ``TAPE`` values, or None to recompute them. With ``gate``, the sum ``ggate`` of its gradient
    comes last."""
    if values is None:
        values, _ = _slot(w, c_prev, served_prev, snr_lin, tau, num_subbands, se_max, kappa, gate=gate)
    b, db, N, dN, sh, H, dH, dsv, se = values
    # c = sigmoid(log(served) / tau - log_cum)
    z_bar = c_bar * c * (1.0 - c)
    glc = glc - z_bar
    live = served > _tiny(served)
    s_bar = s_bar + torch.where(live, z_bar.sum(0) / (tau * torch.clamp(served, min=_tiny(served))), 0.0)
    # served += kappa sh se
    sh_bar = kappa * (s_bar * se).sum(0, keepdim=True)
    q_bar = s_bar * (kappa * sh) * dsv
    # q = log2(1 + snr / H)
    common = q_bar / (LN2 * (H + snr_lin))
    gsnr = gsnr + common
    sh_bar = sh_bar - (common * snr_lin / H).sum(0, keepdim=True) * dH
    # sh = S / N, N = smax(n, 1), n = sum_r bg, bg = gate b, b = smin(u, 1)
    bg_bar = -sh_bar * sh / N * dN  # n_bar, each robot's
    if gate is not None:
        ggate = ggate + bg_bar * b
        bg_bar = bg_bar * gate
    u_bar = bg_bar * db
    # u = sum_a w_a (1 - c_a) (unfinished mass);  csum += c
    gw = gw + u_bar * (1.0 - c_prev)
    c_bar = cs_bar - u_bar * w
    out = (c_bar, s_bar, gw, glc, gsnr, _completion(served_prev2, log_cum, tau))
    return out if gate is None else (*out, ggate)


def _reverse_walk(step, w, log_cum, snr_lin, c0, served_before, served_K, g_served, g_csum, tau, gate=None):
    """``(gw, glc, gsnr, gc0, gserved0)``, and ``ggate`` with ``gate``: the slots in reverse,
    ``step(k, args)`` the adjoint of slot ``k`` with ``args`` the arguments of
    :func:`_slot_adjoint_step` up to ``tau``, then ``(gate, ggate)`` with a gate (the eager node
    calls it directly, the compiled backward its kernel). ``served_before``: K ``[E, R]`` (a
    ``[K, E, R]`` tensor or a list)."""
    K = len(served_before)
    c_bar, s_bar, gw, glc, gsnr = (torch.zeros_like(c0), g_served, torch.zeros_like(w),
                                   torch.zeros_like(log_cum), torch.zeros_like(snr_lin))
    ggate = None if gate is None else torch.zeros_like(snr_lin)
    c, served = _completion(served_K, log_cum, tau), served_K  # after slot k
    c_prev = c0 if K == 1 else _completion(served_before[K - 1], log_cum, tau)
    for k in range(K - 1, -1, -1):
        # The start of the slot before this one (unused at k = 0: a tensor that is no other argument).
        served_prev2 = served_before[k - 1] if k > 0 else torch.zeros_like(served_K)
        args = (w, log_cum, snr_lin, c_prev, c, served_before[k], served, served_prev2, c_bar, s_bar, g_csum,
                gw, glc, gsnr, tau) + (() if gate is None else (gate, ggate))
        c_bar, s_bar, gw, glc, gsnr, c_next, *rest = step(k, args)
        if gate is not None:
            (ggate,) = rest
        c, served = c_prev, served_before[k]
        c_prev = c0 if k == 1 else c_next
    return (gw, glc, gsnr, c_bar, s_bar) + (() if gate is None else (ggate,))


def _backward(w, log_cum, snr_lin, c0, served_before, served_K, tape, g_served, g_csum, tau, K: int,
              num_subbands, se_max, kappa, gate=None):
    """The eager reverse walk, with each slot's ``TAPE`` values from ``tape`` or recomputed."""
    def step(k, args):
        values = [t[k] for t in tape] if tape else None
        if gate is None:
            return _slot_adjoint_step(*args, num_subbands, se_max, kappa, values=values)
        *args, gate_, ggate = args
        return _slot_adjoint_step(*args, num_subbands, se_max, kappa, values=values, gate=gate_, ggate=ggate)

    return _reverse_walk(step, w, log_cum, snr_lin, c0, served_before, served_K, g_served, g_csum, tau, gate)


class L1SlotLoop(torch.autograd.Function):
    """``(w, log_cum, snr_lin, c0) -> (served, c_sum)`` after K slots; with ``gate``
    ``[E, R]`` a robot counts as backlogged with that weight (the slots of a latency floor),
    ``served0`` ``[E, R]`` is ``served`` before the first slot (None: 0).

    Keeps ``served`` at the start of each slot (``[K, E, R]``) for the backward, which
    recomputes the other per-slot values while it walks the slots in reverse, or with
    ``keep_tape`` keeps those too (about 10x the memory, a third fewer ops in eager). Traceable
    by ``torch.compile`` (the compiled step fuses its forward and backward).
    """

    @staticmethod
    def forward(ctx, w, log_cum, snr_lin, c0, tau, K, num_subbands, se_max, kappa, keep_tape=False, gate=None,
                served0=None):
        consts = (tau, K, num_subbands, se_max, kappa)
        w, log_cum, snr_lin, c0 = (_flip_dims(t) for t in (w, log_cum, snr_lin, c0))
        gate, served0 = (None if t is None else _flip_dims(t) for t in (gate, served0))
        served, csum, served_before, tape = _forward(w, log_cum, snr_lin, c0, *consts, keep_tape, gate,
                                                     served0)
        ctx.save_for_backward(w, log_cum, snr_lin, c0, served_before, served, gate, *tape)
        ctx.consts = consts
        return _flip_dims(served), _flip_dims(csum)

    @staticmethod
    def backward(ctx, g_served, g_csum):
        w, log_cum, snr_lin, c0, served_before, served_K, gate, *tape = ctx.saved_tensors
        g_served = torch.zeros_like(snr_lin) if g_served is None else _flip_dims(g_served)
        g_csum = torch.zeros_like(c0) if g_csum is None else _flip_dims(g_csum)
        gw, glc, gsnr, gc0, gs0, *ggate = _backward(w, log_cum, snr_lin, c0, served_before, served_K, tape,
                                                     g_served, g_csum, *ctx.consts, gate)
        need = ctx.needs_input_grad + (False,) * 2  # the caller may leave gate and served0 out
        grads = (_flip_dims(gw), _flip_dims(glc), _flip_dims(gsnr), _flip_dims(gc0) if need[3] else None,
                 None, None, None, None, None, None, _flip_dims(ggate[0]) if ggate and need[10] else None,
                 _flip_dims(gs0) if need[11] else None)
        return grads[:len(ctx.needs_input_grad)]


# The compiled path: the slot loop as an operator that ``torch.compile`` does not trace into (its
# graph would unroll K slots forward and backward), whose forward and backward loop over the
# slots calling one fused kernel per slot, compiled once for every batch and fleet size.
def _consts_slot_forward(w, c, served, csum, snr_lin, log_cum, tau, consts):
    """:func:`_slot_forward` with its constants as one tensor: ``(served, csum, c)``."""
    return _slot_forward(w, c, served, csum, snr_lin, log_cum, tau, *consts.unbind())[0]


def _consts_slot_forward_gated(w, c, served, csum, snr_lin, log_cum, tau, gate, consts):
    """:func:`_consts_slot_forward` in the slots of a latency floor (``gate``)."""
    return _slot_forward(w, c, served, csum, snr_lin, log_cum, tau, *consts.unbind(), gate=gate)[0]


def _consts_slot_adjoint(w, log_cum, snr_lin, c_prev, c, served_prev, served, served_prev2, c_bar, s_bar,
                         cs_bar, gw, glc, gsnr, tau, consts):
    """:func:`_slot_adjoint_step` with its constants as one tensor."""
    return _slot_adjoint_step(w, log_cum, snr_lin, c_prev, c, served_prev, served, served_prev2, c_bar, s_bar,
                              cs_bar, gw, glc, gsnr, tau, *consts.unbind())


def _consts_slot_adjoint_gated(w, log_cum, snr_lin, c_prev, c, served_prev, served, served_prev2, c_bar,
                               s_bar, cs_bar, gw, glc, gsnr, tau, gate, ggate, consts):
    """:func:`_consts_slot_adjoint` in the slots of a latency floor (``gate``; its gradient ``ggate``)."""
    return _slot_adjoint_step(w, log_cum, snr_lin, c_prev, c, served_prev, served, served_prev2, c_bar, s_bar,
                              cs_bar, gw, glc, gsnr, tau, *consts.unbind(), gate=gate, ggate=ggate)


# E and R symbolic ([A, R, E], [R, E]): one compile serves every batch and fleet size.
SLOT_FORWARD = Kernel(_consts_slot_forward, dim=(-1, -2))
SLOT_ADJOINT = Kernel(_consts_slot_adjoint, dim=(-1, -2))
SLOT_FORWARD_GATED = Kernel(_consts_slot_forward_gated, dim=(-1, -2))
SLOT_ADJOINT_GATED = Kernel(_consts_slot_adjoint_gated, dim=(-1, -2))


@torch.library.custom_op("isaac_net::l1_slot_loop", mutates_args=())
def compiled_slot_loop(w: torch.Tensor, log_cum: torch.Tensor, snr_lin: torch.Tensor, c0: torch.Tensor,
                       tau: torch.Tensor, consts: torch.Tensor, K: int, gate: torch.Tensor | None = None,
                       served0: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(served, csum, served_before)`` after K slots, in the loop's layout (``[A, R, E]``,
    ``[R, E]``; ``served_before``: ``served`` at the start of each slot, K ``[R, E]``);
    ``consts = (num_subbands, se_max, kappa)``; ``gate`` and ``served0`` as in :class:`L1SlotLoop`."""
    w, log_cum, snr_lin, c0, tau, consts = (own_storage(t) for t in (w, log_cum, snr_lin, c0, tau, consts))
    served = torch.zeros_like(snr_lin) if served0 is None else served0.clone()  # an output: not the input
    csum, c = torch.zeros_like(c0), c0
    extra = () if gate is None else (own_storage(gate),)
    kernel = SLOT_FORWARD if gate is None else SLOT_FORWARD_GATED
    history = []
    slot = kernel.graph(w, c, served, csum, snr_lin, log_cum, tau, *extra, consts)  # every slot's shapes
    for _ in range(K):
        history.append(served)
        served, csum, c = slot(w, c, served, csum, snr_lin, log_cum, tau, *extra, consts)
    return served, csum, history


@compiled_slot_loop.register_fake
def _(w, log_cum, snr_lin, c0, tau, consts, K, gate=None, served0=None):
    return torch.empty_like(snr_lin), torch.empty_like(c0), [torch.empty_like(snr_lin) for _ in range(K)]


@torch.library.custom_op("isaac_net::l1_slot_loop_backward", mutates_args=())
def compiled_slot_loop_backward(w: torch.Tensor, log_cum: torch.Tensor, snr_lin: torch.Tensor,
                                c0: torch.Tensor, served_before: list[torch.Tensor], served_K: torch.Tensor,
                                g_served: torch.Tensor, g_csum: torch.Tensor, tau: torch.Tensor,
                                consts: torch.Tensor, gate: torch.Tensor | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                           torch.Tensor, torch.Tensor]:
    """``(gw, glc, gsnr, gc0, gserved0, ggate)`` (``ggate`` 0 without a gate): :func:`_reverse_walk`
    with one :data:`SLOT_ADJOINT` (or :data:`SLOT_ADJOINT_GATED`) call per slot."""
    w, log_cum, snr_lin, c0, served_K, g_served, g_csum, tau, consts = (
        own_storage(t) for t in (w, log_cum, snr_lin, c0, served_K, g_served, g_csum, tau, consts))
    gate = None if gate is None else own_storage(gate)
    adjoint = SLOT_ADJOINT if gate is None else SLOT_ADJOINT_GATED
    kernel = []  # looked up once: every slot's shapes are the same

    def step(k, args):
        if not kernel:
            kernel.append(adjoint.graph(*args, consts))
        return kernel[0](*args, consts)

    out = _reverse_walk(step, w, log_cum, snr_lin, c0, [own_storage(t) for t in served_before], served_K,
                        g_served, g_csum, tau, gate)
    return out if gate is not None else (*out, torch.zeros_like(snr_lin))


@compiled_slot_loop_backward.register_fake
def _(w, log_cum, snr_lin, c0, served_before, served_K, g_served, g_csum, tau, consts, gate=None):
    return (torch.empty_like(w), torch.empty_like(log_cum), torch.empty_like(snr_lin), torch.empty_like(c0),
            torch.empty_like(snr_lin), torch.empty_like(snr_lin))


def _setup_context(ctx, inputs, output):
    w, log_cum, snr_lin, c0, tau, consts, K, gate, served0 = inputs
    ctx.gated, ctx.has_served0 = gate is not None, served0 is not None
    ctx.save_for_backward(w, log_cum, snr_lin, c0, tau, consts, output[0], *((gate,) if ctx.gated else ()),
                          *output[2])


def _compiled_backward(ctx, g_served, g_csum, _g_history):
    w, log_cum, snr_lin, c0, tau, consts, served_K, *rest = ctx.saved_tensors
    gate, served_before = (rest[0], rest[1:]) if ctx.gated else (None, rest)
    zero = torch.zeros_like(snr_lin)
    gw, glc, gsnr, gc0, gs0, ggate = compiled_slot_loop_backward(
        w, log_cum, snr_lin, c0, list(served_before), served_K, zero if g_served is None else g_served,
        torch.zeros_like(c0) if g_csum is None else g_csum, tau, consts, gate)
    # c0 and served0 get their gradients whether or not they require one (autograd drops them then);
    # one per input the op was called with (the dispatcher leaves out trailing defaults).
    grads = (gw, glc, gsnr, gc0, None, None, None, ggate if ctx.gated else None,
             gs0 if ctx.has_served0 else None)
    return grads[:len(ctx.needs_input_grad)]


def slot_kernels_in_background(x: torch.Tensor, L: int, K: int, backward: bool) -> None:
    """Start compiling the slot kernels a compiled step will call (``x``: the step's ``[E, R, A]``
    state; ``L``, ``K``: its latency floor and slots; ``backward``: the adjoints too) in another
    process, unless this one has them already: a cold step compile then takes as long as the
    step's own graphs, not those and the slot kernels one after the other (their compiles took
    about a fifth of a cold first call of L1D on one core)."""
    gates = [True] * (L > 0) + [False] * (L < K)  # gated in the floor's first L slots, plain after
    kernels = [(SLOT_FORWARD_GATED, SLOT_ADJOINT_GATED) if g else (SLOT_FORWARD, SLOT_ADJOINT) for g in gates]
    if all(k._graphs for pair in kernels for k in pair[:1 + backward]):
        return
    E, R, A = x.shape
    compile_in_background(f"{__name__}:_compile_slot_kernels",
                          {"E": E, "R": R, "A": A, "dtype": str(x.dtype).removeprefix("torch."),
                           "device": str(x.device), "gates": gates, "backward": backward})


def _compile_slot_kernels(spec: dict) -> None:
    """A background process's work (:func:`slot_kernels_in_background`): run the compiled slot
    loop (and its backward) on inputs of the step's shapes, which compiles and keeps its kernels."""
    torch.set_num_threads(spec["threads"])
    dtype, device = getattr(torch, spec["dtype"]), torch.device(spec["device"])
    A, R, E = spec["A"], spec["R"], spec["E"]
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.rand(shape, generator=g, dtype=dtype, device=device)

    tau = torch.tensor(0.05, dtype=dtype, device=device)
    consts = torch.tensor((12.0, 5.5, 90.0), dtype=dtype, device=device)
    w, log_cum, snr = rand(A, R, E), torch.log(1e3 + 3e4 * rand(A, R, E)) / tau, 10 ** (3 * rand(R, E))
    c0 = torch.zeros(A, R, E, dtype=dtype, device=device)
    with torch.no_grad():
        for gated in spec["gates"]:
            gate = rand(R, E) if gated else None
            served, _, history = compiled_slot_loop(w, log_cum, snr, c0, tau, consts, 2, gate)
            if spec["backward"]:
                compiled_slot_loop_backward(w, log_cum, snr, c0, history, served, rand(R, E), rand(A, R, E),
                                            tau, consts, gate)


def slot_loop(w, log_cum, snr_lin, c0, K: int, *, tau, consts: tuple, keep_tape: bool = False, gate=None,
              served0=None):
    """``(served, c_sum)`` (``[E, R]``, ``[E, R, A]``) after K slots from the
    model's layout: :class:`L1SlotLoop` eager, :func:`compiled_slot_loop` inside a compiled step
    (one compiled kernel per slot); ``consts = (num_subbands, se_max, kappa)``."""
    if not torch.compiler.is_compiling():
        keep_tape = keep_tape and torch.is_grad_enabled()  # no backward to come: no tape to keep
        return L1SlotLoop.apply(w, log_cum, snr_lin, c0, tau, K, *consts, keep_tape, gate, served0)
    flip = _flip_dims
    const_t = torch.tensor(consts, dtype=w.dtype, device=w.device)
    served, csum, _ = compiled_slot_loop(flip(w), flip(log_cum), flip(snr_lin), flip(c0), tau, const_t, K,
                                         None if gate is None else flip(gate),
                                         None if served0 is None else flip(served0))
    return flip(served), flip(csum)


compiled_slot_loop.register_autograd(_compiled_backward, setup_context=_setup_context)
