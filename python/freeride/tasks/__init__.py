"""Built-in side tasks."""

from ._base import Task
from .item_counter import ItemCounter, ItemCounts
from .pagerank import PageRank
from .saxpy import Saxpy
from .spin import Spin

__all__ = ["ItemCounter", "ItemCounts", "PageRank", "Saxpy", "Spin", "Task"]
