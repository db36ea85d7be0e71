"""GroupConv2D against a NumPy loop-over-groups reference, forward and gradients."""

import keras
import numpy as np
import pytest

from keras_efficientnet.layers import GroupConv2D, num_groups
from tests.helpers import assert_config_round_trip


def _pad(x, kernel, strides, padding):
    if padding == "valid":
        return x
    pads = []
    for size, k in zip(x.shape[1:3], kernel.shape[:2]):
        out = -(-size // strides)
        total = max((out - 1) * strides + k - size, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, [(0, 0), *pads, (0, 0)])


def reference_conv(x, kernel, strides, padding):
    """Grouped conv by explicit loops over groups and kernel taps (NumPy, float64)."""
    kh, kw, group_size, filters = kernel.shape
    groups = x.shape[-1] // group_size
    per_group = filters // groups
    xp = _pad(x.astype("float64"), kernel, strides, padding)
    out_h = (xp.shape[1] - kh) // strides + 1
    out_w = (xp.shape[2] - kw) // strides + 1
    y = np.zeros((x.shape[0], out_h, out_w, filters))
    for g in range(groups):
        xs = xp[..., g * group_size:(g + 1) * group_size]
        ks = kernel[..., g * per_group:(g + 1) * per_group].astype("float64")
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, i:i + strides * out_h:strides, j:j + strides * out_w:strides]
                y[..., g * per_group:(g + 1) * per_group] += patch @ ks[i, j]
    return y


def reference_grads(x, kernel, upstream, strides, padding):
    """d(sum(upstream * conv))/dx and /dkernel by the same loops, transposed."""
    kh, kw, group_size, filters = kernel.shape
    groups = x.shape[-1] // group_size
    per_group = filters // groups
    xp = _pad(x.astype("float64"), kernel, strides, padding)
    pad_top = pad_left = 0
    if padding == "same":
        pad_top = (xp.shape[1] - x.shape[1]) // 2
        pad_left = (xp.shape[2] - x.shape[2]) // 2
    out_h, out_w = upstream.shape[1:3]
    dxp = np.zeros_like(xp)
    dk = np.zeros(kernel.shape)
    for g in range(groups):
        cin = slice(g * group_size, (g + 1) * group_size)
        cout = slice(g * per_group, (g + 1) * per_group)
        for i in range(kh):
            for j in range(kw):
                rows = slice(i, i + strides * out_h, strides)
                cols = slice(j, j + strides * out_w, strides)
                patch = xp[:, rows, cols, cin]
                dk[i, j, :, cout] += np.einsum("bhwc,bhwo->co", patch, upstream[..., cout])
                dxp[:, rows, cols, cin] += upstream[..., cout] @ kernel[i, j, :, cout].T
    dx = dxp[:, pad_top:pad_top + x.shape[1], pad_left:pad_left + x.shape[2]]
    return dx, dk


