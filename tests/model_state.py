"""The session's tiny model is shared by many tests; this module keeps it honest.

``ModelGuard`` copies every component's weights when the model is loaded. After each test that used the model it
detaches whatever a backend left attached (``AdapterBinder.reset``, the product's own reset: a module-scoped server
legitimately keeps an adapter between requests), then compares every weight bit for bit with the copy. Anything
else (a weight changed in place, a LoRA wrapper left in, a component swapped) fails that test loudly, and the
weights are restored so that the tests after it are not judged on its leftovers.

Also the one ``assert_at_base`` and ``at_base`` fixture for modules that hold a backend in a ``server`` fixture.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from lora_fixtures import state_hash

from h3app.backend import adapter_binding
from h3app.lora.layers import LoRALinear


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``tensor`` (so NaNs and -0.0 compare exactly)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


class ModelGuard:
    """A bitwise copy of a ``LoadedModel``'s weights, and every ``AdapterBinder`` built on it since."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.base = {name: self._weights(component) for name, component in model.components.items()
                     if isinstance(component, torch.nn.Module)}
        self.modules = {name: component for name, component in model.components.items()}
        self._binders: weakref.WeakSet = weakref.WeakSet()
        self._patch = pytest.MonkeyPatch()
        original_init = adapter_binding.AdapterBinder.__init__
        binders = self._binders

        def init(binder: Any, *args: Any, **kwargs: Any) -> None:
            original_init(binder, *args, **kwargs)
            binders.add(binder)

        self._patch.setattr(adapter_binding.AdapterBinder, "__init__", init)

    def close(self) -> None:
        self._patch.undo()

    @staticmethod
    def _weights(component: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {key: _bits(value).clone() for key, value in component.state_dict().items()}

    def reset_backends(self) -> None:
        """Detach every adapter that a backend on this model left attached."""
        for binder in list(self._binders):
            if binder.model is self.model:
                binder.reset()

    def changes(self) -> list[str]:
        """What differs from the model as loaded (empty: bitwise at base)."""
        found: list[str] = []
        for name, component in self.modules.items():
            if self.model.components.get(name) is not component:
                found.append(f"component {name!r} was replaced or removed")
                continue
            if not isinstance(component, torch.nn.Module):
                continue
            wrapped = [path for path, module in component.named_modules() if isinstance(module, LoRALinear)]
            if wrapped:
                found.append(f"{name}: a LoRA wrapper is left on {len(wrapped)} layers (first: {wrapped[0]})")
            state = component.state_dict()
            base = self.base[name]
            if set(state) != set(base):
                found.append(f"{name}: the weight names changed ({len(set(state) ^ set(base))} differ)")
                continue
            differing = [key for key, value in state.items() if not torch.equal(_bits(value), base[key])]
            if differing:
                found.append(f"{name}: {len(differing)} weights differ from the base (first: {differing[0]})")
        return found

    def restore(self) -> None:
        """Put the base weights back where the names still match (a wrapper left in cannot be undone here)."""
        for name, component in self.modules.items():
            if not isinstance(component, torch.nn.Module):
                continue
            self.model.components[name] = component
            with torch.no_grad():
                for key, value in component.state_dict().items():
                    if key in self.base[name] and value.is_contiguous():
                        value.view(-1).view(torch.uint8).copy_(self.base[name][key])

    def check_after(self, test: str) -> None:
        """After ``test``: reset the backends, then fail loudly unless the model is bitwise as loaded."""
        self.reset_backends()
        found = self.changes()
        if found:
            self.restore()
            pytest.fail(f"{test} left the session's tiny model changed after the backends' reset: "
                        + "; ".join(found), pytrace=False)


def assert_at_base(server: Mapping[str, Any]) -> None:
    """``server["transformer"]`` carries no LoRA wrapper and hashes to ``server["base"]`` (``state_hash``)."""
    assert not any(isinstance(m, LoRALinear) for m in server["transformer"].modules()), "a LoRA wrapper was left in"
    assert state_hash(server["transformer"]) == server["base"], "the weights were left changed"


@pytest.fixture
def at_base(server: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The module's ``server`` (a dict with its ``backend``, ``transformer`` and base ``state_hash``), reset to the
    base weights first: the previous test's good load may have left an adapter attached."""
    server["backend"].binder.reset()
    assert_at_base(server)
    yield server


def open_server(tiny_model: Any, output_dir: Any) -> dict[str, Any]:
    """A backend on the session's tiny model for a whole test module (as a server would be), with the transformer and
    its base weights' hash; fails if another test left an adapter attached. Close it with :func:`close_server`."""
    from h3app.backend.service import Backend

    transformer = tiny_model.transformer()
    assert not any(isinstance(m, LoRALinear) for m in transformer.modules()), "another test left an adapter attached"
    backend = Backend(loaded=tiny_model, output_dir=output_dir)
    return {"backend": backend, "transformer": transformer, "base": state_hash(transformer)}


def close_server(server: Mapping[str, Any]) -> None:
    server["backend"].binder.reset()
    server["backend"].close()
