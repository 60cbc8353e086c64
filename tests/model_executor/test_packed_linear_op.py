"""The compiled `fd_packed_linear` / `fd_packed_embedding` ops (bf16, wint8, wint4) against float64 numpy.

Oracle: the weights each kind stores, derived here from their definitions (bf16 rounding to nearest even
written independently of the engine's; absmax int8 per output feature; min/max int4 per 32 inputs), x
rounded to bf16 the same way, and a float64 matmul. Tolerance: 2e-6 * K relative to sum_k |x||w| (float32
sums of exact products, in another order). The compiled paths the CPU has (AVX512-BF16 register tiles up to
6 rows; AMX tiles from 7 rows where the CPU has AMX, else the AVX512-BF16 tiles) and the portable path
(forced by the op's `portable` flag) are checked, with the tails of each (rows, K, N).
"""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.linear import Linear, UnquantizedLinearMethod
from fastdeploy.model_executor.layers.quantization.packed import (BF16, WINT4, WINT8, PackedConfig,
                                                                  PackedLinearMethod, pack, packed_bytes,
                                                                  swiglu_rows)
from fastdeploy.model_executor.ops import compiled_op

pytestmark = pytest.mark.usefixtures("ops_enabled")

KINDS = {"bf16": BF16, "wint8": WINT8, "wint4": WINT4}


