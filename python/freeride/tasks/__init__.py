"""BoundTask-in side tasks."""

from ._base import Task
from .image import GaussianBlur, Resize
from .item_counter import ItemCounter, ItemCounts
from .pagerank import PageRank
from .raw_kernel import RawKernel
from .saxpy import Saxpy
from .spin import Spin
from .train import TrainModel

__all__ = [
    "GaussianBlur",
    "ItemCounter",
    "ItemCounts",
    "PageRank",
    "RawKernel",
    "Resize",
    "Saxpy",
    "Spin",
    "Task",
    "TrainModel",
]
