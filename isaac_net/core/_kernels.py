"""Fused kernels of the compiled path: a pure tensor function compiled once for every batch size.

``torch.compile`` of a whole L1D step unrolls its K slots forward and backward into one graph:
minutes of inductor work per new batch size. The compiled path instead compiles the *body* of
one slot (its forward, and its adjoint) and loops over the slots in Python. A :class:`Kernel`
compiles its function through dynamo with the batch dimensions of every tensor symbolic (cells E
and robots R: a new fleet size compiles nothing either),
keeps the graph that inductor compiled and afterwards calls that graph directly: dynamo's
frame evaluation costs about 0.1 ms per call on a machine of this kind, several times the
fused kernel on small tensors, and a step makes 2 K such calls. A kernel runs without
autograd: it is the inside of a node whose backward is another kernel.

A compiled kernel is also kept on disk, in ``isaac_net_kernels/`` of inductor's cache directory
(``TORCHINDUCTOR_CACHE_DIR``): inductor's generated module and how to call it, keyed by the
function and its module's source, the library's sources, torch's version and inductor's
settings, the CPU's vector instructions and torch thread count (on a GPU its model), the
dtype, device and static sizes. A later process loads it instead of tracing the function
again (dynamo and AOT tracing of the two slot kernels were most of a warm first call); a
loaded kernel is checked once against the function run eagerly, and one that does not match,
load or parse is compiled as if nothing were kept. :class:`Precompiled` does the same for a
whole function with autograd (the compiled step), through dynamo's ``aot_compile``.

A cold compile can also use a core the process does not: :func:`compile_in_background` runs a
module's kernel compiles in a new Python process while this one compiles something else (L1D's
slot kernels while it compiles the step), and a :class:`Kernel` that would compile waits for such
processes first, then loads what they kept; :func:`probe_isa_in_background` builds inductor's
vector-instruction test programs there while QAD's forward kernel is traced, and nothing waits for
it. A cold compile on the CPU tells inductor that the vector instructions torch's CPU check reports
work instead of letting it probe each (:func:`_compile_trusting_isa`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import torch


class _Graph:
    """One compiled graph: ``fn`` over the graph's inputs (``spec``: ``(arg, None)`` a tensor argument,
    ``(arg, dim)`` a symbolic size of one) and the sizes it was specialised to."""

    def __init__(self, fn, spec: list, static: list, dtype: torch.dtype, device: torch.device, ndims: tuple):
        self.fn, self.spec, self.static = fn, spec, static
        self.dtype, self.device, self.ndims = dtype, device, ndims
        kept = {(i, d) for i, d, _ in static}
        tensors = sorted({i for i, d in spec if d is None})
        self._symbolic = [(i, d) for i in tensors for d in range(ndims[i]) if (i, d) not in kept]

    def accepts(self, args: tuple) -> bool:
        """Whether these arguments pass the guards dynamo put on the graph (dtype, device, ranks, the
        sizes it kept static: size-1 dimensions and the leading ones; a symbolic size is not 1,
        which dynamo traced as a case of its own)."""
        if (args[0].dtype, args[0].device) != (self.dtype, self.device):
            return False
        if tuple(t.dim() for t in args) != self.ndims:
            return False
        return (all(args[i].shape[d] == size for i, d, size in self.static)
                and all(args[i].shape[d] != 1 for i, d in self._symbolic))

    def __call__(self, *args: torch.Tensor):
        return self.fn([args[i] if d is None else args[i].shape[d] for i, d in self.spec])

    def to_json(self) -> dict:
        return {"spec": self.spec, "static": self.static, "ndims": list(self.ndims)}


@functools.cache
def _library_key() -> str:
    """What a kept kernel depends on besides its function and shapes: every source of the library
    (a kernel's body calls into several modules), torch, inductor's settings, the CPU's vector
    instructions."""
    import torch._inductor.config as inductor_config

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    h.update(torch.__version__.encode())
    h.update(torch.backends.cpu.get_cpu_capability().encode())
    h.update(repr(sorted(inductor_config.save_config_portable().items())).encode())
    return h.hexdigest()


def _source_key(fn) -> str | None:
    """The hash of a kernel function's own module (it may live outside the library); None where it
    has no source file to read (defined at a prompt or by ``exec``): then nothing of it is kept,
    since nothing would tell a changed function from the kept one."""
    try:
        path = inspect.getsourcefile(fn)
    except TypeError:  # a builtin
        path = None
    return None if path is None else _file_key(path)


@functools.cache
def _file_key(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:  # "<string>", "<stdin>", a deleted file
        return None


def _target(device: torch.device) -> list:
    """What inductor generated the code for besides the sources: on the CPU the torch thread count
    (its parallel loops are written for it), on a GPU the GPU's name and architecture."""
    if device.type == "cuda":
        return [torch.cuda.get_device_name(device), list(torch.cuda.get_device_capability(device))]
    return [torch.get_num_threads()]


def _store_file(what: list, suffix: str) -> Path:
    """The store's file for the key ``what`` (a JSON-able list)."""
    return _store() / f"{hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]}{suffix}"


def _matches_eager(got, eager) -> bool:
    """Whether a loaded graph's outputs match the function run eagerly: each element within a
    relative ``1e-9`` (float64) or ``1e-4`` (other dtypes) of the eager one, or within ``1e-9``
    (float64) or ``1e-3`` of its tensor's largest magnitude. The second bound is for outputs that
    are differences of larger operands: a fused kernel adds and multiplies in another order than
    eager ops, and in float32 an ulp of the operands (QAD's forward: 1e-3 of operands of 1e4, in
    a value of 0.1) is far above a relative 1e-4 of the value. A kernel of another function, or a
    damaged one, is off by the tensor's own scale."""
    eager = tuple(eager)
    f64 = all(t.dtype == torch.float64 for t in eager if t.is_floating_point())
    rtol, of_scale, atol = (1e-9, 1e-9, 1e-12) if f64 else (1e-4, 1e-3, 1e-6)
    return _same(got, eager, rtol=rtol, atol=atol, of_scale=of_scale)


def _store() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "isaac_net_kernels"


# Inductor checks which vector instructions (AVX2, AVX-512, ...) it can build for on this machine
# once per process: it compiles a probe and loads it in a new Python process for each candidate
# (a noticeable part of a first call's time; docs/design.md, "Measurements and history"). The
# store keeps the answer for the machine, the compiler and torch it was found for; a later
# process that loads kept code and finds all the candidates were usable tells inductor so
# (``cpp.vec_isa_ok``) while it loads, instead of probing. A cold compile, with no answer yet,
# tells inductor the same (:func:`_compile_trusting_isa`): the kernel it builds with the best
# candidate's instructions and loads is the probe, and its answer is kept.
_ISA_RECORD = "vec_isa.json"


def _isa_machine() -> list:
    """What the probe's answer depends on: torch, the Python running it, the CPU's vector
    instructions as torch reads them, and the C++ compiler inductor would use (its path and file)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.cpu_vec_isa import x86_isa_checker

    cxx = inductor_config.cpp.cxx
    found = [shutil.which(c) for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]
    compiler = next((c for c in found if c), None)
    stat = os.stat(compiler) if compiler else None
    return [torch.__version__, sys.executable, platform.machine(), x86_isa_checker(), compiler,
            None if stat is None else [stat.st_size, stat.st_mtime_ns], os.environ.get("ATEN_CPU_CAPABILITY")]


def _isa_candidates() -> list[str]:
    """The vector instruction sets inductor would probe here (those the CPU reports)."""
    from torch._inductor.cpu_vec_isa import supported_vec_isa_list, x86_isa_checker

    flags = x86_isa_checker()
    return [str(isa) for isa in supported_vec_isa_list if all(f in flags for f in str(isa).split())]


_isa_told = False  # whether this process told inductor the kept answer instead of probing
_isa_kept = False  # whether this process's own answer is in the store
_isa_started = False  # whether this process started probe_isa_in_background's process


def _isa_known() -> bool:
    """Whether this process knows its vector instructions already: inductor's setting, or its answer."""
    import torch._inductor.config as inductor_config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    return inductor_config.cpp.vec_isa_ok is not None or valid_vec_isa_list.cache_info().currsize > 0


def _kept_isa() -> bool | None:
    """What the store says of this machine's vector instructions, where this process knows nothing
    of them yet: True all the candidates worked, False one did not, None no answer for this
    machine (or this process knows already: inductor's own answer or setting stands)."""
    if _isa_known():
        return None
    try:
        kept = json.loads((_store() / _ISA_RECORD).read_text())
        if kept["machine"] != json.loads(json.dumps(_isa_machine())):  # as JSON keeps it
            return None
        return kept["valid"] == _isa_candidates()
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def _known_isa():
    """While loading kept code: tell inductor its vector instructions all work if the store says
    they did on this machine (nothing changes where it has no such answer: inductor probes)."""
    global _isa_told
    import torch._inductor.config as inductor_config

    if not _kept_isa():
        yield
        return
    _isa_told = True
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        yield


def _compile_trusting_isa(device: torch.device | None, compile_fn):
    """``compile_fn()`` (a compile on ``device``: :class:`Kernel`'s and :class:`Precompiled`'s) with
    inductor told that the vector instructions torch's CPU check reports all work
    (``cpp.vec_isa_ok``, inductor's own setting) where this process knows nothing of them yet and
    the store says no candidate failed here: instead of inductor's probe (a test program built and
    loaded per candidate, about 5 s of a ~13 s cold first call), the compiled kernel, built with the
    best candidate's instructions and loaded, is the test. Where that compile fails (a compiler that
    cannot build them), inductor probes and ``compile_fn`` runs again. What inductor builds even
    when told runs meanwhile in another process (:func:`probe_isa_in_background`); after a compile
    that succeeds, :func:`_remember_isa` keeps the answer."""
    import torch._inductor.config as inductor_config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    probe_isa_in_background(device)
    if device is None or device.type != "cpu" or _isa_known() or _kept_isa() is False:
        result = compile_fn()
    else:
        try:
            with inductor_config.patch({"cpp.vec_isa_ok": True}):
                result = compile_fn()
        except Exception as e:  # noqa: BLE001 - any failure: inductor's probe decides, and it compiles again
            valid_vec_isa_list.cache_clear()  # the list it was told
            _warn_once(f"a compile with the CPU's vector instructions trusted failed ({type(e).__name__}: "
                       f"{e}); inductor probes them and it compiles again")
            result = compile_fn()
    _remember_isa()
    return result


def _remember_isa() -> None:
    """Keep inductor's answer of this process for later ones, once it has probed (not told)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    global _isa_kept
    probed = inductor_config.cpp.vec_isa_ok is None and valid_vec_isa_list.cache_info().currsize > 0
    if _isa_told or _isa_kept or not probed:  # one record a process: every load and compile calls this
        return
    record = {"machine": _isa_machine(), "valid": [str(isa) for isa in valid_vec_isa_list()]}
    path = _store() / _ISA_RECORD
    try:
        if path.exists() and json.loads(path.read_text()) == json.loads(json.dumps(record)):
            _isa_kept = True
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, json.dumps(record))
    except (OSError, ValueError):  # a read-only cache, or a record being replaced: probe next time
        return
    _isa_kept = True


def probe_isa_in_background(device: torch.device | None) -> None:
    """Before a compile on the CPU: what inductor's vector-instruction probe builds even when told
    (:func:`_probe_isa`) run in another process meanwhile, once per process, where this one has no
    answer yet and no other background compile runs (L1D's slot kernels probe as they compile, and
    a third process competes for the same cores).

    Inductor reaches its probe only when it writes its first kernel, seconds after tracing began.
    Started at the compile's start on another core, the test programs are built into the shared
    cache by then (inductor locks each one, so the two processes never build one twice): this
    process only loads them."""
    global _isa_started

    if (_isa_started or device is None or device.type != "cpu" or _isa_known()
            or (_store() / _ISA_RECORD).exists()
            or any(proc.poll() is None for proc in _BACKGROUND)):  # a running compile probes for itself
        return
    _isa_started = True
    compile_in_background(f"{__name__}:_probe_isa", {}, wait=False)


def _probe_isa(spec: dict) -> None:
    """In a background process: what inductor's vector-instruction probe still builds when it is
    told the candidates work, as the compiling process is with no answer kept
    (:func:`_compile_trusting_isa`): AVX-512's BF16 test program. The candidates in the reverse of
    inductor's order, so that a compiling process walking its own meets this one in the middle; no
    answer kept (the compiled kernel is the test)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.cpu_vec_isa import supported_vec_isa_list

    torch.set_num_threads(spec["threads"])
    candidates = set(_isa_candidates())
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        for isa in reversed(supported_vec_isa_list):
            if str(isa) in candidates:
                bool(isa)  # builds and loads what it tests; inductor caches the answer per ISA


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a concurrent reader sees
    the old file or the new one, never a part."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


_BACKGROUND: list = []  # compile_in_background's processes this process has not waited for yet
_PROBES: list = []  # its processes nothing waits for (the vector-instruction probe)


_RUN_TARGET = "import importlib, json, sys; m, f = sys.argv[1].split(':'); " \
              "getattr(importlib.import_module(m), f)(json.loads(sys.argv[2]))"


def compile_in_background(target: str, spec: dict, *, wait: bool = True) -> None:
    """Call ``target`` (``"module:function"``) with ``spec`` (JSON-able; the torch thread count
    added as ``threads``) in a new Python process that compiles kernels into this process's store
    (the same ``TORCHINDUCTOR_CACHE_DIR`` and library) while this one goes on; with ``wait``, the
    next :class:`Kernel` compile here waits for it, then loads what it kept (without: nothing waits,
    as for a probe whose builds inductor's file locks share). A process that fails or keeps nothing
    costs only its core: the kernel is compiled here then."""
    root = str(Path(__file__).resolve().parents[2])  # the directory that holds the package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    spec = {**spec, "threads": torch.get_num_threads()}  # inductor writes its loops for the thread count
    try:
        (_BACKGROUND if wait else _PROBES).append(subprocess.Popen(
            [sys.executable, "-c", _RUN_TARGET, target, json.dumps(spec)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    except OSError:  # no new process here: compile in this one, as without
        return


def _join_background(timeout_s: float = 900.0) -> None:
    """Wait for the background compiles started by this process (one that outlives ``timeout_s``
    is stopped: its kernels are compiled here instead)."""
    while _BACKGROUND:
        proc = _BACKGROUND.pop()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@atexit.register
def _stop_background() -> None:
    """At exit, stop background compiles and probes nobody waits for (nothing of theirs is used then)."""
    _BACKGROUND.extend(_PROBES)
    _PROBES.clear()
    _join_background(timeout_s=0.0)


def own_storage(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a contiguous tensor with storage of its own: a :class:`Kernel` calls its graph
    without dynamo's guards, and those would treat views and aliased inputs apart."""
    return t if t._base is None and t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def _symbolic_dims(dim, *, negative: bool) -> tuple | None:
    """``dim`` (an int or a tuple of ints, all negative or all non-negative as asked) as a tuple;
    None where it is not one."""
    dims = dim if isinstance(dim, tuple) else (dim,)
    ok = all(isinstance(d, int) and not isinstance(d, bool) and (d < 0) == negative for d in dims)
    return dims if ok and dims and len(set(dims)) == len(dims) else None


@contextlib.contextmanager
def _distinct_symbols():
    """Dynamo's duck sizing off while it traces: every symbolic dimension a symbol of its own, so that
    no graph can take only inputs where two sizes stay equal as they were traced (E = 8 cells of R = 8
    robots). With torch 2.13 the dimensions marked dynamic kept symbols of their own with it on too (a
    graph traced at E = R = 8 served E = 16, R = 5); a guard against a version where they do not."""
    from torch.fx.experimental import _config as fx_config

    with fx_config.patch(use_duck_shape=False):
        yield


class Kernel:
    """``fn`` (contiguous tensors on one device with storage of their own in, no views and no tensor
    twice, the dtypes of all fixed by the first's: it alone keys the graph; a tuple of tensors out,
    none of them an input; no branches on values) compiled by inductor once per dtype, device and
    pattern of size-1 dimensions, with
    dimension ``dim`` (counted from the end: the last by default; a tuple: several) of every tensor of
    rank > 1 symbolic (``dims`` names the arguments whose batch dimensions sit elsewhere, or None:
    static), each with a symbol of its own even where two sizes are equal when it is traced: any
    other batch size reuses the graph (found once per new set of shapes, then by a dict lookup).
    ``inductor``: inductor settings for this kernel's compile (e.g. ``{"cpp.simdlen": 1}``).

    ``num_compiles`` counts the graphs compiled (the tests check that a new batch size adds none),
    ``num_loads`` those loaded from the store a previous process left (see the module's docstring).
    """

    def __init__(self, fn, *, dim: int | tuple = -1, dims: dict | None = None, inductor: dict | None = None):
        symbolic = _symbolic_dims(dim, negative=True)
        if symbolic is None:
            raise ValueError(f"Kernel({fn.__name__}): dim must be a negative int (counted from the end) or a "
                             f"tuple of them, got {dim!r}")
        self.fn, self.dim = fn, symbolic
        self._names = list(inspect.signature(fn).parameters)
        checked = {}
        for name, d in (dims or {}).items():
            if name not in self._names or (d is not None and _symbolic_dims(d, negative=True) is None):
                raise ValueError(f"Kernel({fn.__name__}): dims maps parameter names to a negative int, "
                                 f"a tuple of them or None, got {name!r}: {d!r}")
            checked[name] = () if d is None else _symbolic_dims(d, negative=True)
        # Per argument: its symbolic dimensions counted from the end (() : all static).
        self._dims = [checked.get(name, symbolic) for name in self._names]
        self.inductor = dict(inductor or {})  # inductor settings of this kernel's compile (part of its key)
        self._dynamo = None  # torch.compile(fn) at the first compile: importing dynamo takes seconds
        self._graphs: list[_Graph] = []
        self._by_shapes: dict = {}  # (dtype, device, shapes) -> the graph that takes them
        self._kept = None
        self.num_compiles = 0
        self.num_loads = 0  # graphs loaded from the disk store instead of compiled

    def __call__(self, *args: torch.Tensor):
        return self.graph(*args)(*args)

    def graph(self, *args: torch.Tensor) -> _Graph:
        """The compiled graph that takes these arguments (a loop calling the kernel K times with
        arguments of the same shapes looks it up once)."""
        t0 = args[0]
        key = (t0.dtype, t0.device, *(t.shape for t in args))
        graph = self._by_shapes.get(key)
        if graph is None:
            graph = self._by_shapes[key] = self._graph(args)
        return graph

    def _graph(self, args: tuple) -> _Graph:
        for g in self._graphs:
            if g.accepts(args):
                return g
        if any(t._base is not None for t in args) or len({t.data_ptr() for t in args}) < len(args):
            raise ValueError(f"Kernel({self.fn.__name__}): expected tensors with storage of their own "
                             "(no views, no argument twice)")
        _join_background()  # a background compile may be keeping this very kernel
        path = self._path(args)
        graph = self._load(path, args)
        if graph is not None:
            self._graphs.append(graph)
            self.num_loads += 1
            return graph
        for i, t in enumerate(args):
            for d in self._batch_dims(i, t):
                torch._dynamo.maybe_mark_dynamic(t, d)
        if self._dynamo is None:
            self._dynamo = torch.compile(self.fn, backend=self._keep, dynamic=False, fullgraph=True)
        def compile_here():
            self._kept = None
            with torch.no_grad():
                return self._dynamo(*args)

        with _distinct_symbols():
            result = _compile_trusting_isa(args[0].device, compile_here)
        if self._kept is None:
            raise RuntimeError(f"Kernel({self.fn.__name__}): dynamo reused a graph this kernel does not know")
        compiled, inner, spec, static, num_outputs = self._kept
        if num_outputs != len(result):  # dynamo returns inputs and constants outside the graph
            raise TypeError(f"Kernel({self.fn.__name__}): every output must be computed in the graph "
                            f"(got {len(result)} outputs, {num_outputs} from the graph); "
                            "return no input unchanged")
        graph = _Graph(inner.current_callable if inner is not None else None, spec, static, args[0].dtype,
                       args[0].device, tuple(t.dim() for t in args))
        # Inductor's own call (below AOTAutograd's runtime wrapper, ~10 us less a call) where it gives
        # the same outputs as the whole compiled function; that function where not.
        if graph.fn is None or not _same(graph(*args), result):
            graph.fn = lambda inputs, fn=compiled: fn(*inputs)
        elif path is not None:
            self._save(path, graph, inner)
        self._graphs.append(graph)
        self.num_compiles += 1
        return self._graphs[-1]

    def _batch_dims(self, i: int, t: torch.Tensor) -> tuple:
        """Argument ``i``'s symbolic dimensions (from the front): none for 0-d and 1-d constants."""
        dims = self._dims[i] if i < len(self._dims) else self.dim
        return () if t.dim() <= 1 else tuple(t.dim() + d for d in dims if t.dim() + d >= 0)

    def _path(self, args: tuple) -> Path | None:
        """The store's file for these arguments: their dtype, device and sizes, the batch dimensions
        (``dim``) of each tensor of rank > 1 free unless 1 (dynamo specialises size 1); None
        for a function without a source file (nothing kept)."""
        source = _source_key(self.fn)
        if source is None:
            return None
        sizes = [[-1 if d in self._batch_dims(i, t) and n != 1 else n for d, n in enumerate(t.shape)]
                 for i, t in enumerate(args)]
        device = args[0].device
        what = [self.fn.__module__, self.fn.__qualname__, source,
                _library_key(), str(args[0].dtype), str(device), sizes, *_target(device)]
        if self.inductor:  # (a kernel without settings of its own keeps the key it had)
            what.append(sorted(self.inductor.items()))
        return _store_file(what, ".json")

    def _save(self, path: Path, graph: _Graph, inner) -> None:
        """Keep a compiled graph for later processes: inductor's generated module (``<key>.py``)
        and how to call it (``<key>.json``, written last: a reader finds both or neither)."""
        if inner.constants or getattr(inner, "torchbind_constants", None) or not inner.source_code:
            return  # a graph with constants needs them at load: compiled each process
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for target, text in ((path.with_suffix(".py"), inner.source_code),
                                 (path, json.dumps(graph.to_json()))):
                _write_atomic(target, text)
        except OSError as e:  # a read-only cache: compile each process, as torch would
            warnings.warn(f"Kernel({self.fn.__name__}): could not keep the compiled kernel ({e})",
                          stacklevel=3)

    def _load(self, path: Path, args: tuple) -> _Graph | None:
        """The graph kept at ``path`` for these arguments, checked against the function run eagerly,
        or None."""
        if path is None or not path.exists():
            return None
        try:
            from torch._inductor.codecache import PyCodeCache

            kept = json.loads(path.read_text())
            with _known_isa():  # the module builds (finds) its C++ kernels as it is imported
                call = PyCodeCache.load_by_key_path(path.stem, str(path.with_suffix(".py"))).call
            _remember_isa()
            graph = _Graph(call, [tuple(x) for x in kept["spec"]], [tuple(x) for x in kept["static"]],
                           args[0].dtype, args[0].device, tuple(kept["ndims"]))
            if not graph.accepts(args):
                return None
            with torch.no_grad():
                eager = self.fn(*args)
            got = graph(*args)
        except Exception:  # noqa: BLE001 - a damaged or foreign file: compile instead
            return None
        return graph if _matches_eager(got, eager) else None

    def _keep(self, gm, example_inputs):
        """The dynamo backend: inductor, keeping what it compiled for the direct calls."""
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        spec, static = [], []  # read before inductor, which rewrites the graph's metadata
        for node in (n for n in gm.graph.nodes if n.op == "placeholder"):
            source, example = node.meta["grapharg"].source, node.meta["example_value"]
            if isinstance(example, torch.SymInt):  # L['w'].size()[2]
                spec.append((self._names.index(source.base.local_name), source.idx))
            else:
                i = self._names.index(source.local_name)
                spec.append((i, None))
                static += [(i, d, s) for d, s in enumerate(example.shape) if isinstance(s, int)]
        num_outputs = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        inner = []

        def keep_inner(graph, inputs, **kwargs):
            out = compile_fx_inner(graph, inputs, **kwargs)
            n_in = sum(1 for n in graph.graph.nodes if n.op == "placeholder")
            inner.append(out if n_in == len(spec) else None)  # AOT kept the graph's inputs as they are
            return out

        # The callers pass contiguous tensors (the loops make them): no per-input size and stride asserts.
        # AOTAutograd's cache would hand back its wrapper without calling keep_inner (inductor's cache
        # still serves the compiled graph).
        with inductor_config.patch({"size_asserts": False, **self.inductor}), \
                functorch_config.patch(enable_autograd_cache=False):
            compiled = compile_fx(gm, example_inputs, inner_compile=keep_inner)
        self._kept = (compiled, inner[0] if len(inner) == 1 else None, spec, static, num_outputs)
        return compiled


_MISSING = object()


class Precompiled:
    """``fn`` compiled whole ahead of its first call (dynamo's ``aot_compile``, ``fullgraph``), with
    dimension ``dim`` (a tuple: each of them) of every tensor of higher rank symbolic, each with a
    symbol of its own, and kept on disk beside the kernels
    (``<key>.aot``, keyed as a :class:`Kernel` is, and by ``tag``, grad mode, which tensors require
    grad and the other arguments' values). A later process loads it and calls it without dynamo
    tracing anything: what was left of a warm first call (tracing a step took about 2 s, loading
    its graphs from inductor's cache another second) becomes a load of one file. A loaded function
    is checked once against ``fn`` run eagerly.

    ``before_compile(args)``, when given, is called just before ``fn`` is compiled (not when it is
    loaded): where to start the compiles of what ``fn`` calls on another core.

    ``torch.compile(fn)`` serves what the store cannot: arguments a kept function's guards refuse,
    a compile that fails (``aot_compile`` is experimental in torch; warned once). ``num_compiles``
    and ``num_loads`` count the functions compiled and loaded, ``num_fallbacks`` the patterns of
    arguments sent to ``torch.compile``.
    """

    def __init__(self, fn, *, tag: tuple = (), dim: int | tuple = 0, before_compile=None):
        symbolic = _symbolic_dims(dim, negative=False)
        if symbolic is None:
            raise ValueError(f"Precompiled({getattr(fn, '__qualname__', fn)}): dim must be a non-negative "
                             f"int or a tuple of them, got {dim!r}")
        self.fn, self.tag, self.dim = fn, tuple(tag), symbolic
        self.before_compile = before_compile  # called with the arguments when fn must be compiled
        self._fns: dict = {}  # pattern of arguments -> the compiled function, or None: torch.compile's
        self._dynamo = None
        self.num_compiles = self.num_loads = self.num_fallbacks = 0

    def _pattern(self, args: tuple) -> tuple:
        """What selects a compiled function (every step looks it up): grad mode; each tensor's
        dtype, device, sizes (``dim`` free unless it is 1: dynamo specialises size 1) and whether it
        requires grad; the other arguments themselves (hashable; the disk key takes their repr)."""
        d = self.dim
        return (torch.is_grad_enabled(),) + tuple(
            (a.dtype, a.device, tuple(-1 if i in d and n != 1 else n for i, n in enumerate(a.shape)),
             a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)

    def __call__(self, *args):
        pattern = self._pattern(args)
        fn = self._fns.get(pattern, _MISSING)
        if fn is _MISSING:
            fn = self._fns[pattern] = self._get(pattern, args)
            if fn is None:
                self.num_fallbacks += 1
        if fn is not None:
            if fn.guard_check(*args):
                return fn.fn(*args)  # the guards are checked: the compiled call itself
            self._fns[pattern] = None  # a pattern the key did not tell apart: dynamo's from now on
            self.num_fallbacks += 1
        if self._dynamo is None:
            self._dynamo = torch.compile(self.fn, dynamic=False)
        self._mark_dynamic(args)
        return self._dynamo(*args)

    def _mark_dynamic(self, args: tuple) -> None:
        for a in args:
            if isinstance(a, torch.Tensor):
                for d in self.dim:
                    if a.dim() > d:
                        torch._dynamo.maybe_mark_dynamic(a, d)

    def _path(self, pattern: tuple, args: tuple) -> Path | None:
        source = _source_key(self.fn)
        if source is None:  # no source file: nothing kept
            return None
        what = [self.fn.__module__, self.fn.__qualname__, list(self.tag), source, _library_key(),
                repr(pattern)]
        for device in sorted({a.device for a in args if isinstance(a, torch.Tensor)}, key=str):
            what += _target(device)
        return _store_file(what, ".aot")

    def _get(self, pattern: tuple, args: tuple):
        path = self._path(pattern, args)
        fn = self._load(path, args)
        if fn is not None:
            self.num_loads += 1
            return fn
        if self.before_compile is not None:
            self.before_compile(args)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        self._mark_dynamic(args)
        try:
            fn = _compile_trusting_isa(device, lambda: self._aot_compile(args))
        except Exception as e:  # noqa: BLE001 - experimental in torch: compile the usual way instead
            _warn_once(f"{self.fn.__qualname__}{self.tag}: aot_compile failed ({type(e).__name__}: {e}); "
                       "compiled by torch.compile in each process instead")
            return None
        self.num_compiles += 1
        if path is None:
            return fn
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fn.save_compiled_function(str(path))  # written to a temporary file, then renamed
        except Exception as e:  # noqa: BLE001 - a read-only cache, or a graph torch cannot serialise
            _warn_once(f"{self.fn.__qualname__}{self.tag}: could not keep the compiled function ({e})")
        return fn

    def _aot_compile(self, args: tuple):
        """``fn`` compiled by dynamo's ``aot_compile`` for ``args`` (raises where it fails)."""
        for _attempt in range(3):
            try:
                # (dynamo's guards read .grad of every input)
                with warnings.catch_warnings(), _distinct_symbols():
                    warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not")
                    return torch.compile(self.fn, fullgraph=True, dynamic=False).aot_compile((args, {}))
            except torch._dynamo.exc.RestartAnalysis:
                # torch.compile traces a frame again when dynamo asks to (a scalar it turns into a
                # tensor); aot_compile leaves that to its caller, and the next attempt knows.
                continue
        raise RuntimeError("aot_compile kept restarting")

    def _load(self, path: Path, args: tuple):
        """The function kept at ``path``, if it loads, its guards take ``args`` and its outputs match
        ``fn``'s run eagerly; otherwise None."""
        if path is None or not path.exists():
            return None
        try:
            with path.open("rb") as f, _known_isa():
                fn = torch.compiler.load_compiled_function(f)
            _remember_isa()
            if not fn.guard_check(*args):
                return None
            got = [t.detach() for t in _tensors(fn.fn(*args))]
            with torch.no_grad():
                eager = _tensors(self.fn(*args))
        except Exception:  # noqa: BLE001 - a damaged or foreign file: compile instead
            return None
        return fn if _matches_eager(got, eager) else None


def _tensors(out) -> list:
    """The tensors of a function's output (a tensor or a tuple, ``None`` entries left out)."""
    return [out] if isinstance(out, torch.Tensor) else [t for t in out if t is not None]


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=4)


def _same(a, b, rtol: float = 0.0, atol: float = 0.0, of_scale: float = 0.0) -> bool:
    """Two tuples of tensors equal in length and shapes, and in values: exactly, or each element of
    ``a`` within ``rtol`` of the one of ``b``, or within ``atol`` plus ``of_scale`` times the largest
    finite magnitude of its tensor of ``b`` (NaN equal to NaN)."""
    a, b = tuple(a), tuple(b)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return False
    if rtol == atol == of_scale == 0.0:
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    def scale(t):  # the tensor's largest finite magnitude (0 for an empty or non-finite one)
        finite = torch.nan_to_num(t.detach().double().abs(), nan=0.0, posinf=0.0, neginf=0.0)
        return float(finite.max()) if finite.numel() else 0.0

    return all(torch.allclose(x, y, rtol=rtol, atol=atol + (of_scale * scale(y) if of_scale else 0.0),
                              equal_nan=True) for x, y in zip(a, b, strict=True))
