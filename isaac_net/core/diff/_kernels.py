"""Fused kernels of the compiled path: a pure tensor function compiled once for every batch size.

``torch.compile`` of a whole L1D step unrolls its K slots forward and backward into one graph:
minutes of inductor work per new batch size. The compiled path instead compiles the *body* of
one slot (its forward, and its adjoint) and loops over the slots in Python. A :class:`Kernel`
compiles its function through dynamo with the last (batch) dimension of every tensor symbolic,
keeps the graph that inductor compiled and afterwards calls that graph directly: dynamo's
frame evaluation costs about 0.1 ms per call on a machine of this kind, several times the
fused kernel on small tensors, and a step makes 2 K such calls. A kernel runs without
autograd: it is the inside of a node whose backward is another kernel.
"""

from __future__ import annotations

import inspect

import torch


class _Graph:
    """One compiled graph: ``fn`` over the graph's inputs (``spec``: ``(arg, None)`` a tensor argument,
    ``(arg, dim)`` a symbolic size of one) and the sizes it was specialised to."""

    def __init__(self, fn, spec: list, static: list, dtype: torch.dtype, device: torch.device, ndims: tuple):
        self.fn, self.spec, self.static = fn, spec, static
        self.dtype, self.device, self.ndims = dtype, device, ndims

    def accepts(self, args: tuple) -> bool:
        """Whether these arguments pass the guards dynamo put on the graph (dtype, device, ranks and
        the sizes it kept static: size-1 dimensions and the leading ones)."""
        if (args[0].dtype, args[0].device) != (self.dtype, self.device):
            return False
        if tuple(t.dim() for t in args) != self.ndims:
            return False
        return all(args[i].shape[d] == size for i, d, size in self.static)

    def __call__(self, *args: torch.Tensor):
        return self.fn([args[i] if d is None else args[i].shape[d] for i, d in self.spec])


class Kernel:
    """``fn`` (contiguous tensors of one dtype and device with storage of their own in, no views and
    no tensor twice; a tuple of tensors out, none of them an input; no branches on values)
    compiled by inductor once per dtype, device and pattern of size-1 dimensions, with
    the last dimension of every tensor symbolic: any other batch size reuses the graph (found
    once per new set of shapes, then by a dict lookup).

    ``num_compiles`` counts the graphs compiled (the tests check that a new batch size adds none).
    """

    def __init__(self, fn):
        self.fn = fn
        self._names = list(inspect.signature(fn).parameters)
        self._dynamo = torch.compile(fn, backend=self._keep, dynamic=False, fullgraph=True)
        self._graphs: list[_Graph] = []
        self._by_shapes: dict = {}  # (dtype, device, shapes) -> the graph that takes them
        self._kept = None
        self.num_compiles = 0

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
        for t in args:  # the batch dimension, last in the loops' layout; 0-d and 1-d constants stay static
            if t.dim() > 1:
                torch._dynamo.maybe_mark_dynamic(t, t.dim() - 1)
        self._kept = None
        with torch.no_grad():
            result = self._dynamo(*args)
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
        self._graphs.append(graph)
        self.num_compiles += 1
        return self._graphs[-1]

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
        with inductor_config.patch(size_asserts=False), functorch_config.patch(enable_autograd_cache=False):
            compiled = compile_fx(gm, example_inputs, inner_compile=keep_inner)
        self._kept = (compiled, inner[0] if len(inner) == 1 else None, spec, static, num_outputs)
        return compiled


def _same(a, b) -> bool:
    """Two tuples of tensors equal in length, shapes and values."""
    a, b = tuple(a), tuple(b)
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y)
                                    for x, y in zip(a, b, strict=True))
