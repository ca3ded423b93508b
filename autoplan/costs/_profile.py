"""Profiling the attached devices: the micro-benchmarks behind a measured :class:`~autoplan.Cluster`.

:func:`measure` (what :func:`autoplan.profile` runs, and :meth:`autoplan.Cluster.detect` when
nothing is cached) runs on whatever ``jax.devices()`` gives (emulated CPU devices, GPUs, TPUs) and
measures what the cost model needs, always **the way a plan runs it**: every benchmark runs on all
the devices at once (one operation per device, sharded over a mesh of all of them), so devices
that share hardware (emulated CPU devices are threads sharing the host's cores) show their
contention, and devices with their own hardware (GPUs) show their own speed.

* **Compute**: matmul throughput for each dtype the zoo uses that the platform runs (float32,
  bfloat16, float16), over a sweep of sizes (square ``n x n`` products per device, ``n``
  doubling from 32 until the rate stops growing or one product takes too long), kept as a curve
  of seconds by FLOPs (:class:`~autoplan.costs._measured.ThroughputCurve`, with the fit
  ``t(F) = (F + F_half) / R_max``: the achievable fraction of peak by size); convolution
  throughput the same way (3x3 NHWC convolutions, channels doubling). Each size is timed as the
  difference between a chain of ``1 + k`` dependent operations and one, over ``k`` (the launch
  cancels), less the per-kernel overhead.
* **Memory**: seconds per kernel by the bytes it moves (a chain of a reduction and an
  elementwise update over sizes from 4 KiB to 16 MiB per device (to 256 MiB on accelerators,
  past their last-level caches), bytes and kernels read from
  the compiled program): small kernels run from caches, large ones at the streaming bandwidth.
* **Kernel overhead**: a small transformer training step (embedding, layer norms, attention,
  MLP, cross-entropy, Adam) replicated on every device, less its arguments passed through and
  its kernels' memory time, over the kernels XLA compiled for it. (A chain of one tiny kernel
  repeated understates it: on 8 emulated CPU devices such a chain costs 2-4 us per kernel, a
  tiny GPT step 30-40 us.)
* **Launch overhead**: an executable launch with 1 and with 64 argument arrays (a training step
  passes every parameter and optimizer-state leaf).
* **Communication**: all-reduce, all-gather, reduce-scatter, all-to-all and send/recv
  (``ppermute``, a cyclic shift), each over every mesh-axis geometry of the 2-D logical meshes the
  search tries on these devices (group size and stride: on 8 devices the axes of 8x1, 4x2, 2x4
  and 1x8), over a sweep of message sizes; every group of the axis runs at once. Each size is
  timed the same way, as the slope of a chain of dependent collectives (for all-gather and
  reduce-scatter less the estimated cost of the slice or tile that chains them). The result
  is Alpa's profiling database: a :class:`~autoplan.costs._measured.CollectiveTable` per kind and
  geometry, interpolated inside the measured sizes and extended outside by its fitted
  ``alpha + beta B``.

``quick=True`` measures fewer sizes (well under a minute on a 2-core machine with 8 emulated
devices); the full profile takes a few minutes. :meth:`autoplan.Cluster.detect` caches the result
on disk. This module returns plain measurements (:class:`Measurements`); :mod:`autoplan.costs._local`
turns them into the cluster's fitted tables.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import shard_map
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from autoplan._errors import ClusterError
from autoplan.costs._fit import Curve
from autoplan.costs._hlotext import kernel_traffic

__all__ = ["measure", "Measurements", "cache_key", "PROFILE_DTYPES"]

#: the dtypes the zoo trains in, profiled where the platform runs them
PROFILE_DTYPES = ("float32", "bfloat16", "float16")


#: the operations of a chain's loop body (the chain's length past its first operation is a
#: multiple of it)
_UNROLL = 8


def _chain(one: Callable[[Any], Any], j: Any, v: Any) -> Any:
    """``one`` applied ``1 + UNROLL * j`` times in a row inside the program: once, then a loop
    of ``j`` iterations (a runtime argument, so one compiled program times every length) of
    ``UNROLL`` applications each."""
    def body(i, u):
        for _ in range(_UNROLL):
            u = one(u)
        return u
    return jax.lax.fori_loop(0, j, body, one(v))


_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")


@dataclass
class Measurements:
    """What :func:`measure` measured (raw, before fitting).

    Attributes:
        platform, device_kind, num_devices, device_memory: the devices.
        launch_overhead, arg_overhead, op_overhead: seconds (per launch, per argument array,
            per kernel).
        memory_bandwidth: bytes/s per device.
        curves: ``(op, dtype, flops per device, seconds)`` of each compute sweep.
        collectives: ``(kind, (group size, stride), B, seconds)`` of each collective sweep.
    """

    platform: str
    device_kind: str
    num_devices: int
    device_memory: float
    launch_overhead: float
    arg_overhead: float
    op_overhead: float
    memory_bandwidth: float
    curves: list[tuple[str, str, list[float], list[float]]]
    collectives: list[tuple[str, tuple[int, int], list[float], list[float]]]


@dataclass(frozen=True)
class _Settings:
    reps: int  # timed runs per measurement (at least)
    min_time: float  # seconds of timed runs per measurement (at least, within max_reps)
    max_op_time: float  # stop a compute sweep once one operation takes longer
    matmul_step: int  # size factor between matmul sizes
    comm_sizes: tuple[int, ...]  # collective message sizes (bytes)
    bandwidth_sizes: tuple[int, ...]  # elements per device of the bandwidth curve
    #: added on accelerators, whose last-level caches hold the sizes above (an H100's L2 is 50 MB)
    accelerator_bandwidth_sizes: tuple[int, ...]
    conv_dtypes: bool  # convolutions in every dtype (else float32 only)
    chain_time: float  # seconds a timed chain of operations should last (above the launch's noise)


_QUICK = _Settings(reps=3, min_time=0.01, max_op_time=0.05, matmul_step=4,
                   comm_sizes=(2**10, 2**22), bandwidth_sizes=(2**12, 2**16, 2**20),
                   accelerator_bandwidth_sizes=(2**25,), conv_dtypes=False,
                   chain_time=1e-3)
_FULL = _Settings(reps=5, min_time=0.05, max_op_time=0.25, matmul_step=2,
                  comm_sizes=tuple(2**k for k in range(8, 25, 2)),
                  bandwidth_sizes=tuple(2**k for k in range(10, 23, 2)),
                  accelerator_bandwidth_sizes=(2**24, 2**26), conv_dtypes=True,
                  chain_time=2e-3)


def _device_list(devices: Sequence[Any] | None) -> list[Any]:
    """``devices`` as a list (default ``jax.devices()``); :class:`ClusterError` if not a sequence."""
    if devices is None:
        return list(jax.devices())
    try:
        return list(devices)
    except TypeError:
        raise ClusterError(f"profile: devices should be a list of JAX devices. Got "
                           f"{type(devices).__name__}: {devices!r:.40}. Fix: pass jax.devices() or "
                           "leave devices out.") from None


def cache_key(devices: Sequence[Any] | None = None) -> str:
    """The name a profile of these devices is cached under: platform, device kind, count and
    jaxlib version (``cpu-cpu-8-jaxlib0.10.2``)."""
    import jaxlib  # noqa: PLC0415

    devs = _device_list(devices)
    kind = re.sub(r"[^A-Za-z0-9.]+", "_", devs[0].device_kind).strip("_") or "device"
    return f"{devs[0].platform}-{kind}-{len(devs)}-jaxlib{jaxlib.__version__}"


def measure(devices: Sequence[Any] | None = None, *, quick: bool = False,
            progress: bool = True) -> Measurements:
    """Run the micro-benchmarks on ``devices`` (default ``jax.devices()``), all at once.

    Args:
        devices: the devices to profile; all of them run every benchmark at once.
        quick: fewer sizes.
        progress: show a progress bar (tqdm) on stderr.

    Raises:
        ClusterError: no devices, or devices of different kinds.
    """
    devs = _device_list(devices)
    if not devs:
        raise ClusterError("profile: devices should be a non-empty list of JAX devices. Got none. "
                           "Fix: pass jax.devices() or leave devices out.")
    kinds = {(d.platform, d.device_kind) for d in devs}
    if len(kinds) > 1:
        raise ClusterError(f"profile: devices should all be of one kind. Got {sorted(kinds)}. "
                           "Fix: profile each kind of device separately.")
    return _Profiler(devs, _QUICK if quick else _FULL, progress).run()


def _reference_args(d: int = 32, seq: int = 16, batch: int = 8
                    ) -> tuple[dict, dict, dict]:
    """Parameters, Adam state and a batch for :func:`_reference_step` (numpy, float32): hidden
    size ``d`` (vocabulary and MLP width ``2 d``), ``batch`` sequences of ``seq`` tokens."""
    rng = np.random.default_rng(0)
    v = f = 2 * d

    def w(*shape):
        return (rng.normal(size=shape) / math.sqrt(shape[0])).astype(np.float32)

    params = {"embed": w(v, d), "head": w(d, v)}
    for i in range(2):
        params.update({f"qkv{i}": w(d, 3 * d), f"out{i}": w(d, d), f"fc1{i}": w(d, f),
                       f"fc2{i}": w(f, d), f"ln{i}": np.ones(d, np.float32)})
    opt = {"mu": {k: np.zeros_like(x) for k, x in params.items()},
           "nu": {k: np.zeros_like(x) for k, x in params.items()}}
    data = {"ids": rng.integers(0, v, size=(batch, seq)).astype(np.int32),
            "labels": rng.integers(0, v, size=(batch, seq)).astype(np.int32)}
    return params, opt, data


def _reference_step(params: dict, opt: dict, batch: dict) -> tuple[Any, dict, dict]:
    """A small training step with the kernel mix of a transformer: embedding lookup, two blocks
    of layer norm, 4-head attention and a GELU MLP, softmax cross-entropy, gradients and an Adam
    update."""

    def norm(x, scale):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * scale

    def loss_fn(p):
        h = p["embed"][batch["ids"]]
        b, t, d = h.shape
        for i in range(2):
            q, k, v = jnp.split(norm(h, p[f"ln{i}"]) @ p[f"qkv{i}"], 3, axis=-1)
            heads = [x.reshape(b, t, 4, d // 4).transpose(0, 2, 1, 3) for x in (q, k, v)]
            att = jax.nn.softmax(heads[0] @ heads[1].transpose(0, 1, 3, 2) / 4.0, axis=-1)
            h = h + (att @ heads[2]).transpose(0, 2, 1, 3).reshape(b, t, d) @ p[f"out{i}"]
            h = h + jax.nn.gelu(norm(h, p[f"ln{i}"]) @ p[f"fc1{i}"]) @ p[f"fc2{i}"]
        logits = jax.nn.log_softmax(h @ p["head"], axis=-1)
        return -jnp.take_along_axis(logits, batch["labels"][..., None], axis=-1).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["mu"], grads)
    nu = jax.tree.map(lambda n, g: 0.999 * n + 0.001 * g * g, opt["nu"], grads)
    params = jax.tree.map(lambda x, m, n: x - 1e-3 * m / (jnp.sqrt(n) + 1e-8), params, mu, nu)
    return loss, params, {"mu": mu, "nu": nu}


class _Profiler:
    def __init__(self, devices: list[Any], settings: _Settings, progress: bool):
        self.devices = devices
        self.n = len(devices)
        self.s = settings
        self.mesh = Mesh(np.array(devices, dtype=object), ("d",))
        self.platform = devices[0].platform
        self.show = progress
        self.bar: Any = None
        # filled as the benchmarks run
        self.launch = 0.0
        self.per_arg = 0.0
        self.op_overhead = 0.0
        self.bandwidth = 0.0
        self.bandwidth_sizes = settings.bandwidth_sizes + (
            settings.accelerator_bandwidth_sizes if self.platform != "cpu" else ())

    # ---- timing ------------------------------------------------------------------------
    def time(self, fn: Callable[..., Any], *args: Any) -> float:
        """Seconds of ``fn(*args)`` after a warm-up call (which compiles): the median of the
        faster half of the runs (other processes' load only ever slows a run down)."""
        jax.block_until_ready(fn(*args))
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < self.s.reps or (time.perf_counter() - start < self.s.min_time
                                           and len(times) < 50):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - t0)
        times.sort()
        return statistics.median(times[: max(1, (len(times) + 1) // 2)])

    def sharded(self, shape: tuple[int, ...], dtype: str, spec: Any = None) -> Any:
        """An array of ``shape`` per device, stacked on a leading device axis, sharded on it."""
        x = np.ones((self.n * shape[0],) + tuple(shape[1:]), dtype=np.float32).astype(dtype)
        return jax.device_put(x, NamedSharding(self.mesh, spec if spec is not None else P("d")))

    def replicated(self, x: Any) -> Any:
        return jax.device_put(x, NamedSharding(self.mesh, P()))

    def slope(self, fn: Callable[..., Any], args: tuple) -> float:
        """Seconds per operation of ``fn(j, *args)``, a chain of ``1 + UNROLL j`` dependent
        operations (:func:`_chain`): the time of a chain of ``1 + k`` less that of one, over
        ``k`` (the launch, the arguments and the chain's ends cancel); ``k`` grows (to 512)
        until the chain lasts the settings' ``chain_time``, so that small operations stand out
        from the launch's noise. One compiled program serves every length."""
        one = self.time(fn, self.replicated(np.int32(0)), *args)
        k, t = _UNROLL, 0.0
        for _ in range(3):
            j = self.replicated(np.int32(k // _UNROLL))
            t = max(self.time(fn, j, *args) - one, 0.0) / k
            if k * t >= self.s.chain_time or k >= 512:
                break
            k = min(512, max(2 * k, math.ceil(self.s.chain_time / max(t, 1e-7))))
            k = -(-k // _UNROLL) * _UNROLL
        return t

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)

    # ---- the whole profile -------------------------------------------------------------
    def run(self) -> Measurements:
        from tqdm.auto import tqdm  # noqa: PLC0415

        dtypes = [d for d in PROFILE_DTYPES if self.supports(d)]
        geometries = self.geometries() if self.n > 1 else []
        conv_dtypes = dtypes if self.s.conv_dtypes else ["float32"]
        total = (3 + len(self.bandwidth_sizes) + len(dtypes) + len(conv_dtypes)
                 + len(geometries) * len(_KINDS))
        self.bar = tqdm(total=total, desc="autoplan profile", unit="bench", file=sys.stderr,
                        disable=not self.show, leave=self.show)
        try:
            self.measure_launch()
            curves = [self.memory_curve()]
            self.op_overhead = self.kernel_overhead(curves[0])
            self.step("kernel overhead of a training step")
            curves += [self.matmul_curve(d) for d in dtypes]
            curves += [self.conv_curve(d) for d in conv_dtypes]
            tables = [self.collective_table(kind, g) for g in geometries for kind in _KINDS]
        finally:
            self.bar.close()
        dev = self.devices[0]
        return Measurements(self.platform, dev.device_kind, self.n, self.device_memory(),
                            self.launch, self.per_arg, self.op_overhead, self.bandwidth, curves,
                            tables)

    def supports(self, dtype: str) -> bool:
        """The platform compiles and runs a matmul in ``dtype``."""
        try:
            x = jnp.ones((8, 8), dtype=dtype)
            jax.block_until_ready(jax.jit(lambda a: a @ a)(x))
            return True
        except Exception:  # an unsupported dtype raises one of several XLA errors
            return False

    def geometries(self) -> list[tuple[int, int]]:
        """(group size, stride) of every axis of the 2-D logical meshes over these devices."""
        out: list[tuple[int, int]] = []
        n = self.n
        for inner in range(1, n + 1):
            if n % inner:
                continue
            for g in ((n // inner, inner), (inner, 1)):
                if g[0] > 1 and g not in out:
                    out.append(g)
        return sorted(out, key=lambda g: (-g[0], g[1]))

    # ---- overheads and bandwidth -------------------------------------------------------
    def measure_launch(self) -> None:
        x = self.sharded((8,), "float32")
        t1 = self.time(jax.jit(lambda a: a + 1), x)
        self.step("launch")
        xs = [self.sharded((8,), "float32") for _ in range(64)]
        t64 = self.time(jax.jit(lambda *a: [v + 1 for v in a]), *xs)
        self.step("launch, 64 arguments")
        self.per_arg = max(0.0, (t64 - t1) / 63)
        self.launch = max(0.0, t1 - self.per_arg)
    def kernel_overhead(self, memory: tuple[str, str, list[float], list[float]]) -> float:
        """Seconds per kernel of a small training step's kernel mix, on every device at once,
        beyond its kernels' memory traffic.

        A chain of one tiny kernel repeated understates it: the kernels of a training step are
        of many kinds (gathers, layer norms, softmaxes, reductions, transposes, the optimizer's
        elementwise updates), and on emulated CPU devices each device's kernels contend for the
        host's cores and thread pool. So this times :func:`_reference_step` (two transformer
        blocks with Adam on tensors of a few KiB) replicated on all devices, less the same
        program's arguments passed through and each kernel's bytes at the measured memory
        curve, over the kernels XLA compiled for it.
        """
        _, _, sizes, secs = memory
        per_byte = Curve(sizes, secs)
        args = tuple(self.replicated(t) for t in _reference_args())
        step = jax.jit(_reference_step)
        t_step = self.time(step, *args)
        t_args = self.time(jax.jit(lambda p, o, b: (p, o)), *args)
        per_kernel = kernel_traffic(step.lower(*args).compile().as_text())
        traffic = sum(per_byte.time(b) for b in per_kernel)
        return max(0.0, t_step - t_args - traffic) / max(1, len(per_kernel))

    def memory_curve(self) -> tuple[str, str, list[float], list[float]]:
        """Seconds per kernel by the bytes it moves: a chain of a reduction and an elementwise
        update (two kernels that do not fuse) over ``n`` float32 elements per device, each
        size's bytes and kernels read from the compiled program; small kernels run from caches.
        The largest size's rate is the streaming bandwidth."""
        sizes, secs = [], []
        for n in self.bandwidth_sizes:
            x = self.sharded((1, n), "float32")  # one row per device: the reductions stay local

            def fn_of(k: int) -> Callable[..., Any]:
                def f(v):
                    for _ in range(k):
                        v = v * 1.0001 + jnp.mean(v, axis=1, keepdims=True) * 1e-6
                    return v
                return jax.jit(f)

            reps = 8
            short, long_ = fn_of(1), fn_of(1 + reps)
            t = max(self.time(long_, x) - self.time(short, x), 0.0) / reps
            per_short = kernel_traffic(short.lower(x).compile().as_text())
            per_long = kernel_traffic(long_.lower(x).compile().as_text())
            kernels = max(1, (len(per_long) - len(per_short)) // reps)
            nbytes = (sum(per_long) - sum(per_short)) / reps
            if t > 0 and nbytes > 0:
                sizes.append(nbytes / kernels)
                secs.append(t / kernels)
            self.step(f"memory, {4 * n >> 10} KiB per device")
        if secs:
            self.bandwidth = sizes[-1] / secs[-1]
        return ("memory", "float32", sizes, secs)

    # ---- compute curves ----------------------------------------------------------------
    def sweep(self, make: Callable[[int], tuple[float, Callable[..., Any], tuple]],
              sizes: Sequence[int]) -> tuple[list[float], list[float]]:
        """(FLOPs, seconds per operation) for each size until the rate stops growing or one
        operation takes longer than ``max_op_time``."""
        flops_out: list[float] = []
        secs: list[float] = []
        rates: list[float] = []
        est_rate = 0.0
        for size in sizes:
            flops, fn, args = make(size)
            if est_rate and flops / est_rate > self.s.max_op_time and len(secs) >= 2:
                break
            t = self.slope(fn, args)
            t = max(t - self.op_overhead, 0.5 * t, 1e-9)
            flops_out.append(flops)
            secs.append(t)
            rates.append(flops / t)
            est_rate = rates[-1]
            if t > self.s.max_op_time and len(secs) >= 2:
                break
            if (t >= 1e-3 and len(rates) >= 3 and rates[-1] < 1.05 * rates[-2]
                    and rates[-2] < 1.05 * rates[-3]):
                break  # saturated (judged on operations long enough to time well)
        return flops_out, secs

    def matmul_curve(self, dtype: str) -> tuple[str, str, list[float], list[float]]:
        step = self.s.matmul_step

        def make(n: int):
            a = self.sharded((1, n, n), dtype)
            w = self.replicated(jnp.eye(n, dtype=dtype))  # the chain keeps its values

            fn = jax.jit(lambda j, v, m: _chain(lambda u: jnp.einsum("bij,jk->bik", u, m), j, v))
            return 2.0 * n ** 3, fn, (a, w)

        sizes = [32 * step ** k for k in range(12) if 32 * step ** k <= 16384]
        flops, secs = self.sweep(make, sizes)
        self.step(f"matmul {dtype}")
        return ("matmul", dtype, flops, secs)

    def conv_curve(self, dtype: str) -> tuple[str, str, list[float], list[float]]:
        step = self.s.matmul_step
        batch, hw = 4, 16

        def make(c: int):
            x = self.sharded((batch, hw, hw, c), dtype)
            k = np.zeros((3, 3, c, c), dtype=np.float32)
            k[1, 1] = np.eye(c)  # the centre tap alone: the chain keeps its values
            w = self.replicated(jnp.asarray(k, dtype=dtype))

            def f(j, v, m):
                return _chain(lambda u: jax.lax.conv_general_dilated(
                    u, m, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), j, v)
            return 2.0 * batch * hw * hw * c * c * 9, jax.jit(f), (x, w)

        sizes = [8 * step ** k for k in range(10) if 8 * step ** k <= 2048]
        flops, secs = self.sweep(make, sizes)
        self.step(f"convolution {dtype}")
        return ("conv", dtype, flops, secs)

    # ---- collectives -------------------------------------------------------------------
    def collective_table(self, kind: str, geometry: tuple[int, int]
                         ) -> tuple[str, tuple[int, int], list[float], list[float]]:
        """Time ``kind`` on every group of ``geometry = (size, stride)`` at once."""
        size, stride = geometry
        outer = self.n // (size * stride)
        mesh = Mesh(np.array(self.devices, dtype=object).reshape(outer, size, stride),
                    ("o", "a", "i"))
        spec = P(("o", "a", "i"))
        perm = [(i, (i + 1) % size) for i in range(size)]
        nbytes_out: list[float] = []
        secs: list[float] = []
        for nbytes in self.s.comm_sizes:
            # B of the cost model: the buffer reduced, gathered, scattered, exchanged or sent
            local = max(size, nbytes // 4 // size * size)  # float32 elements per device
            if kind == "all-gather":
                local //= size
            glue = 0.0

            def one(v, kind=kind, local=local):
                if kind == "all-reduce":
                    return jax.lax.psum(v, "a")
                if kind == "all-gather":
                    return jax.lax.all_gather(v, "a", tiled=True)[:local]
                if kind == "reduce-scatter":
                    return jnp.tile(jax.lax.psum_scatter(v, "a", tiled=True), size)
                if kind == "all-to-all":
                    return jax.lax.all_to_all(v, "a", 0, 0, tiled=True)
                return jax.lax.ppermute(v, "a", perm)

            if kind == "all-gather":  # the slice that chains them: one kernel over B/size
                glue = self.op_overhead + 2 * 4 * local / max(self.bandwidth, 1.0)
            elif kind == "reduce-scatter":  # the tile that chains them: one kernel over B
                glue = self.op_overhead + 4 * (local + local // size) / max(self.bandwidth, 1.0)

            # (each device's buffer is its own: no replication checks on the loop carry)
            fn = jax.jit(shard_map(lambda j, v, one=one: _chain(one, j, v), mesh=mesh,
                                   in_specs=(P(), spec), out_specs=spec, check_vma=False))
            x = jax.device_put(np.ones((self.n * local,), np.float32), NamedSharding(mesh, spec))
            t = self.slope(fn, (x,))
            t = max(t - glue, 0.5 * t, 1e-9)
            nbytes_out.append(4.0 * (local * size if kind == "all-gather" else local))
            secs.append(t)
            if t > 0.05:
                break  # larger messages follow the fit
        self.step(f"{kind} over {size} devices, stride {stride}")
        return (kind, (size, stride), nbytes_out, secs)

    # ---- the devices -----------------------------------------------------------------------
    def device_memory(self) -> float:
        """Bytes of memory per device: the device's own (GPU/TPU), else the host's RAM shared by
        the emulated devices."""
        try:
            stats = self.devices[0].memory_stats() or {}
        except Exception:  # not every backend reports memory
            stats = {}
        limit = stats.get("bytes_limit")
        if limit:
            return float(limit)
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            ram = 16 * 2**30
        return float(max(ram // self.n, 2**20))
