from torchvision import placeholders
from torchvision.transforms import InterpolationMode  # noqa: F401  (imported from here too)

__getattr__ = placeholders(__name__)
