"""Model construction: random init (timm, hf-hub or a factory: `bench.grid.model_ref`), checkpointing and memory
format applied."""

from __future__ import annotations

import timm  # noqa: F401 - imported here so the fork server's cells start with it (bench.isolation)
import torch
from torch.utils.checkpoint import checkpoint

from bench.errors import ModelRefError
from bench.grid.model_ref import DEFAULT_NUM_CLASSES, ModelSpec
from bench.train.model_build import create

NUM_CLASSES = DEFAULT_NUM_CLASSES


def build_model(name: str | ModelSpec, image_size: int | None = None, *, checkpointing: str = "off",
                channels_last: bool = False, attention: str = "sdpa",
                device: torch.device | str = "cpu") -> torch.nn.Module:
    """A model in train mode, random weights, on `device`: `name` a timm name (square RGB input of `image_size`
    pixels, 1000 classes) or a `ModelSpec`.

    `attention="eager"` turns off timm's fused attention (`fused_attn`) in every block: an
    explicit softmax between two matmuls, as timm ran before PyTorch had fused attention.

    Example:
        >>> model = build_model("test_vit", 32, checkpointing="full")
        >>> model.training
        True
    """
    spec = _spec(name, image_size)
    with torch.device(device):
        model = create(spec)
    if attention == "eager":
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
    if hasattr(model, "set_grad_checkpointing"):
        model.set_grad_checkpointing(checkpointing == "full")
    elif checkpointing == "full":
        raise ModelRefError(f"checkpointing full: model {spec.name} has no set_grad_checkpointing (timm's); use "
                       "last-<N> for its `blocks` or `layer1..4`, or off")
    if checkpointing.startswith("last-"):
        checkpoint_last_blocks(model, int(checkpointing.removeprefix("last-")))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model.train()


def has_batch_norm_layer(model: torch.nn.Module) -> bool:
    """Whether the model normalises over the batch (BatchNorm; `bench.grid.bounds.ModelBounds.batch_norm`).

    >>> with torch.device("meta"):
    ...     [has_batch_norm_layer(create(_spec(name, 32))) for name in ("test_resnet", "test_vit")]
    [True, False]
    """
    return any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm) for module in model.modules())


class _Checkpointed(torch.nn.Module):
    """One block whose activations are recomputed in backward instead of kept."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


def checkpoint_last_blocks(model: torch.nn.Module, count: int) -> None:
    """Checkpoint the `count` blocks nearest the output (seed 000's "selective checkpointing").

    Blocks are ViT's `blocks` or, for a ResNet, the blocks of `layer1`..`layer4`, in order.

    >>> model = build_model("test_vit", 32, checkpointing="last-1")
    >>> type(model.blocks[-1]).__name__, type(model.blocks[0]).__name__
    ('_Checkpointed', 'Block')
    """
    slots = checkpoint_slots(model)
    if not 1 <= count <= len(slots):
        raise ValueError(f"checkpointing last-{count}: the model has {len(slots)} blocks "
                         "(ViT `blocks` or ResNet `layer1..4`)")
    for container, name in slots[-count:]:
        setattr(container, name, _Checkpointed(getattr(container, name)))


def checkpoint_slots(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """The blocks `last-<N>` counts, as (container, child name), input side first: ViT's `blocks`, else the
    blocks of a ResNet's `layer1`..`layer4`; none for other models. The grid's bound on N (`bench.grid.bounds`)
    reads the same list."""
    containers = ([model.blocks] if hasattr(model, "blocks")
                  else [getattr(model, f"layer{i}") for i in range(1, 5) if hasattr(model, f"layer{i}")])
    return [(container, name) for container in containers for name, _ in container.named_children()]


def _spec(name: str | ModelSpec, image_size: int | None) -> ModelSpec:
    if isinstance(name, ModelSpec):
        return name
    if image_size is None:
        raise TypeError("build_model: a model name needs its image_size")
    return ModelSpec(name, image_size)


def synthetic_batch(micro_batch: int, image_size: int, *, channels_last: bool,
                    device: torch.device | str, seed: int = 0, input_shape: tuple[int, int, int] | None = None,
                    num_classes: int = NUM_CLASSES) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and labels, created directly on `device`: square RGB of `image_size` pixels unless
    `input_shape` (channels, height, width) says otherwise."""
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = input_shape or (3, image_size, image_size)
    images = torch.randn(micro_batch, *shape, generator=generator, device=device)
    labels = torch.randint(0, num_classes, (micro_batch,), generator=generator, device=device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels
