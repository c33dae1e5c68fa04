"""A Keras BatchNormalization whose training step updates moving_variance as PyTorch does.

Keras 3 folds the biased batch variance (divided by n) into moving_variance; PyTorch
folds the unbiased one (divided by n - 1). Both normalise the training output with the
biased variance, so only the update differs. Emitted when a spec says "unbiased" and
`match_variance_estimator=True`.

Import this module before `keras.models.load_model()` on a file that holds the layer:
it is registered as "normbridge>UnbiasedBatchNormalization".
"""

from __future__ import annotations

from .runtime import import_keras

keras = import_keras()
ops = keras.ops


@keras.saving.register_keras_serializable(package="normbridge")
class UnbiasedBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization that updates moving_variance with variance * n / (n - 1).

    n is the number of elements per channel in the batch (batch size times spatial
    size), as in torch.nn.functional.batch_norm. With n = 1 the factor is taken as 1
    (PyTorch refuses such a batch). Inference, renorm, masked calls and frozen
    (trainable=False) layers run BatchNormalization's own code. With
    synchronized=True, n counts the local replica's elements only.
    """

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable) or self.renorm or mask is not None:
            return super().call(inputs, training=training, mask=mask)
        # The training branch of BatchNormalization.call
        # (keras/src/layers/normalization/batch_normalization.py) with one change:
        # the variance folded into moving_variance is the unbiased one.
        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        inputs = ops.cast(inputs, compute_dtype)
        mean, variance = self._moments(inputs, None)
        count = self._count_per_channel(inputs)
        unbiased = variance * (count / ops.maximum(count - 1.0, 1.0))

        moving_mean = ops.cast(self.moving_mean, inputs.dtype)
        moving_variance = ops.cast(self.moving_variance, inputs.dtype)
        self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(moving_variance * self.momentum + unbiased * (1.0 - self.momentum))

        gamma = ops.cast(self.gamma, inputs.dtype) if self.scale else None
        beta = ops.cast(self.beta, inputs.dtype) if self.center else None
        outputs = ops.batch_normalization(
            x=inputs, mean=mean, variance=variance, axis=self.axis, offset=beta, scale=gamma, epsilon=self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)

    def _count_per_channel(self, inputs):
        """Elements per channel in this batch, as a scalar of the inputs' dtype (dynamic sizes allowed)."""
        shape = ops.shape(inputs)
        count = 1
        for axis in self._reduction_axes:
            count = count * shape[axis]
        return ops.cast(count, inputs.dtype)
