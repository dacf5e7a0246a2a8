import enum

from torchvision import placeholders


class InterpolationMode(enum.Enum):  # its members are dictionary keys in transformers' image_utils
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__getattr__ = placeholders(__name__)
