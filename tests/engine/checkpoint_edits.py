"""without_tensor: a saved checkpoint less one of its tensors (the strict-loading tests)."""

from safetensors.torch import load_file, save_file


def without_tensor(folder, suffix):
    """Drop the first tensor of folder/model.safetensors whose name ends in `suffix`; -> its name."""
    tensors = load_file(folder / "model.safetensors")
    name = next(name for name in tensors if name.endswith(suffix))
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return name
