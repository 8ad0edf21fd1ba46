"""Backend ``"cuda_graph"``: a discrete level whose step is replayed from one CUDA graph.

A step of L1 or QA launches a few hundred small kernels (L1: K = 40 slots); captured
once, the whole step is one graph launch. Capture records device addresses, so the step
runs on static buffers: the inputs are copied into them, and the captured step ends by
copying the new state over the state it read, so the next replay starts from it.

What a level needs to be captured (``DiscreteLevel.capturable``): no host-side work that
depends on tensor values (no ``.item()``, ``bool(tensor)``, ``nonzero``), and no Python
value that changes between steps baked into the arithmetic (the step counter is the device
tensor ``t_now``). L1 and QA qualify; L2-legacy does not (its fading blocks, SR occasions
and HARQ processes are chosen on the host from ``t``).
"""

from __future__ import annotations

import torch

from isaac_net.core.kpi import KPI_KEYS
from isaac_net.core.levels.base import DiscreteLevel


class CudaGraphs:
    """Capture with ``torch.cuda``: warm-up on a side stream, then one ``CUDAGraph``."""

    @staticmethod
    def warm_up(fn, n: int) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(n):
                fn()
        torch.cuda.current_stream().wait_stream(side)

    @staticmethod
    def capture(fn):
        """``(replay, outputs)``: replay re-runs the recorded kernels into ``outputs``."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        return graph.replay, out


class CudaGraphLevel:
    """A capturable ``DiscreteLevel`` stepped by replaying one captured step.

    Same interface as the level (``step``, ``reset``, ``t``, ``E``, ``R``, ``cfg``...; other
    attributes are the level's). The inputs are checked on the host at every step, as by the
    level. Captured at the first ``step`` (after ``warmup_steps`` eager warm-up steps on a side
    stream, whose effect on the state is undone).

    :param graphs: the capture API (``warm_up(fn, n)``, ``capture(fn) -> (replay, outputs)``),
        :class:`CudaGraphs` by default; the tests pass a stand-in whose replay runs the step
        again into the same outputs, to check the buffer logic without a GPU.
    """

    def __init__(self, level: DiscreteLevel, *, warmup_steps: int = 3, graphs=CudaGraphs):
        if not isinstance(level, DiscreteLevel):
            raise TypeError(f"level: expected a DiscreteLevel, got {type(level).__name__}")
        if not level.capturable:
            raise NotImplementedError(
                f"backend 'cuda_graph': level {level.name!r} chooses work on the host from t at every step "
                "and cannot be captured; use backend='eager'")
        self.level = level
        self.warmup_steps = warmup_steps
        self._graphs = graphs
        self._replay = None
        self._inputs: tuple | None = None  # static input buffers
        self._state: dict | None = None  # static state buffers (what the graph reads)
        self._kpis: dict | None = None  # static outputs (what the graph writes)

    def __getattr__(self, name):
        if name == "level":  # not set yet (during __init__)
            raise AttributeError(name)
        return getattr(self.level, name)

    @property
    def t(self) -> int:
        return self.level.t

    def reset(self, env_ids=None) -> None:
        """As ``DiscreteLevel.reset``; after capture, written into the static state."""
        self.level.reset(env_ids)
        if self._state is not None:
            self._write_state(self.level.state())

    def step(self, send, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> dict:
        """As ``DiscreteLevel.step``: one replay of the captured step (captured at the first call)."""
        inputs = self.level.checked_inputs(send, msg_bytes, snr_db, pos, tx_dbm, deadline)
        if self._replay is None:
            self._capture(inputs)
        t = self.level.t
        for static, x in zip(self._inputs, inputs, strict=True):
            static.copy_(x)
        self._replay()
        self.level.t = t + 1  # (a replay runs no Python; a stand-in may have counted too)
        # Copies: the next replay overwrites the static outputs.
        return {k: v.clone() for k, v in self._kpis.items()}

    # ------------------------------------------------------------------ capture
    def _write_state(self, state: dict) -> None:
        for name, buf in self._state.items():
            buf.copy_(state[name])
        self.level.load_state(self._state)

    def _captured_step(self) -> dict:
        """The step on the static buffers, then its new state copied over them."""
        self.level.load_state(self._state)
        kpis = self.level._step(*self._inputs)
        self._write_state(self.level.state())
        return kpis

    def _capture(self, inputs: tuple) -> None:
        level = self.level
        self._inputs = tuple(x.clone() for x in inputs)
        self._state = {name: x.clone() for name, x in level.state().items()}
        start = {name: x.clone() for name, x in self._state.items()}
        t0 = level.t
        with torch.no_grad():
            # Lazy initialisation (kernels, workspaces) must not happen during capture.
            self._graphs.warm_up(self._captured_step, self.warmup_steps)
            self._write_state(start)  # undo the warm-up
            self._replay, kpis = self._graphs.capture(self._captured_step)
        level.t = t0
        self._write_state(start)  # a capture only records; a stand-in may also have run the step
        self._kpis = {k: kpis[k] for k in KPI_KEYS}
