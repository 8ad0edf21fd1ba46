"""L2-legacy's per-step shortcuts around its slot loop: the memo of ``checked_inputs`` (inputs that repeat
are not checked and resolved again) and the numba step's arrays kept from step to step. Each must give
what the plain path gives, and follow inputs and states that change."""

import re

import pytest
import torch

from isaac_net.core import make_engine
from isaac_net.core.levels import base
from isaac_net.core.levels.base import DiscreteLevel

E, R = 3, 4


def _plain(eng, *args, **kwargs) -> tuple:
    """The checks without the memo (``DiscreteLevel.checked_inputs``)."""
    return DiscreteLevel.checked_inputs(eng, *args, **kwargs)


def _assert_same(got: tuple, want: tuple) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    return dict(send=(torch.rand(E, R, generator=g) < 0.5).to(dtype),
                msg_bytes=torch.full((E, R), 3000.0, dtype=dtype),
                pos=(torch.rand(E, R, 2, generator=g, dtype=dtype) - 0.5) * 300,
                tx_dbm=torch.full((E, R), 23.0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_checked_inputs_memo_gives_the_plain_checks_values(dtype, monkeypatch):
    """Repeated inputs are resolved once (no SNR from the positions again) to the same values; inputs
    changed in place, of another kind or shape are resolved again."""
    eng = make_engine("L2-legacy", E, R, dtype=dtype, seed=0)
    x = _inputs(dtype)
    calls = []
    radio_inputs = base._validate.radio_inputs
    monkeypatch.setattr(base._validate, "radio_inputs", lambda *a: calls.append(1) or radio_inputs(*a))
    for t in range(3):
        send = x["send"] if t != 1 else x["send"].bool()
        _assert_same(eng.checked_inputs(send, x["msg_bytes"], pos=x["pos"], tx_dbm=x["tx_dbm"]),
                     _plain(eng, send, x["msg_bytes"], pos=x["pos"], tx_dbm=x["tx_dbm"]))
    assert len(calls) == 1 + 3  # the first step's, then only the plain path's
    x["pos"][0, 0, 0] += 50.0  # in place: the same tensor, another SNR
    cases = [dict(pos=x["pos"], tx_dbm=x["tx_dbm"]),
             dict(pos=x["pos"][0], tx_dbm=x["tx_dbm"]),  # broadcast: another shape
             dict(snr_db=torch.full((E, R), 10.0, dtype=dtype)),
             dict(snr_db=torch.full((E, R), 10.0, dtype=dtype), deadline=3),
             dict(snr_db=10.0, deadline=3.0),  # a float where an int was
             dict(snr_db=-0.0, deadline=3.0)]  # -0.0 is another input than 0.0 (the same values here)
    for size, kw in [(x["msg_bytes"], kw) for kw in cases] + [(2000.0, dict(snr_db=0.0))] * 2:
        _assert_same(eng.checked_inputs(x["send"], size, **kw), _plain(eng, x["send"], size, **kw))
    kw = dict(snr_db=0.0)
    eng.checked_inputs(x["send"], 2000.0, **kw)[2].add_(1.0)  # the checked values changed by a caller
    _assert_same(eng.checked_inputs(x["send"], 2000.0, **kw), _plain(eng, x["send"], 2000.0, **kw))


def test_checked_inputs_memo_rejects_what_the_plain_checks_reject():
    """After a step whose inputs are kept, bad sends and inputs changed to bad values raise the same
    errors."""
    eng = make_engine("L2-legacy", E, R, seed=0)
    x = _inputs()
    eng.step(**x)
    bad_sends = [torch.full((E, R), 2.0), torch.full((E, R), float("nan")), torch.ones(E, R + 1), 0.5,
                 torch.ones(E, R, dtype=torch.float64) * 0.5, torch.ones(E, R, dtype=torch.int64) * 3]
    for send in bad_sends:
        with pytest.raises((ValueError, TypeError)) as plain:
            _plain(eng, send, x["msg_bytes"], pos=x["pos"], tx_dbm=x["tx_dbm"])
        with pytest.raises(type(plain.value), match=re.escape(str(plain.value))):
            eng.checked_inputs(send, x["msg_bytes"], pos=x["pos"], tx_dbm=x["tx_dbm"])
    x["msg_bytes"][1, 2] = float("nan")  # in place, after it was kept
    with pytest.raises(ValueError, match="msg_bytes: expected finite values"):
        eng.step(**x)
    x["msg_bytes"][1, 2] = 0.0
    with pytest.raises(ValueError, match="msg_bytes: expected sizes > 0 bytes"):
        eng.step(**x)


@pytest.mark.parametrize("backend", ["numba", "eager"])
def test_steps_keep_earlier_states_and_follow_reset_and_load_state(backend):
    """The arrays the numba step keeps from step to step are its own: a state() taken before a step keeps
    its queue and per-message values; reset and load_state replay the same steps
    as eager does."""
    x = _inputs()
    engines = {b: make_engine("L2-legacy", E, R, seed=4, backend=b) for b in (backend, "eager")}
    outs = {b: [] for b in engines}
    for b, eng in engines.items():
        for t in range(12):
            if t == 6:
                eng.reset([1])
            outs[b].append(eng.step(**{**x, "send": torch.ones(E, R)}))
    for a, c in zip(outs[backend], outs["eager"], strict=True):
        for k in ("offered", "delivered", "timeouts", "overflow", "aoi", "queued_msgs"):
            assert torch.equal(a[k], c[k]), k
    eng = engines[backend]
    kept = eng.state()
    copies = {k: v.clone() for k, v in kept.items() if isinstance(v, torch.Tensor)}
    first = [eng.step(**x) for _ in range(3)]
    for k in ("bytes", "size", "gen", "length", "fresh_gen", "pending", "held", "rlc_cnt", "round_slot"):
        assert torch.equal(kept[k], copies[k]), k
    eng.load_state({**copies, "rng_state": kept["rng_state"]})  # the step counter with it
    again = [eng.step(**x) for _ in range(3)]
    for a, c in zip(first, again, strict=True):
        for k in a:
            assert torch.equal(a[k], c[k]), k
