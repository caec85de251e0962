"""Model construction: timm with random init, checkpointing and memory format applied."""

from __future__ import annotations

import timm
import torch
from torch.utils.checkpoint import checkpoint

NUM_CLASSES = 1000


def build_model(name: str, image_size: int, *, checkpointing: str = "off",
                channels_last: bool = False, attention: str = "sdpa",
                device: torch.device | str = "cpu") -> torch.nn.Module:
    """A timm model in train mode, random weights, on `device`.

    `attention="eager"` turns off timm's fused attention (`fused_attn`) in every block: an
    explicit softmax between two matmuls, as timm ran before PyTorch had fused attention.

    Example:
        >>> model = build_model("test_vit", 32, checkpointing="full")
        >>> model.training
        True
    """
    with torch.device(device):
        model = _create(name, image_size)
    if attention == "eager":
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
    model.set_grad_checkpointing(checkpointing == "full")
    if checkpointing.startswith("last-"):
        checkpoint_last_blocks(model, int(checkpointing.removeprefix("last-")))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model.train()


def has_batch_norm(name: str, image_size: int) -> bool:
    """Whether the model normalises over the batch (BatchNorm), which cannot train on one sample
    once a layer's output is 1x1: its per-channel statistics then have a single value.

    >>> has_batch_norm("test_resnet", 32), has_batch_norm("test_vit", 32)
    (True, False)
    """
    with torch.device("meta"):  # the layer types only: no weights allocated
        model = _create(name, image_size)
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
    containers = ([model.blocks] if hasattr(model, "blocks")
                  else [getattr(model, f"layer{i}") for i in range(1, 5) if hasattr(model, f"layer{i}")])
    slots = [(container, name) for container in containers for name, _ in container.named_children()]
    if not 1 <= count <= len(slots):
        raise ValueError(f"checkpointing last-{count}: the model has {len(slots)} blocks "
                         "(ViT `blocks` or ResNet `layer1..4`)")
    for container, name in slots[-count:]:
        setattr(container, name, _Checkpointed(getattr(container, name)))


def _create(name: str, image_size: int) -> torch.nn.Module:
    # Transformers fix their position embeddings to one image size; CNNs take any size
    # and reject the keyword.
    try:
        return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, img_size=image_size)
    except TypeError as exc:
        if "img_size" not in str(exc):
            raise
        return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES)


def synthetic_batch(micro_batch: int, image_size: int, *, channels_last: bool,
                    device: torch.device | str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and labels, created directly on `device`."""
    generator = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(micro_batch, 3, image_size, image_size, generator=generator, device=device)
    labels = torch.randint(0, NUM_CLASSES, (micro_batch,), generator=generator, device=device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels
