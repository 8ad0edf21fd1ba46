"""Backend ``"cuda_graph"``: a discrete level whose step is replayed from CUDA graphs.

A step of L1 or QA launches a few hundred small kernels (L1: K = 40 slots), one of L2-legacy
several thousand; captured once, the whole step is one graph launch. Capture records device
addresses, so the step runs on static buffers: the inputs are copied into them, and the
captured step ends by copying the new state over the state it read, so the next replay starts
from it.

What a level needs to be captured (``DiscreteLevel.capturable``): no host-side work that
depends on tensor values (no ``.item()``, ``bool(tensor)``, ``nonzero``; ``prepare_capture``
turns off such shortcuts), and the Python step counter only in choices that repeat: values
come from the device counter ``t_now``, and the steps of one ``graph_phase(t)`` choose the
same work. L1 and QA have one phase; L2-legacy chooses its HARQ process, grant and RLC ring
rows, SR occasions and fading blocks from the slot ``t K`` modulo the rings' common period
(21 phases by default), so it is replayed from one graph per phase, all in one memory pool.
A step's random numbers are drawn before the replay, eagerly from the level's generator
(``draw``), and copied into the graph's inputs: the same numbers as an eager step.
"""

from __future__ import annotations

import typing

import torch

from isaac_net.core.kpi import KPI_KEYS
from isaac_net.core.levels.base import DiscreteLevel


class CudaGraphs:
    """Capture with ``torch.cuda``: warm-up on a side stream, then ``CUDAGraph``s in one memory pool
    (they are replayed one at a time on one stream, and the outputs each one keeps are referenced)."""

    def __init__(self):
        self.pool = None

    @staticmethod
    def warm_up(fn, n: int) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(n):
                fn()
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, fn):
        """``(replay, outputs)``: replay re-runs the recorded kernels into ``outputs``."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        self.pool = graph.pool()
        return graph.replay, out


class _Phase(typing.NamedTuple):
    replay: typing.Callable[[], None]
    draws: tuple  # static buffers of the step's random numbers
    kpis: dict  # static outputs (what the graph writes)


class CudaGraphLevel:
    """A capturable ``DiscreteLevel`` stepped by replaying captured steps.

    Same interface as the level (``step``, ``reset``, ``t``, ``E``, ``R``, ``cfg``...; other
    attributes are the level's). The inputs are checked on the host at every step, as by the
    level. The step of each ``graph_phase`` is captured when it first comes (after ``warmup_steps``
    eager warm-up steps on a side stream, whose effect on the state is undone).

    :param graphs: the capture API (``warm_up(fn, n)``, ``capture(fn) -> (replay, outputs)``), a
        :class:`CudaGraphs` by default; the tests pass a stand-in whose replay runs the step
        again into the same outputs, to check the buffer logic without a GPU.
    """

    def __init__(self, level: DiscreteLevel, *, warmup_steps: int = 3, graphs=None):
        if not isinstance(level, DiscreteLevel):
            raise TypeError(f"level: expected a DiscreteLevel, got {type(level).__name__}")
        if not level.capturable:
            raise NotImplementedError(
                f"backend 'cuda_graph': this {level.name!r} level {level.not_capturable_because} and "
                "cannot be captured; use backend='eager'")
        level.prepare_capture()
        self.level = level
        self.warmup_steps = warmup_steps
        self._graphs = graphs if graphs is not None else CudaGraphs()
        self._phases: dict[int, _Phase] = {}
        self._inputs: tuple | None = None  # static input buffers
        self._state: dict | None = None  # static state buffers (what the graphs read)

    def __getattr__(self, name):
        if name == "level":  # not set yet (during __init__)
            raise AttributeError(name)
        return getattr(self.level, name)

    @property
    def t(self) -> int:
        return self.level.t

    @property
    def num_graphs(self) -> int:
        """The graphs captured so far (one per phase met)."""
        return len(self._phases)

    def reset(self, env_ids=None) -> None:
        """As ``DiscreteLevel.reset``; after capture, written into the static state."""
        self.level.reset(env_ids)
        if self._state is not None:
            self._write_state(self.level.device_state())

    def step(self, send, msg_bytes, snr_db=None, pos=None, tx_dbm=None, deadline=None) -> dict:
        """As ``DiscreteLevel.step``: one replay of the step's captured graph (captured at its
        phase's first step)."""
        level = self.level
        inputs = level.checked_inputs(send, msg_bytes, snr_db, pos, tx_dbm, deadline)
        t = level.t
        with torch.no_grad():
            draws = level.draw()  # eagerly, from the level's generator: an eager step's numbers
        if self._inputs is None:
            self._inputs = tuple(x.clone() for x in inputs)
            self._state = {name: x.clone() for name, x in level.device_state().items()}
        for static, x in zip(self._inputs, inputs, strict=True):
            static.copy_(x)
        phase = level.graph_phase(t)
        if phase not in self._phases:
            self._phases[phase] = self._capture(draws)
        replay, static_draws, kpis = self._phases[phase]
        for static, x in zip(static_draws, draws, strict=True):
            static.copy_(x)
        replay()
        level.t = t + 1  # (a replay runs no Python; a stand-in may have counted too)
        # Copies: the next replay overwrites the static outputs.
        return {k: v.clone() for k, v in kpis.items()}

    # ------------------------------------------------------------------ capture
    def _write_state(self, state: dict) -> None:
        for name, buf in self._state.items():
            buf.copy_(state[name])
        self.level.load_device_state(self._state)

    def _capture(self, draws: tuple) -> _Phase:
        """The graph of the current step's phase, on the static inputs and state and on static
        buffers for ``draws``; the state is left as it was."""
        level, t0 = self.level, self.level.t
        static_draws = tuple(x.clone() for x in draws)

        def captured_step() -> dict:
            """The step on the static buffers, then its new state copied over them."""
            level.t = t0  # the phase's host-side choices
            level.load_device_state(self._state)
            kpis = level._step(*self._inputs, draws=static_draws)
            self._write_state(level.device_state())
            return kpis

        start = {name: x.clone() for name, x in self._state.items()}
        with torch.no_grad():
            # Lazy initialisation (kernels, workspaces, tables) must not happen during capture.
            self._graphs.warm_up(captured_step, self.warmup_steps)
            self._write_state(start)  # undo the warm-up
            replay, kpis = self._graphs.capture(captured_step)
        level.t = t0
        self._write_state(start)  # a capture only records; a stand-in may also have run the step
        return _Phase(replay, static_draws, {k: kpis[k] for k in KPI_KEYS})
