"""Where a torch kind adapter's from_spec writes the spec's tensors, so a module can be given another spec's state
(`restate`).

Why: check_many (converters/gate/grouped_check.py) checks many layers of one configuration; building a module per layer
(its parameters initialised, then overwritten) costs more than the check's own work. An adapter whose from_spec builds
from the configuration alone and writes every spec tensor through common.write_tensor declares `restatable = True`; a
module it built can then be made what from_spec builds for another spec of the same configuration: that spec's name and
tensors, everything else as from_spec left it.
"""

from __future__ import annotations

import torch

from schemas import NormSpec

from .. import markers
from .common import STATE_SLOTS, copy_into


class TorchRestating:
    """`template_state` and `restate` for torch kind adapters whose from_spec writes the spec's tensors with
    `write_tensor` only."""

    def template_state(self, module: torch.nn.Module) -> tuple[dict[str, torch.Tensor], bool]:
        """Every parameter and buffer as from_spec left them, and the mode: what `restate` gives back to all no tensor
        is written to."""
        return {
            name: tensor.detach().clone() for name, tensor in module.state_dict(keep_vars=True).items()
        }, module.training

    def restate(self, module: torch.nn.Module, spec: NormSpec, template: tuple[dict[str, torch.Tensor], bool]) -> None:
        """Make `module`, which this adapter's from_spec built for a spec of the same configuration,
        what it builds for `spec`.

        from_spec(spec) would build the same class with the same arguments, write `spec`'s tensors with write_tensor and
        remember its name (common.finish); every other tensor and the mode are as the configuration left them, which
        `template` holds (a training step since may have moved them).
        """
        tensors, training = template
        slots = getattr(module, STATE_SLOTS, {})
        written = set(slots.values())
        with torch.no_grad():
            for name, tensor in module.state_dict(keep_vars=True).items():
                if name not in written:
                    tensor.copy_(tensors[name])
            for tensor_name, attribute in slots.items():
                copy_into(getattr(module, attribute), spec.tensors[tensor_name])  # common.assign, in this block
        module.train(training)
        markers.remember(module, name=spec.name)
