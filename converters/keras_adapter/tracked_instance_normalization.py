"""A Keras layer computing PyTorch's InstanceNorm{1,2,3}d(track_running_stats=True), in eval and in a training step.

Keras has no instance normalization with running statistics. Eval is a BatchNormalization's (each channel normalised
with the moving statistics), so this is one; its training step is PyTorch's instead of Keras's pooled one: each
(sample, channel) is normalised over its own spatial axes, and the moving statistics move by the batch mean of the
per-instance means and variances (torch.nn.functional.instance_norm folds the batch into channels, updates each
copy of the running statistics, and averages the copies), the variance by the estimator the source used (PyTorch:
unbiased, n = the spatial size). An input without a batch axis (rank spatial_rank + 1, PyTorch's no_batch_dim) is one
instance.

Import this module before `keras.models.load_model()` on a file that holds the layer:
it is registered as "normbridge>TrackedInstanceNormalization".
"""

from __future__ import annotations

from .runtime import import_keras

keras = import_keras()
ops = keras.ops

ESTIMATORS = ("biased", "unbiased")


@keras.saving.register_keras_serializable(package="normbridge")
class TrackedInstanceNormalization(keras.layers.BatchNormalization):
    """BatchNormalization at inference; PyTorch's tracked InstanceNorm in a training step.

    `spatial_rank` (1, 2, 3) tells a batched input (rank spatial_rank + 2) from one without a batch axis;
    `variance_estimator` is the batch variance folded into moving_variance ("unbiased": PyTorch's).
    Frozen (trainable=False) layers run BatchNormalization's inference code, as Keras's own.
    """

    def __init__(self, spatial_rank: int = 2, variance_estimator: str = "unbiased", **kwargs):
        for setting, refused in (("renorm", kwargs.get("renorm")), ("synchronized", kwargs.get("synchronized"))):
            if refused:
                raise ValueError(
                    f"TrackedInstanceNormalization: {setting}=True has no instance-norm meaning; "
                    f"build it with {setting}=False."
                )
        if spatial_rank not in (1, 2, 3):
            raise ValueError(f"TrackedInstanceNormalization: spatial_rank must be 1, 2 or 3 (got {spatial_rank!r}).")
        if variance_estimator not in ESTIMATORS:
            raise ValueError(
                f"TrackedInstanceNormalization: variance_estimator must be one of {ESTIMATORS} "
                f"(got {variance_estimator!r})."
            )
        super().__init__(**kwargs)
        self.spatial_rank = int(spatial_rank)
        self.variance_estimator = variance_estimator

    def build(self, input_shape):
        rank = len(input_shape)
        if rank not in (self.spatial_rank + 1, self.spatial_rank + 2):
            raise ValueError(
                f"TrackedInstanceNormalization '{self.name}' with spatial_rank={self.spatial_rank} takes rank-"
                f"{self.spatial_rank + 2} inputs (or rank {self.spatial_rank + 1} without a batch axis), got "
                f"input shape {tuple(input_shape)}."
            )
        super().build(input_shape)

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable):
            return super().call(inputs, training=training, mask=mask)
        if mask is not None:
            raise ValueError(
                f"TrackedInstanceNormalization '{self.name}': a masked training step has no PyTorch "
                "meaning; call it without a mask."
            )
        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        inputs = ops.cast(inputs, compute_dtype)
        rank = len(inputs.shape)
        channel = self.axis % rank
        first = 1 if rank == self.spatial_rank + 2 else 0  # no batch axis: the whole input is one instance
        spatial = [a for a in range(first, rank) if a != channel]
        mean = ops.mean(inputs, axis=spatial, keepdims=True)
        centered = inputs - mean
        variance = ops.mean(ops.square(centered), axis=spatial, keepdims=True)
        outputs = centered * ops.rsqrt(variance + self.epsilon)
        broadcast = [1] * rank
        broadcast[channel] = -1
        if self.scale:
            outputs = outputs * ops.reshape(ops.cast(self.gamma, compute_dtype), broadcast)
        if self.center:
            outputs = outputs + ops.reshape(ops.cast(self.beta, compute_dtype), broadcast)
        self._update_moving(mean, variance, self._count(inputs, spatial), channel, rank)
        return ops.cast(outputs, self.compute_dtype)

    def _count(self, inputs, spatial):
        """Elements per instance and channel (the spatial size), as a scalar of the inputs' dtype."""
        shape = ops.shape(inputs)
        count = 1
        for axis in spatial:
            count = count * shape[axis]
        return ops.cast(count, inputs.dtype)

    def _update_moving(self, mean, variance, count, channel, rank):
        """moving = momentum * moving + (1 - momentum) * (batch mean of the per-instance statistics)."""
        if self.variance_estimator == "unbiased":  # one element: the factor is taken as 1 (PyTorch refuses that input)
            variance = variance * (count / ops.maximum(count - 1.0, 1.0))
        others = [a for a in range(rank) if a != channel]
        batch_mean, batch_variance = ops.mean(mean, axis=others), ops.mean(variance, axis=others)
        for variable, value in ((self.moving_mean, batch_mean), (self.moving_variance, batch_variance)):
            moving = ops.cast(variable, value.dtype)
            variable.assign(ops.cast(moving * self.momentum + value * (1.0 - self.momentum), variable.dtype))

    def get_config(self):
        own = {"spatial_rank": self.spatial_rank, "variance_estimator": self.variance_estimator}
        return {**super().get_config(), **own}