def _grads(layer, x, upstream):
    """Gradients of sum(upstream * layer(x)) w.r.t. x and the kernel, on the active backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            loss = tf.reduce_sum(layer(xt) * upstream)
        dx, dk = tape.gradient(loss, [xt, layer.kernel.value])
        return dx.numpy(), dk.numpy()
    if backend == "jax":
        import jax

        def loss(xv, kv):
            out, _ = layer.stateless_call([kv], [], xv)
            return (out * upstream).sum()

        dx, dk = jax.grad(loss, argnums=(0, 1))(x, layer.kernel.value)
        return np.asarray(dx), np.asarray(dk)
    pytest.skip(f"gradient helper not written for backend {backend}")


CASES = [
    # channels, filters, group_size, kernel, strides, padding
    (16, 16, 1, 3, 1, "same"),
    (16, 16, 4, 3, 2, "same"),
    (32, 32, 16, 5, 1, "same"),
    (32, 64, 16, 3, 2, "valid"),
    (12, 12, 12, 3, 1, "same"),
    (48, 48, 4, 3, 2, "same"),  # 12 groups: the single grouped-kernel path on TensorFlow
    (16, 16, 16, 3, 1, "same"),  # 1 group: an ordinary convolution
    # Graphcore's rule where 16 does not divide the channels: max(C // 16, 1) equal groups.
    (40, 40, 16, 3, 1, "same"),  # 2 groups of 20 (B3's block1a)
    (48, 48, 16, 3, 2, "same"),  # 3 groups of 16 (B4's and B5's block1a)
    (24, 24, 16, 3, 1, "same"),  # 1 dense group of 24 (B3-B5's block1b)
]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "portable"])
@pytest.mark.parametrize("channels,filters,group_size,kernel,strides,padding", CASES)
def test_forward_and_gradients_match_numpy(channels, filters, group_size, kernel, strides,
                                           padding, fast):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 9, 10, channels)).astype("float32")
    layer = GroupConv2D(filters, kernel, strides, group_size=group_size, padding=padding,
                        use_fast_path=fast)
    layer.build(x.shape)
    kernel_value = rng.standard_normal(layer.kernel.shape).astype("float32")
    layer.kernel.assign(kernel_value)

    y = keras.ops.convert_to_numpy(layer(x))
    expected = reference_conv(x, kernel_value, strides, padding)
    assert y.shape == expected.shape == layer.compute_output_shape(x.shape)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)

    upstream = rng.standard_normal(expected.shape).astype("float32")
    dx, dk = _grads(layer, x, upstream)
    ref_dx, ref_dk = reference_grads(x, kernel_value, upstream, strides, padding)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dk, ref_dk, rtol=1e-4, atol=1e-3)


def test_matches_keras_conv2d_groups_weights():
    # Same kernel layout as Keras' grouped Conv2D, so weights transfer between the two.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 8, 32)).astype("float32")
    ours = GroupConv2D(32, 3, group_size=16)
    theirs = keras.layers.Conv2D(32, 3, padding="same", groups=2, use_bias=False)
    ours.build(x.shape)
    theirs.build(x.shape)
    assert tuple(ours.kernel.shape) == tuple(theirs.kernel.shape) == (3, 3, 16, 32)
    theirs.kernel.assign(ours.kernel.value)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x)),
                               keras.ops.convert_to_numpy(theirs(x)), rtol=1e-4, atol=1e-4)


def test_initializer_variance_uses_per_group_fan_out():
    layer = GroupConv2D(64, 3, group_size=16)
    layer.build((1, 8, 8, 64))
    # groups = 4, fan_out per group = 3 * 3 * 64 / 4 = 144; variance 2 / 144 (truncated normal
    # at 2 sigma keeps the stated variance through Keras' correction factor).
    std = float(np.std(keras.ops.convert_to_numpy(layer.kernel)))
    assert abs(std - np.sqrt(2.0 / 144)) < 0.15 * np.sqrt(2.0 / 144)


@pytest.mark.parametrize("channels,group_size,groups,width", [
    (32, 16, 2, 16), (40, 16, 2, 20), (48, 16, 3, 16), (24, 16, 1, 24), (8, 16, 1, 8),
    (144, 1, 144, 1), (96, 12, 8, 12)])
def test_groups_follow_graphcores_rule(channels, group_size, groups, width):
    assert num_groups(channels, group_size) == groups
    layer = GroupConv2D(channels, 3, group_size=group_size)
    layer.build((1, 8, 8, channels))
    assert layer.groups == groups and tuple(layer.kernel.shape) == (3, 3, width, channels)


def test_groups_that_cannot_split_the_channels_are_rejected_with_valid_sizes():
    # B6's block1a: 56 channels at 16 would be 3 groups of 18.67.
    layer = GroupConv2D(56, 3, group_size=16, name="block1a_conv")
    with pytest.raises(ValueError, match=r"block1a_conv: group_size=16 gives max\(56 // 16, 1\) "
                                         r"= 3 groups, which do not split its 56 channels "
                                         r"evenly; group sizes that do \(up to 32\): "
                                         r"\[1, 2, 4, 7, 8, 12, 13, 14, 19"):
        layer.build((1, 8, 8, 56))
    with pytest.raises(ValueError, match="group_size must be a positive int, received 0"):
        num_groups(16, 0)


@pytest.mark.parametrize("bad", [dict(filters=0), dict(kernel_size=0), dict(strides=0),
                                 dict(group_size=-1), dict(padding="full")])
def test_bad_arguments_name_the_argument(bad):
    args = dict(filters=8, kernel_size=3, strides=1, group_size=1, padding="same")
    args.update(bad)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        GroupConv2D(**args)


def test_config_round_trip():
    assert_config_round_trip(GroupConv2D(32, (5, 3), 2, group_size=16, use_bias=True))
