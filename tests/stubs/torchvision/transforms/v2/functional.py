from torchvision import placeholders

__getattr__ = placeholders(__name__)
