"""A preallocated key/value cache written by position, plugged into unmodified transformers models.

transformers' DynamicCache concatenates on every step, so a step costs a copy of the whole context. Here each
layer owns one buffer of `capacity` slots, allocated once per turn; a forward writes its new rows at the end of
the committed prefix and attends over a view of the filled part. Rejected draft rows need no rollback: the
commit moves the accepted rows down to the end of the prefix and the next forward overwrites the rest.

A model split over several GPUs (`model.device_map`) computes each layer's keys and values on that layer's device;
each layer's buffers are allocated where its first keys arrive, so they sit on that layer's device, and a commit
sends the accepted row indices once to each device.

This file is the one place that follows transformers' cache interface across the supported releases
(`evaluation.versions`): `Cache`/`CacheLayerMixin` keep the same abstract methods from 5.17 to 5.24, and the only
difference the engine meets is the keyword a model or decoder layer takes its cache by (`cache_argument`).
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class PositionalLayer(CacheLayerMixin):
    """One layer's preallocated keys and values, `[batch, kv_heads, capacity, head_dim]`."""

    is_croppable = True
    is_sliding = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        self.device = key_states.device
        self.keys = key_states.new_empty((batch, heads, self.capacity, key_states.shape[-1]))
        self.values = value_states.new_empty((batch, heads, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} positions needed, {self.capacity} allocated")
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def reset(self) -> None:
        self.length = 0

    def crop(self, length: int) -> None:
        self.length = length

    def commit(self, prefix_length: int, keep: torch.Tensor) -> None:
        """Keep the first `prefix_length` rows, then the rows `prefix_length + keep` (ascending), in that order."""
        if not self.is_initialized:
            return
        n = keep.numel()
        rows = keep + prefix_length
        # One gather per buffer; index_select copies, so overlapping source and target rows are safe.
        self.keys[:, :, prefix_length : prefix_length + n] = self.keys.index_select(2, rows)
        self.values[:, :, prefix_length : prefix_length + n] = self.values.index_select(2, rows)
        self.length = prefix_length + n


class PositionalKVCache(Cache):
    """The cache handed to the model as `cache=`; `length` is the number of committed positions."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[PositionalLayer(capacity) for _ in range(num_layers)])
        self.capacity = capacity

    @property
    def length(self) -> int:
        return self.layers[0].length

    def crop(self, length: int) -> None:
        """Forget everything after the first `length` positions (the rows are overwritten later)."""
        for layer in self.layers:
            layer.crop(length)

    @torch.inference_mode()
    def commit(self, prefix_length: int, keep: list[int]) -> None:
        """After a tree forward: keep the committed prefix plus the tree nodes `keep` (node 0 = first new row)."""
        # Rows already in place (a chain accepted from its start, or vanilla's single node) are not moved.
        in_place = 0
        while in_place < len(keep) and keep[in_place] == in_place:
            in_place += 1
        if in_place == len(keep):
            self.crop(prefix_length + len(keep))
            return
        rows = [k - in_place for k in keep[in_place:]]
        index: dict[torch.device, torch.Tensor] = {}  # one small copy per device, not per layer
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            device = layer.keys.device
            if device not in index:
                index[device] = torch.as_tensor(rows, dtype=torch.long, device=device)
            layer.commit(prefix_length + in_place, index[device])

    @property
    def devices(self) -> list[torch.device | None]:
        """Each layer's buffer device (None before its first forward)."""
        return [layer.keys.device if layer.is_initialized else None for layer in self.layers]


def cache_for(model, capacity: int) -> PositionalKVCache:
    return PositionalKVCache(model.config.num_hidden_layers, capacity)


@functools.lru_cache(maxsize=None)
def _cache_keyword(module_type: type) -> str:
    parameters = inspect.signature(module_type.forward).parameters  # follows the deprecation wrapper's __wrapped__
    return "cache" if "cache" in parameters else "past_key_values"


def cache_argument(module: torch.nn.Module, cache) -> dict:
    """`{keyword: cache}` for a call of a transformers model or decoder layer.

    Newer releases (5.24) take the cache as `cache=` and still accept `past_key_values=` with a deprecation warning
    (removal announced for 5.40); older ones (5.17) take only `past_key_values=` and silently ignore `cache=`, which
    runs every forward without the cache. The keyword is read from the module's own signature, once per class."""
    return {_cache_keyword(type(module)): cache}
