"""The resource manager: TensorArray handles and the registries that index them (by name; a
gradient array by its forward array's name and its source, TensorArrayGrad's key).

A handle is the identity of one array's storage (the TensorFlow resource handle). Every
TensorArray object made from the same array (each mutator returns a new one) shares one handle.

Lifetime: a registry indexes its arrays but holds them weakly. An array lives as
long as a TensorArray object, a handle or an autograd graph node refers to it, so a training loop
that never calls ``close()`` does not leak (TensorFlow frees its arrays with the step container;
Python reference counting plays that role here). ``close()`` frees the storage at once.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from .errors import TensorArrayClosedError, TensorArrayNameError
from .storage import Allocator

if TYPE_CHECKING:
    from .resource import ArrayResource

__all__ = ["TensorArrayHandle", "TensorArrayRegistry", "default_registry", "unique_name"]

# Spec: names are name + "_" + a process-wide counter, so equal names never collide, even
# across registries.
_name_counter = itertools.count()


def unique_name(name: str) -> str:
    """``name`` + "_" + the next value of the process-wide counter."""
    return f"{name}_{next(_name_counter)}"


class TensorArrayHandle:
    """Identity of one array's storage.

    Attributes:
        name: name of the array (``"TensorArray_7"``, unique among the arrays made by
            TensorArray; a gradient array is named ``"<forward name>@<source>"``, which a
            user's array may also be named: the registry keys gradient arrays apart).
        registry: the :class:`TensorArrayRegistry` that indexes the array.
    """

    __slots__ = ("__weakref__", "_flow", "_res", "name", "registry")

    def __init__(self, res: ArrayResource, registry: TensorArrayRegistry, flow: torch.Tensor):
        self.name: str = res.name
        self.registry: TensorArrayRegistry = registry
        self._res = res
        # The newest flow of this array. Every op uses it as its autograd input, so the
        # ordering edge exists even when a caller keeps using an older TensorArray object.
        # It lives here, not on the resource: autograd nodes hold the resource, and a resource
        # holding a flow (an output of those nodes) would be a reference cycle through C++.
        self._flow = flow

    @property
    def closed(self) -> bool:
        """True once the array (or the forward array of this gradient array) was closed."""
        return self._res.closed

    def __repr__(self) -> str:
        state = "closed" if self._res.closed else f"size={self._res.size}"
        return f"TensorArrayHandle({self.name!r}, {state})"


class TensorArrayRegistry:
    """Indexes TensorArray handles by name (gradient arrays by their forward array's name and
    source, `ArrayResource.registry_key`); one default instance plus any number for
    isolation.

    Args:
        allocator: default slab allocator for arrays created in this registry that pass none
            (see :data:`tritonrnn.tensorarray.Allocator`); None means ``torch.empty``.
    """

    def __init__(self, allocator: Allocator | None = None):
        self.allocator: Allocator | None = allocator
        self._handles: weakref.WeakValueDictionary[str | tuple[str, str], TensorArrayHandle] = (
            weakref.WeakValueDictionary()
        )
        self._lock = threading.Lock()

    def register(self, handle: TensorArrayHandle) -> None:
        """Index ``handle`` under its name, a gradient array under (forward name, source)
        (names are unique, so this never replaces one)."""
        key = handle._res.registry_key
        with self._lock:
            if key in self._handles:
                raise TensorArrayNameError(
                    f"TensorArray {handle.name!r}: a live array with this name is already "
                    "registered; names must be unique"
                )
            self._handles[key] = handle

    def unregister(self, key: str | tuple[str, str]) -> None:
        """Drop ``key`` from the index: an array's name, a gradient array's (forward name,
        source) (no error when it is absent)."""
        with self._lock:
            self._handles.pop(key, None)

    def _find(self, name: object) -> TensorArrayHandle | None:
        """The live array named ``name``: a user's array first, else a gradient array (a
        user may name an array like a gradient array; the gradient array is then reached
        through its forward array's ``grad(source)``)."""
        with self._lock:
            handle = self._handles.get(name) if isinstance(name, str) else None
            if handle is None:
                handle = next((h for k, h in self._handles.items()
                               if isinstance(k, tuple) and h.name == name), None)
        return handle

    def lookup(self, name: str) -> TensorArrayHandle:
        """The live handle registered under ``name`` (a user's array before a gradient array
        of the same name).

        Raises:
            TensorArrayClosedError: no live array has that name (closed, freed or never made).
        """
        handle = self._find(name)
        if handle is None:
            raise TensorArrayClosedError(
                f"TensorArray {name!r}: lookup(name={name!r}) expected a live array in this "
                "registry, found none (closed, garbage-collected or never created)"
            )
        return handle

    def close(self, name: str) -> None:
        """Close the array registered under ``name`` and its gradient arrays."""
        self.lookup(name)._res.close()

    def close_all(self) -> None:
        """Close every live array of this registry."""
        with self._lock:  # (a snapshot: closing unregisters, under the same lock)
            handles = list(self._handles.values())
        for handle in handles:
            handle._res.close()

    def names(self) -> list[str]:
        """Names of the live arrays, gradient arrays included, in creation order (a name
        twice where a user named an array like a gradient array)."""
        with self._lock:  # other threads register arrays meanwhile
            return [h.name for h in list(self._handles.values())]

    def __contains__(self, name: object) -> bool:
        return self._find(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._handles)

    def __repr__(self) -> str:
        return f"TensorArrayRegistry({len(self)} live arrays)"


default_registry = TensorArrayRegistry()
"""The process-wide registry used when a TensorArray is created without ``registry=``."""