def round_bf16(a: np.ndarray) -> np.ndarray:
    """Nearest bfloat16 of each float32 (ties to even), as float64: truncate to 8 significant bits, then
    compare the two neighbours."""
    a = np.asarray(a, np.float32)
    down = (a.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    step = np.abs(down) * 0 + np.ldexp(1.0, np.frexp(np.abs(down.astype(np.float32)))[1] - 8)
    up = down + np.sign(a) * step
    exact = a.astype(np.float64)
    lower_gap, upper_gap = np.abs(exact - down), np.abs(up - exact)
    even = ((a.view(np.uint32) >> 16) & 1) == 0
    return np.where((lower_gap < upper_gap) | ((lower_gap == upper_gap) & even), down, up)


def weights_of(w: np.ndarray, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """(values multiplied [out, in] float64, scale applied after the sum [out])."""
    ones = np.ones(w.shape[0])
    if kind == BF16:
        return round_bf16(w), ones
    if kind == WINT8:
        s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
        return np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.float64), s.astype(np.float64)
    out, k = w.shape
    g = w.reshape(out, k // 32, 32)
    low = g.min(axis=2, keepdims=True)
    d = ((g.max(axis=2, keepdims=True) - low) / 15).astype(np.float32)
    q = np.clip(np.rint((g - low) / d), 0, 15)
    return round_bf16((q * d.astype(np.float64) + low).astype(np.float32).reshape(out, k)), ones


def random_weight(rng, out, k):
    return (rng.standard_normal((out, k)) * rng.uniform(0.01, 2.0, (out, 1))).astype(np.float32)


def compiled(name):
    op = compiled_op(name)
    assert op is not None, "the compiled custom ops failed to build on this machine (see the log)"
    return op


# (M, N, K). Up to 6 rows: the AVX512-BF16 register tiles. From 7 rows on a CPU with AMX: AMX tiles, in
# blocks of 16 rows up to 64 rows, the blocking below above (x zero padded: M = 7, 16, 17, 33, 100 hit each
# tail); N not a multiple of 64 leaves padded panel columns out of y.
# 7 and 8 rows: HalfTiles where AMX is absent, AMX tiles where present
SHAPES = [(1, 100, 128), (3, 64, 192), (6, 130, 128), (7, 200, 256), (8, 100, 192), (16, 64, 96), (17, 130, 160),
          (33, 70, 256), (40, 70, 128), (100, 200, 192)]
# K not a multiple of 32 (bf16 and wint8 only; wint4 groups are 32 wide): AMX steps are 32 values of K, so
# the last step is zero padded
K_TAIL_SHAPES = [(2, 70, 144), (7, 70, 144), (8, 70, 130), (16, 64, 130), (17, 130, 208), (33, 64, 176), (100, 70, 2098)]
# Above 64 rows with AMX: x in blocks of 256 rows, panels in groups of 4 MiB // (K rounded up to 32 * 128)
# (bf16 bytes of a panel), every block over a group before the next group; each block's K in chunks of 256
# values (8 steps of 32), 32-row blocks then one of 16. M = 65: one block, a 16-row tail; 257 at K = 4000: a
# full block and a 16-row one, K's last chunk 5 steps; 1000 at K = 1312: the last block partial, K's last
# chunk one step; K = 4002 (not a multiple of 32): a zero padded last step; 272 x 586 at K = 8192: groups of
# 4 panels, the last of 2. A y of 4 MiB or more is stored non-temporally, whole panels where its rows are
# 64-byte aligned (N a multiple of 16): 5500 x 192 (two 256-row blocks and a partial one), 4100 x 272 (the
# last panel partial), and 32 x 32768 (a decode batch's logits: one block of 32 rows).
MANY_ROW_SHAPES = [(65, 70, 256), (257, 130, 4000), (1000, 200, 1312), (5500, 192, 64), (4100, 272, 64),
                   (32, 32768, 64)]
MANY_ROW_K_TAIL_SHAPES = [(300, 70, 4002), (272, 586, 8192)]


NO_BIAS = paddle.zeros([0], "float32")


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("name,m,n,k",
                         [(name, *shape) for name in sorted(KINDS) for shape in SHAPES + MANY_ROW_SHAPES] +
                         [(name, *shape) for name in ("bf16", "wint8")
                          for shape in K_TAIL_SHAPES + MANY_ROW_K_TAIL_SHAPES])
def test_linear_matches_float64(name, portable, with_bias, m, n, k):
    """y = x @ W^T (+ bias, added where each path writes y) against float64 on the values the op multiplies."""
    kind = KINDS[name]
    rng = np.random.default_rng(m * 1000 + n)
    w, x = random_weight(rng, n, k), rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else np.zeros(0, np.float32)
    packed = pack(w, kind)
    assert packed.nbytes == packed_bytes(kind, n, k)
    y = compiled("fd_packed_linear")(paddle.to_tensor(x), paddle.to_tensor(packed), paddle.to_tensor(bias), kind, n,
                                     portable, 0).numpy()
    values, scale = weights_of(w, kind)
    xb = round_bf16(x)
    ref = (xb @ values.T) * scale + (bias if with_bias else 0)
    bound = 2e-6 * k * (np.abs(xb) @ np.abs(values).T) * scale + 2e-7 * np.abs(ref) + 1e-30
    assert y.shape == (m, n)
    assert np.all(np.abs(y - ref) <= bound), f"max error {np.abs(y - ref).max():.3g}"


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("name", ["bf16", "wint8"])
def test_one_row_with_an_odd_number_of_input_pairs(name, portable):
    """K = 130: 65 pairs, so the one-row kernel's two-pairs-per-step loop leaves one pair over."""
    kind = KINDS[name]
    rng = np.random.default_rng(7)
    w, x = random_weight(rng, 70, 130), rng.standard_normal((1, 130)).astype(np.float32)
    y = compiled("fd_packed_linear")(paddle.to_tensor(x), paddle.to_tensor(pack(w, kind)), NO_BIAS, kind, 70,
                                     portable, 0).numpy()
    values, scale = weights_of(w, kind)
    xb = round_bf16(x)
    ref = (xb @ values.T) * scale
    assert np.all(np.abs(y - ref) <= 2e-6 * 130 * (np.abs(xb) @ np.abs(values).T) * scale + 1e-30)


def quick_gelu64(y: np.ndarray) -> np.ndarray:
    """x * sigmoid(1.702 x) in float64 (transformers' QuickGELUActivation)."""
    y = y.astype(np.float64)
    return y / (1 + np.exp(-1.702 * y))


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("name", sorted(KINDS))
@pytest.mark.parametrize("m", [1, 7, 8, 100])  # one row (Wint8Row for wint8), HalfTiles or AMX 16-row blocks, many rows
def test_quick_gelu_activation_is_applied_where_y_is_written(name, portable, m):
    """activation 1: QuickGELU of (x @ W^T + bias) within float32 rounding of float64 QuickGELU of the float64
    product; on the fast path bit for bit the fd_quick_gelu op on the op's plain output (the same vector
    operations; the portable path's scalar exp may differ from them in the last bit)."""
    kind = KINDS[name]
    rng = np.random.default_rng(m)
    w, x = random_weight(rng, 130, 256), rng.standard_normal((m, 256)).astype(np.float32)
    bias = paddle.to_tensor(rng.standard_normal(130).astype(np.float32))
    packed, xt = paddle.to_tensor(pack(w, kind)), paddle.to_tensor(x)
    plain = compiled("fd_packed_linear")(xt, packed, bias, kind, 130, portable, 0)
    fused = compiled("fd_packed_linear")(xt, packed, bias, kind, 130, portable, 1).numpy()
    if not portable:
        np.testing.assert_array_equal(fused, compiled("fd_quick_gelu")(plain).numpy())
    values, scale = weights_of(w, kind)
    ref = quick_gelu64((round_bf16(x) @ values.T) * scale + bias.numpy())
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def silu_times64(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u = g * sigmoid(g) * u in float64 (SwiGLU, Shazeer 2020)."""
    g = g.astype(np.float64)
    return g / (1 + np.exp(-g)) * u


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("name", sorted(KINDS))
# one row (Wint8Row for wint8), register tiles, AMX 16-row blocks (7, 33), AMX many rows (100; without AMX
# K in chunks, the sums kept in a per-thread buffer); intermediate sizes 96 (whole 32-column halves: 3
# panels), 40 (the last panel's halves 8 columns, zero rows after them) and 20 (one partial panel)
# 1100 rows: without AMX three blocks of rows (the last partial), each with its own [block, 64] sums
@pytest.mark.parametrize("m,inter", [(1, 96), (1, 40), (3, 40), (7, 96), (8, 40), (33, 40), (100, 96), (100, 20), (1100, 40)])
def test_swiglu_activation_on_interleaved_gate_up(name, portable, m, inter):
    """activation 2: W [2 inter, K] as [gate | up] rows packed in swiglu_rows' order, bias [gate | up]; y [m,
    inter] = silu(x Wg^T + bg) * (x Wu^T + bu) within float32 rounding of float64; on the fast path bit for
    bit fd_silu_and_mul on the op's plain [gate | up] product (the same sums and vector operations)."""
    kind = KINDS[name]
    rng = np.random.default_rng(m * 100 + inter)
    w, x = random_weight(rng, 2 * inter, 256), rng.standard_normal((m, 256)).astype(np.float32)
    bias = paddle.to_tensor(rng.standard_normal(2 * inter).astype(np.float32))
    xt = paddle.to_tensor(x)
    fused = compiled("fd_packed_linear")(xt, paddle.to_tensor(pack(swiglu_rows(w), kind)), bias, kind, inter,
                                         portable, 2).numpy()
    assert fused.shape == (m, inter)
    if not portable:
        plain = compiled("fd_packed_linear")(xt, paddle.to_tensor(pack(w, kind)), bias, kind, 2 * inter, False, 0)
        np.testing.assert_array_equal(fused, compiled("fd_silu_and_mul")(plain).numpy())
    values, scale = weights_of(w, kind)
    h = (round_bf16(x) @ values.T) * scale + bias.numpy()
    ref = silu_times64(h[:, :inter], h[:, inter:])
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_swiglu_rows_interleaves_gate_and_up_per_32_features():
    w = np.arange(2 * 40, dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)  # row r holds r
    rows = swiglu_rows(w)[:, 0]
    assert rows.shape == (128,)
    np.testing.assert_array_equal(rows[:32], np.arange(32))  # gate 0-31
    np.testing.assert_array_equal(rows[32:64], 40 + np.arange(32))  # up 0-31
    np.testing.assert_array_equal(rows[64:72], 32 + np.arange(8))  # gate 32-39, then zero rows
    np.testing.assert_array_equal(rows[96:104], 72 + np.arange(8))  # up 32-39, then zero rows
    assert not rows[72:96].any() and not rows[104:].any()


def test_linear_activation_for_the_dense_method_and_an_unknown_name():
    """Linear(activation="quick_gelu") on the dense method: QuickGELU of x @ W + b; another name is a
    ValueError naming the allowed ones."""
    rng = np.random.default_rng(5)
    w, b = random_weight(rng, 48, 64), rng.standard_normal(48).astype(np.float32)
    layer = Linear(64, {None: 48}, True, UnquantizedLinearMethod(), activation="quick_gelu")
    layer.weight_loader(layer.weight, w, None)
    layer.weight_loader(layer.bias, b, None)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ref = quick_gelu64(x.astype(np.float64) @ w.T.astype(np.float64) + b)
    np.testing.assert_allclose(layer(paddle.to_tensor(x)).numpy(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"activation must be one of \[None, 'quick_gelu', 'swiglu'\], got 'gelu'"):
        Linear(64, {None: 48}, True, UnquantizedLinearMethod(), activation="gelu")
    with pytest.raises(ValueError, match=r"'swiglu' needs two shards \(gate, up\) of one size, got \{None: 48\}"):
        Linear(64, {None: 48}, True, UnquantizedLinearMethod(), activation="swiglu")


@pytest.mark.parametrize("method", ["dense", "bf16", "wint8"])
def test_swiglu_linear_loads_shards_and_gives_silu_gate_times_up(method):
    """Linear(activation="swiglu") with shards 0 (gate) and 1 (up), loaded in either order: silu(x Wg^T + bg) *
    (x Wu^T + bu), [n, inter], on the dense method and on the packed ones (interleaved at load)."""
    rng = np.random.default_rng(8)
    inter = 40
    gate, up = random_weight(rng, inter, 64), random_weight(rng, inter, 64)
    bg, bu = rng.standard_normal(inter).astype(np.float32), rng.standard_normal(inter).astype(np.float32)
    linear_method = (UnquantizedLinearMethod() if method == "dense"
                     else PackedConfig(KINDS[method]).linear_method(["gate", "up"]))
    layer = Linear(64, {0: inter, 1: inter}, True, linear_method, activation="swiglu")
    layer.weight_loader(layer.weight, up, 1)
    layer.weight_loader(layer.weight, gate, 0)
    layer.weight_loader(layer.bias, bg, 0)
    layer.weight_loader(layer.bias, bu, 1)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    if method == "dense":
        values, scale, xb = np.concatenate([gate, up]).astype(np.float64), 1.0, x.astype(np.float64)
    else:
        values, scale = weights_of(np.concatenate([gate, up]), KINDS[method])
        xb = round_bf16(x)
    h = (xb @ values.T) * scale + np.concatenate([bg, bu])
    y = layer(paddle.to_tensor(x)).numpy()
    assert y.shape == (5, inter)
    np.testing.assert_allclose(y, silu_times64(h[:, :inter], h[:, inter:]), rtol=1e-4, atol=1e-4)


def test_fast_and_portable_paths_agree_on_a_large_call():
    rng = np.random.default_rng(1)
    w, x = random_weight(rng, 300, 512), rng.standard_normal((70, 512)).astype(np.float32)
    for kind in KINDS.values():
        packed = paddle.to_tensor(pack(w, kind))
        fast = compiled("fd_packed_linear")(paddle.to_tensor(x), packed, NO_BIAS, kind, 300, False, 0).numpy()
        portable = compiled("fd_packed_linear")(paddle.to_tensor(x), packed, NO_BIAS, kind, 300, True, 0).numpy()
        np.testing.assert_allclose(fast, portable, rtol=1e-4, atol=1e-4 * np.abs(portable).max())


@pytest.mark.parametrize("name", sorted(KINDS))
def test_embedding_rows_are_the_stored_values(name):
    kind = KINDS[name]
    rng = np.random.default_rng(2)
    w = random_weight(rng, 150, 128)
    ids = np.array([0, 149, 64, 7, 7], np.int64)
    rows = compiled("fd_packed_embedding")(paddle.to_tensor(ids), paddle.to_tensor(pack(w, kind)), kind, 150,
                                           128).numpy()
    values, scale = weights_of(w, kind)
    expected = (values * scale[:, None]).astype(np.float32)[ids]
    np.testing.assert_allclose(rows, expected, rtol=2 ** -8 if kind == WINT4 else 0)  # int4: q*d+m rounded twice here


def test_a_wrong_weight_or_bias_size_is_an_error_naming_the_sizes():
    x = paddle.ones([1, 128])
    with pytest.raises(Exception, match="does not hold 64 x 128"):
        compiled("fd_packed_linear")(x, paddle.zeros([10], "uint8"), NO_BIAS, BF16, 64, False, 0)
    weight = paddle.to_tensor(pack(np.ones((64, 128), np.float32), BF16))
    with pytest.raises(Exception, match=r"bias must be float32 \[64\] or empty, got 63 values"):
        compiled("fd_packed_linear")(x, weight, paddle.zeros([63]), BF16, 64, False, 0)
    with pytest.raises(Exception, match=r"activation must be 0 \(none\), 1 \(quick_gelu\) or 2 \(swiglu\), got 3"):
        compiled("fd_packed_linear")(x, weight, NO_BIAS, BF16, 64, False, 3)
    with pytest.raises(Exception, match="does not hold 128 x 128"):  # SwiGLU of 48 columns: 2 x 64 rows
        compiled("fd_packed_linear")(x, weight, NO_BIAS, BF16, 48, False, 2)
    swiglu = paddle.to_tensor(pack(np.ones((128, 128), np.float32), BF16))
    with pytest.raises(Exception, match=r"bias must be float32 \[96\] or empty, got 48 values"):
        compiled("fd_packed_linear")(x, swiglu, paddle.zeros([48]), BF16, 48, False, 2)


def test_linear_method_packs_shards_and_falls_back_where_the_shape_does_not_fit():
    rng = np.random.default_rng(3)
    q, k = random_weight(rng, 64, 128), random_weight(rng, 32, 128)
    q_bias, k_bias = rng.standard_normal(64).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    layer = Linear(128, {"q": 64, "k": 32}, True, PackedConfig(WINT8).linear_method(["q", "k"]))
    assert isinstance(layer.method, PackedLinearMethod)
    layer.weight_loader(layer.weight, k, "k")
    layer.weight_loader(layer.weight, q, "q")
    layer.weight_loader(layer.bias, k_bias, "k")
    layer.weight_loader(layer.bias, q_bias, "q")
    x = rng.standard_normal((2, 128)).astype(np.float32)
    values, scale = weights_of(np.concatenate([q, k]), WINT8)
    ref = (round_bf16(x) @ values.T) * scale + np.concatenate([q_bias, k_bias])
    np.testing.assert_allclose(layer(paddle.to_tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    odd = Linear(80, {None: 8}, False, PackedConfig(WINT4).linear_method(["w"]))  # 80 is not a multiple of 32
    assert odd.weight.dtype == paddle.float32 and isinstance(odd.method._dense, UnquantizedLinearMethod)
