"""A stand-in for `torchvision`, seen only by the SGLang tests on a CPU (tests/conftest.py: `sglang_env`).

SGLang 0.5.21 and transformers import torchvision at import time for their image (multimodal)
code, but PyPI's torchvision wheels for Linux are CUDA builds that fail next to CPU torch
(`operator torchvision::nms does not exist`). Text generation never calls torchvision: every
name here is a placeholder that raises if anything does call it. The modules are those imported
on the way to `sglang.Engine` (transformers' image_utils and image_processing_utils in SGLang's
scheduler process; SGLang's configs and multimodal utils), no more. A real import error elsewhere
stays visible: nothing but the SGLang tests puts this folder on the path.
"""

__version__ = "0.0.0+rlkit.stub"


class Unavailable:
    """What any torchvision name resolves to here: using it fails loudly."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name}: torchvision is a stand-in in rlkit's SGLang CPU tests (tests/stubs)")

    def __getattr__(self, attr: str) -> "Unavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self.name}.{attr}")


def placeholders(module: str):
    """A module `__getattr__` that answers every missing public name with a placeholder."""
    def __getattr__(name: str) -> Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable(f"{module}.{name}")
    return __getattr__


__getattr__ = placeholders(__name__)
