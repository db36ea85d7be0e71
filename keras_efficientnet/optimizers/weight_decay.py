"""Regex exclusion of variables (by path) from weight decay and from LARS trust ratios, and the
shared base of the optimizers whose weight decay is L2 on the gradient."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import keras
from keras import ops

# Matched with `re.search` against the Keras 3 variable path, e.g. "block1a/project_norm/gamma".
# Anchored at the end, not the start, since a model nested in another (or a Sequential) prefixes
# its own name ("sequential/dense/bias"); and to a whole path component, so that a proxy norm's
# "proxy_gamma" / "proxy_beta" stay decayed: that pulls the proxy back to N(0, 1) (Labatie et al.
# 2021; docs/proxy_norm.md).
NORM_SCALE_SHIFT_PATTERNS: tuple[str, ...] = (r"(^|/)gamma$", r"(^|/)beta$")
BIAS_PATTERNS: tuple[str, ...] = (r"(^|/)bias$",)

# The paper recipe (RMSProp, L2 1e-5) decays everything but norm / proxy-norm scale and shift.
DEFAULT_WEIGHT_DECAY_EXCLUDE: tuple[str, ...] = NORM_SCALE_SHIFT_PATTERNS
# The large-batch LARS recipe also leaves biases out of both the trust ratio and the decay.
DEFAULT_LARS_EXCLUDE: tuple[str, ...] = NORM_SCALE_SHIFT_PATTERNS + BIAS_PATTERNS

# A raw TensorFlow variable's name carries an output index ("dense/bias:0"); a Keras path does not.
_OUTPUT_INDEX = re.compile(r":\d+$")


def validate_patterns(patterns: Iterable[str], arg_name: str) -> list[str]:
    """Returns `patterns` as a list of strings after checking that each one compiles.

    Args:
        patterns: Regular expressions (a single string is rejected, since iterating it would
            silently turn every character into a pattern).
        arg_name: The constructor argument being validated, used in the error message.

    Returns:
        The patterns as a new list.
    """
    if isinstance(patterns, (str, bytes)):
        raise TypeError(
            f"`{arg_name}` must be a list of regex strings, not a single string. "
            f"Received: {arg_name}={patterns!r}"
        )
    patterns = list(patterns)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(
                f"`{arg_name}` must contain only strings. Received element {pattern!r} in "
                f"{arg_name}={patterns!r}"
            )
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(
                f"Invalid regex {pattern!r} in `{arg_name}`: {error}. "
                f"Received: {arg_name}={patterns!r}"
            ) from error
    return patterns


def variable_path(variable) -> str:
    """Returns the string the exclusion regexes are matched against.

    Args:
        variable: A `keras.Variable` (its `path`, e.g. "stem_conv/kernel") or any object with a
            `name` (a raw backend variable; a trailing ":0" output index is dropped).
    """
    path = getattr(variable, "path", None)
    if not path:
        path = _OUTPUT_INDEX.sub("", str(variable.name))
    return path


def is_excluded(variable, patterns: Sequence[str]) -> bool:
    """Whether any of `patterns` matches (`re.search`) the variable's path.

    Args:
        variable: A `keras.Variable` or an object with a `name`.
        patterns: Regular expressions, e.g. `DEFAULT_LARS_EXCLUDE`.
    """
    path = variable_path(variable)
    return any(re.search(pattern, path) is not None for pattern in patterns)


def excluded_mask(variables: Sequence, patterns: Sequence[str]) -> list[bool]:
    """One Python bool per variable, in order, decided once when an optimizer is built.

    Plain bools (not tensors) keep the branch static, so the same `update_step` traces under
    `tf.function` and runs statelessly under JAX, where the variable seen in `update_step` may be
    a backend variable without a Keras path.

    Args:
        variables: The variables the optimizer is built with.
        patterns: Regular expressions matched against each variable's path.
    """
    return [is_excluded(variable, patterns) for variable in variables]


def reject_keras_weight_decay(kwargs: dict, class_name: str) -> None:
    """Raises if Keras' decoupled `weight_decay` was passed to an optimizer that owns its decay.

    Keras would subtract `lr * weight_decay * w` from every variable before `update_step`, on top
    of (and with different exclusions from) the optimizer's own L2 term.

    Args:
        kwargs: The keyword arguments about to be forwarded to `keras.optimizers.Optimizer`.
        class_name: The optimizer's class name, for the error message.
    """
    if "weight_decay" in kwargs:
        raise ValueError(
            f"{class_name} adds L2 weight decay to the gradient itself: pass `weight_decay_l2`, "
            "not Keras' decoupled `weight_decay`. "
            f"Received: weight_decay={kwargs['weight_decay']!r}"
        )


def check_momentum_and_decay(momentum: float, weight_decay_l2: float) -> None:
    """The argument checks every optimizer here shares: momentum in [0, 1), L2 decay >= 0."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"`momentum` must be in [0, 1). Received: momentum={momentum}")
    if weight_decay_l2 < 0.0:
        raise ValueError(
            f"`weight_decay_l2` must be >= 0. Received: weight_decay_l2={weight_decay_l2}"
        )


class L2DecayOptimizer(keras.optimizers.Optimizer):
    """Base of momentum optimizers with L2 weight decay on the gradient (`RMSPropTF`, `SGD`).

    Stores and checks `momentum`, `weight_decay_l2` and `weight_decay_exclude` (regexes on
    variable paths), rejects Keras' decoupled `weight_decay`, builds the per-variable exclusion
    mask, and gives `decayed_gradient` (g + weight_decay_l2 * w where not excluded) to the
    subclass's `update_step`. Subclasses create their own slots in `build` after calling it.
    """

    def __init__(self, learning_rate, momentum: float, weight_decay_l2: float,
                 weight_decay_exclude: Sequence[str], **kwargs):
        reject_keras_weight_decay(kwargs, type(self).__name__)
        super().__init__(learning_rate=learning_rate, **kwargs)
        check_momentum_and_decay(momentum, weight_decay_l2)
        self.momentum = momentum
        self.weight_decay_l2 = weight_decay_l2
        self.weight_decay_exclude = validate_patterns(weight_decay_exclude,
                                                      "weight_decay_exclude")

    def build(self, var_list):
        super().build(var_list)
        self._decay_excluded = excluded_mask(var_list, self.weight_decay_exclude)

    def decayed_gradient(self, gradient, variable, index: int):
        """`gradient` in the variable's dtype, plus L2 unless the variable is excluded."""
        gradient = ops.cast(gradient, variable.dtype)
        if self.weight_decay_l2 > 0.0 and not self._decay_excluded[index]:
            gradient = ops.add(gradient, ops.multiply(self.weight_decay_l2, variable))
        return gradient

    def get_config(self) -> dict:
        config = super().get_config()
        # Keras' decoupled decay is not a constructor argument here (see `weight_decay_l2`).
        config.pop("weight_decay", None)
        config.update({"momentum": self.momentum, "weight_decay_l2": self.weight_decay_l2,
                       "weight_decay_exclude": list(self.weight_decay_exclude)})
        return config
